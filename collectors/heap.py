"""Resident heap for the profiled steps: fresh pages touched at the memory peak distort them.

While the profiler records, its event storage grows with every op (100–220 MB per step for
13–26k ops on this project's CPU runs), so every profiled step lifts the process's memory peak
into pages it has never touched. Touching a fresh page costs a page fault; on a virtual
machine whose host reclaims the guest's free memory (free page reporting, ballooning) each
such fault also costs the host a fault, 12 µs per 4 KiB page measured on this project's VM
against 2.4 µs for memory the guest still holds. The cost lands where the step's memory peaks:
in a GPipe step the last forward and the first backward ran 2–3× slower on both stages, the
profiled steps 0.3–1 s slower than the unprofiled ones, and the unequal stages lifted the
measured bubble 20–30% above the schedule's closed form (docs/metrics.md).

``reserve`` moves that cost out of the profiled window: called in the step before it, it grows
the C heap by the given amount, writes every page once and frees it again, and it tells glibc
to keep freed memory instead of returning it to the kernel (``M_TRIM_THRESHOLD``) and to serve
allocations up to 32 MiB from the heap (``M_MMAP_THRESHOLD``; glibc's own threshold moves
there anyway as large blocks are freed, but setting the trim threshold stops that adjustment).
The profiled steps then grow into pages the process already holds.

glibc only (``mallopt``, ``mallinfo2``); elsewhere ``reserve`` does nothing and returns 0.
"""
from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 32 << 20   # glibc's upper limit for M_MMAP_THRESHOLD on 64-bit
_CHUNK_BYTES = 8 << 20             # below the threshold, so every chunk comes from the heap


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _glibc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "mallinfo2")):
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def reserve(nbytes: int) -> int:
    """Grow the calling thread's heap by about ``nbytes`` of touched, free memory and keep it.

    Returns the bytes the heap grew by (0 where the C library is not glibc). Process-wide from
    then on: freed heap memory is no longer returned to the kernel.
    """
    libc = _glibc()
    if libc is None or nbytes <= 0:
        return 0
    # mallopt returns 0 when it refuses a value (a 32-bit glibc caps the threshold lower); then
    # the chunks below would be mapped one by one and the heap would not grow.
    if not (libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
            and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)):
        return 0
    info = libc.mallinfo2()
    start, budget = info.arena, info.fordblks + nbytes + _CHUNK_BYTES
    chunks = []
    # Chunks first fill the heap's free space (already resident), then extend its top; stop
    # once the top has grown by nbytes (or, whatever the accounting says, once that free space
    # and nbytes have been handed out).
    while libc.mallinfo2().arena < start + nbytes and len(chunks) * _CHUNK_BYTES < budget:
        p = libc.malloc(_CHUNK_BYTES)
        if not p:
            break
        ctypes.memset(p, 0, _CHUNK_BYTES)
        chunks.append(p)
    grown = libc.mallinfo2().arena - start
    for p in reversed(chunks):
        libc.free(p)
    return grown
