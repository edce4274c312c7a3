"""Algorithm and bus bandwidth of collectives, as nccl-tests defines them.

For one collective instance moving S bytes in t seconds on a group of n ranks:

- ``algbw_gbps = S / t / 1e9`` (GB/s with GB = 1e9 bytes, like nccl-tests);
- ``busbw_gbps = algbw_gbps × f(op, n)``, f being nccl-tests' bus factor of the op — the table
  of factors and the size S each op counts are in ``meshscope/theory/bus_factors.py``, the one
  definition this module reads.

n is the size of the collective's **process group**, never the world size: an all_reduce over
a dp group of 2 in a world of 8 has f = 1.

Times here are in µs, as in event tables (``dur_us``): ``algbw_gbps = S / dur_us / 1e3``.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from meshscope.theory import bus_factors
from meshscope.theory.bus_factors import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL,  # noqa: F401
                                          BROADCAST, GATHER, OPS, RECV, REDUCE,
                                          REDUCE_SCATTER, SCATTER, SEND, SEND_RECV,
                                          algbw_gbps)

# Squashed spellings (lower case, letters only) -> op, longest match first. Covers torch's
# collective names (allreduce, _allgather_base, reduce_scatter_tensor_coalesced,
# alltoall_base...), gloo:/nccl: ranges, NCCL kernel names (ncclDevKernel_AllGather_RING_LL)
# and nccl-tests binaries (all_reduce_perf, sendrecv_perf).
_PATTERNS = (("reducescatter", REDUCE_SCATTER), ("allreduce", ALL_REDUCE),
             ("allgather", ALL_GATHER), ("alltoall", ALL_TO_ALL), ("sendrecv", SEND_RECV),
             ("broadcast", BROADCAST), ("gather", GATHER), ("scatter", SCATTER),
             ("reduce", REDUCE), ("send", SEND), ("recv", RECV))
_NON_LETTERS = re.compile(r"[^a-z]")


def canonical_op(name) -> str | None:
    """The op of a collective's name in any of its spellings; None when not a known
    collective (``barrier``, ``wait``, ``ncclDevKernel_Generic``...)."""
    if not isinstance(name, str):
        return None
    squashed = _NON_LETTERS.sub("", name.lower())
    for pattern, op in _PATTERNS:
        if pattern in squashed:
            return op
    return None


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor f(op, n) from algbw to busbw for ``op`` in any spelling
    (``meshscope.theory.bus_factors``, which holds the table)."""
    canon = canonical_op(op)
    if canon is None:
        raise ValueError(f"unknown collective {op!r}")
    return bus_factors.bus_factor(canon, n)


def busbw_gbps(op: str, size_bytes: float, time_us: float, n: int) -> float:
    return algbw_gbps(size_bytes, time_us) * bus_factor(op, n)


def add_bandwidth(df: pd.DataFrame, *, op: str = "op", size: str = "msg_bytes",
                  time: str = "dur_us", group: str = "group_size") -> pd.DataFrame:
    """``df`` with ``bus_factor``, ``algbw_gbps`` and ``busbw_gbps`` added, one per row.

    ``op``: column of collective names (any spelling ``canonical_op`` knows); ``size``: bytes
    S; ``time``: µs; ``group``: ranks n in the process group. Rows whose op is unknown, or
    whose size, time or group is missing or not positive, get NaN.
    """
    ops = df[op].map(canonical_op) if len(df) else pd.Series([], dtype=object)
    n = pd.to_numeric(df[group], errors="coerce").astype("float64").to_numpy()
    s = pd.to_numeric(df[size], errors="coerce").astype("float64").to_numpy()
    t = pd.to_numeric(df[time], errors="coerce").astype("float64").to_numpy()
    # nccl-tests' factor of each (op, group size) pair that occurs, from the one table
    # (``theory.bus_factors.bus_factor``): a collective table holds few distinct pairs.
    pairs = pd.DataFrame({"op": ops.to_numpy(dtype=object), "n": n})
    known = pairs["op"].notna().to_numpy() & np.isfinite(n) & (n >= 1) & (n == np.floor(n))
    factor = {(o, k): bus_factors.bus_factor(o, int(k))
              for o, k in pairs[known].drop_duplicates().itertuples(index=False)}
    f = np.array([factor.get((o, k), np.nan) if ok else np.nan
                  for o, k, ok in zip(pairs["op"], n, known)], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where((t > 0) & (s >= 0), s / t / 1e3, np.nan)
    return df.assign(bus_factor=f, algbw_gbps=alg, busbw_gbps=alg * f)


def size_bucket(size_bytes) -> int:
    """The power of two at or below ``size_bytes`` (0 for 0): messages in [2^k, 2^(k+1)) share
    the bucket 2^k."""
    size_bytes = int(size_bytes)
    if size_bytes < 0:
        raise ValueError(f"negative size {size_bytes}")
    return 0 if size_bytes == 0 else 1 << (size_bytes.bit_length() - 1)


def size_buckets(sizes) -> np.ndarray:
    """``size_bucket`` of each size (int64; -1 where a size is missing or negative)."""
    s = pd.to_numeric(pd.Series(sizes), errors="coerce").astype("float64").to_numpy()
    out = np.full(len(s), -1, dtype=np.int64)
    ok = np.isfinite(s) & (s >= 0)
    _, exp = np.frexp(np.where(ok & (s > 0), s, 1.0))
    out[ok] = np.where(s[ok] > 0, np.ldexp(1.0, exp[ok] - 1), 0).astype(np.int64)
    return out


def bucket_label(bucket: int) -> str:
    """``"64 KiB"``-style name of a bucket's lower bound."""
    if bucket <= 0:
        return "0 B"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if bucket >= 1 << shift:
            return f"{bucket >> shift} {unit}"
    return f"{bucket} B"
