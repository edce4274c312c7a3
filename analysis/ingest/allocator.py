"""Where Arrow's memory comes from while a trace is read, and giving what is free back.

Reading a trace makes and drops many short-lived arrays (a batch's columns, each joined into a
chunk a few batches later). ``system_allocator()`` makes Arrow allocate through the C library's
allocator for the length of a block — a whole read (``events.parse_trace``), or either side of
the reader in parts (``parts.py``) — rather than through its default pool, which held more at
the peak. ``trim()`` gives the memory that allocator then holds free back to the system
(glibc's ``malloc_trim``; nothing where there is none): after each join of batches into chunks
(``accumulator.py``) and of chunks into columns, and after each column is converted to pandas
(``event_table.to_frame``), so that what was freed is not left in pieces among what is kept.
"""
from __future__ import annotations

import contextlib

import pyarrow as pa


@contextlib.contextmanager
def system_allocator():
    """Within the block, Arrow allocates through the C library's allocator
    (``events.parse_trace``: the per-batch arrays of a read); the pool in force before is
    restored on leaving."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def _malloc_trim():
    """The C library's ``malloc_trim`` (glibc), or None where there is none."""
    try:
        import ctypes
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def trim() -> None:
    """Give the memory the C library's allocator holds free back to the system (where it can:
    glibc's ``malloc_trim``). Arrow allocates through that allocator while a trace is read
    (``system_allocator``); the batches' memory freed at each ``accumulator._consolidate`` is
    left in pieces among the kept chunks, which the next, larger allocations cannot reuse."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
