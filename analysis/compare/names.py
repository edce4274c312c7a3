"""Kernel names as ``meshscope compare`` pairs them across two runs.

The same work is spelt differently from one run to the next: NCCL named its all-reduce kernel
``ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)`` until 2.18 and
``ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)`` after, and a
C++ kernel carries its template arguments and parameter list
(``void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, …>(int,
…)``). ``kernel_key(name)`` folds a name to what stays the same:

- a collective library's kernel (NCCL, RCCL: ``ncclKernel_*``, ``ncclDevKernel_*``,
  ``ncclSymDevKernel_*``, NCCL 2.4's ``ncclAllReduceRingLLKernel_*``) → ``nccl:<op>`` with the
  op in the report's spelling (``analysis/comm/bandwidth.canonical_op``: ``nccl:all_reduce``,
  ``nccl:send_recv``); its algorithm, protocol, reduction and element type are folded, and a
  kernel that names no op (``ncclDevKernel_Generic``) is ``nccl:generic``;
- a copy or a fill (``Memcpy HtoD (Pinned -> Device)``, ``Memset (Device)``) keeps its name;
- any other name loses its template arguments (``<…>``, nested), its parameter list
  (``(…)``) and its return type (what comes before the last space): HTA's ``shorten_name``
  does the same for its TraceDiff. A generic launcher whose name says nothing of the kernel
  (``cutlass::Kernel<cutlass_80_tensorop_s1688gemm_…>``) keeps its first template argument,
  folded in turn.

The raw names stay in the diff beside the key (``KernelDiff.names_before`` / ``_after``).
"""
from __future__ import annotations

import functools
import re

from meshscope.analysis.comm.bandwidth import canonical_op

_NCCL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)\w*?Kernel|^(?:void\s+)?nccl[A-Z]\w*Kernel",
                   re.IGNORECASE)
_COPY = re.compile(r"^(Memcpy|Memset|memcpy|memset)\b")
# Launchers whose own name says nothing: the kernel is their first template argument.
_LAUNCHERS = frozenset({"cutlass::Kernel", "cutlass::Kernel2", "cutlass::device_kernel",
                        "cute::device_kernel", "Kernel", "Kernel2", "device_kernel"})


@functools.lru_cache(maxsize=65536)
def kernel_key(name: str) -> str:
    """The name ``meshscope compare`` pairs kernels by (module docstring)."""
    name = name.strip()
    if _COPY.match(name):
        return name
    if _NCCL.search(name):
        lib = "rccl" if re.sub(r"^void\s+", "", name).lower().startswith("rccl") else "nccl"
        op = canonical_op(re.split(r"[(<]", name, maxsplit=1)[0])
        return f"{lib}:{op or 'generic'}"
    base, first = _fold(name)
    if base in _LAUNCHERS and first:
        return f"{base}<{_fold(first)[0]}>"
    return base or name


def _fold(name: str) -> tuple[str, str]:
    """(the name without template arguments, parameter list and return type; its first
    template argument, as written)."""
    text = name.replace("(anonymous namespace)", "anonymous").replace("->", "")
    out: list[str] = []
    depth_angle = depth_paren = 0
    first, arg = "", []
    for c in text:
        if c == "<" and depth_paren == 0:
            depth_angle += 1
            if depth_angle == 1:
                arg = []
                continue
        elif c == ">" and depth_paren == 0 and depth_angle:
            depth_angle -= 1
            if depth_angle == 0:
                if not first:
                    first = "".join(arg).split(",")[0].strip()
                continue
        elif c == "(" and depth_angle == 0:
            depth_paren += 1
            continue
        elif c == ")" and depth_angle == 0 and depth_paren:
            depth_paren -= 1
            continue
        if depth_angle:
            arg.append(c)
        elif depth_paren == 0:
            out.append(c)
    folded = "".join(out).strip()
    return (folded.split()[-1] if folded else ""), first
