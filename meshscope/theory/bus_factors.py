"""Algorithm and bus bandwidth of a collective, as nccl-tests defines them.

For one collective moving S bytes in t on a group of n ranks (nccl-tests,
``doc/PERFORMANCE.md``):

- ``algbw = S / t`` in GB/s with GB = 1e9 bytes;
- ``busbw = algbw × f(op, n)``: the bandwidth each rank's link must sustain for the ring
  algorithm, comparable across ops and group sizes and with the hardware's peak.

  ============================================= =================
  op                                            f(op, n)
  ============================================= =================
  all_reduce                                    2(n−1)/n
  all_gather, reduce_scatter, all_to_all,       (n−1)/n
  gather, scatter
  broadcast, reduce, send, recv, send_recv      1
  ============================================= =================

  An all_reduce is a reduce_scatter then an all_gather, each moving (n−1)/n of the buffer
  through every link: hence 2(n−1)/n.

S is the size nccl-tests prints in its ``size`` column: the whole buffer of one rank for
all_reduce, broadcast and reduce; the whole *gathered* output for all_gather and the whole
*input* for reduce_scatter (n × one rank's share); one rank's whole send buffer for all_to_all.
n is the size of the collective's **process group**, never the world size: an all_reduce over a
dp group of 2 in a world of 8 has f = 1.

Ops here are the canonical names below; ``meshscope.analysis.comm.bandwidth.canonical_op``
turns the spellings found in traces (``allreduce``, ``ncclDevKernel_AllGather_RING_LL``,
``gloo:recv`` …) into them.
"""
from __future__ import annotations

from meshscope.vocabulary import OPS

# The op names are meshscope's vocabulary (meshscope/vocabulary.py), one constant each.
(ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST, REDUCE, SEND, RECV, SEND_RECV,
 GATHER, SCATTER) = OPS
# The ops by factor: 2(n−1)/n for ALL_REDUCE alone, (n−1)/n for these, 1 for the rest.
N_MINUS_1_OVER_N = (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER)
FACTOR_ONE = tuple(o for o in OPS if o != ALL_REDUCE and o not in N_MINUS_1_OVER_N)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor f(op, n) from algbw to busbw (the module docstring's table), for a
    canonical op name; ``ValueError`` for another name or a group of fewer than 1 rank."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}")
    if n < 1:
        raise ValueError(f"group size must be at least 1, got {n}")
    if op == ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if op in N_MINUS_1_OVER_N:
        return (n - 1) / n
    return 1.0


def algbw_gbps(size_bytes: float, time_us: float) -> float:
    """S / t in GB/s (1e9 bytes per second) for a time in µs; NaN for a non-positive time."""
    return size_bytes / time_us / 1e3 if time_us > 0 else float("nan")


def busbw_gbps(op: str, size_bytes: float, time_us: float, n: int) -> float:
    """algbw × f(op, n), GB/s."""
    return algbw_gbps(size_bytes, time_us) * bus_factor(op, n)
