"""The operations of a CPU (gloo) trace: each ``c10d::`` call the program made, paired with the
``gloo:`` range that ran it, as rows of the collective-instance table before the cross-rank
stage (``instances.RAW_COLUMNS``; ``instances.extract`` calls ``gloo_rows``).

A call carries the op the program asked for, its argument shapes and types (``Input Dims``,
``Input type``: the bytes in and out, ``_call_bytes``) and, for send/recv, the group-local
peer among its concrete inputs (``_local_rank``); the range carries the op the backend ran
(``RUNS_AS``: gloo runs a reduce_scatter as an all_reduce), when it ran, and its own sizes.
Groups and sequence numbers are not in a gloo trace: they come from the Flight Recorder
(``instances``' join) or run.json.
"""
from __future__ import annotations

import bisect
import json

import numpy as np
import pandas as pd

from meshscope.analysis.comm.bandwidth import ALL_REDUCE, RECV, REDUCE_SCATTER, SEND, \
    canonical_op
from meshscope.analysis.ingest import classify
from meshscope.analysis.ingest.comm_meta import tensor_bytes

# Backend ops that may run an algorithm op (gloo's reduce_scatter is an all_reduce).
RUNS_AS = {REDUCE_SCATTER: (REDUCE_SCATTER, ALL_REDUCE)}


def compatible(call_op: str, range_op: str) -> bool:
    return range_op in RUNS_AS.get(call_op, (call_op,))


def _json(text):
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call_args(row) -> tuple[list | None, list | None, list | None]:
    """(Input Dims, Input type, Concrete Inputs) of a ``c10d::`` call, decoded."""
    args = _json(getattr(row, "call_args", None)) or {}
    return args.get("dims"), args.get("types"), args.get("scalars")


def _local_rank(scalars) -> int | None:
    """The group-local peer of ``c10d::send`` / ``c10d::recv_``: their third argument
    (``dstRank`` / ``srcRank``), which the profiler records among the concrete inputs."""
    if isinstance(scalars, list) and len(scalars) >= 3:
        v = scalars[2]
        if isinstance(v, str) and v.lstrip("-").isdigit():
            return int(v)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _pair_gloo(comm: pd.DataFrame) -> list[tuple]:
    """(call row or None, range row or None, op) of every gloo operation, in issue order: each
    ``c10d::`` call of a known op takes the earliest unpaired ``gloo:`` range of a compatible op
    that starts after it (the range may run on a worker thread, later, and another group's
    work may come between); a range no call claims is kept on its own."""
    calls = [c for c in comm.itertuples() if c.name.startswith("c10d::")
             and canonical_op(c.name.split("::")[-1]) is not None]
    ranges = [r for r in comm.itertuples() if r.name.startswith("gloo:")
              and canonical_op(r.name) is not None]
    calls.sort(key=lambda c: c.ts_us)
    by_op: dict[str, list] = {}
    for r in sorted(ranges, key=lambda r: r.ts_us):
        by_op.setdefault(canonical_op(r.name), []).append(r)
    starts = {op: [r.ts_us for r in rs] for op, rs in by_op.items()}
    used: set[int] = set()
    out = []
    for c in calls:
        op = canonical_op(c.name.split("::")[-1])
        best = None
        for rop in RUNS_AS.get(op, (op,)):
            rs = by_op.get(rop, [])
            i = bisect.bisect_left(starts.get(rop, []), c.ts_us - 1.0)
            while i < len(rs) and rs[i].Index in used:
                i += 1
            if i < len(rs) and (best is None or rs[i].ts_us < best.ts_us):
                best = rs[i]
        if best is not None:
            used.add(best.Index)
        out.append((c, best, op))
    out += [(None, r, canonical_op(r.name)) for r in ranges if r.Index not in used]
    out.sort(key=lambda x: (x[0] if x[0] is not None else x[1]).ts_us)
    return out


def _argument_bytes(dims, types, index: int) -> int | None:
    """Bytes of the ``index``-th argument of a call (a tensor, or a tensor list whose tensors
    are summed), from its ``Input Dims`` and ``Input type``."""
    if not isinstance(dims, list) or index >= len(dims):
        return None
    d = dims[index]
    t = types[index] if isinstance(types, list) and index < len(types) else None
    if isinstance(d, list) and d and all(isinstance(x, list) for x in d):   # a tensor list
        parts = [tensor_bytes(x, t if t not in ("TensorList", "GenericList") else "float") for x in d]
        return sum(parts) if parts and None not in parts else None
    if isinstance(d, list) and d:
        return tensor_bytes(d, t)
    return None


# Which call arguments hold the output and the input, by op: c10d's schemas put the output
# first for the ``*_base_`` and all_to_all calls, a single in-place buffer for the others.
_CALL_BUFFERS = {"all_to_all": (1, 0), "all_gather": (1, 0), "reduce_scatter": (1, 0),
                 "scatter": (1, 0), "gather": (0, 1), "recv": (None, 0)}


def _call_bytes(op: str, dims, types) -> tuple[int | None, int | None]:
    """(in_bytes, out_bytes) from a ``c10d::`` call's recorded argument shapes."""
    i_in, i_out = _CALL_BUFFERS.get(op, (0, 0))
    return (None if i_in is None else _argument_bytes(dims, types, i_in),
            _argument_bytes(dims, types, i_out))


def gloo_rows(events: pd.DataFrame, rank: int) -> list[dict]:
    """One row (``instances.RAW_COLUMNS``) per operation of a CPU rank, in issue order: each
    ``c10d::`` call with the ``gloo:`` range that ran it (``_pair_gloo``); a call without one
    is a ``host`` row, a range without a call a ``gloo`` row of the range alone."""
    comm = events[(events["kind"] == classify.COMMUNICATION) & ~events["device"]]
    rows = []
    for call, rng, op in _pair_gloo(comm):
        backend = canonical_op(rng.name) if rng is not None else None
        in_b = out_b = None
        dtype = None
        peer_local = None
        if call is not None:
            dims, types, scalars = _call_args(call)
            in_b, out_b = _call_bytes(op, dims, types)
            if op in (SEND, RECV):
                peer_local = _local_rank(scalars)
        if rng is not None:
            rb = rng.msg_bytes if not pd.isna(rng.msg_bytes) else None
            if in_b is None and op not in (RECV,):
                in_b = int(rb) if rb is not None else None
            if out_b is None and op == RECV:
                out_b = int(rb) if rb is not None else None
            dtype = rng.dtype if isinstance(rng.dtype, str) else None
        first = call if call is not None else rng
        rows.append({
            "rank": rank, "op": op, "backend_op": backend if backend and backend != op else None,
            "p2p": op in (SEND, RECV), "peer_local": peer_local,
            "call_ts_us": call.ts_us if call is not None else np.nan,
            "call_end_us": call.end_us if call is not None else np.nan,
            "exec_ts_us": rng.ts_us if rng is not None else np.nan,
            "exec_end_us": rng.end_us if rng is not None else np.nan,
            "arrival_us": first.ts_us,
            "end_us": rng.end_us if rng is not None else call.end_us,
            "in_bytes": in_b, "out_bytes": out_b, "dtype": dtype,
            "source": "gloo" if rng is not None else "host",
            "pg_name": None, "pg_desc": None, "pg_ranks": "", "group_size": None, "seq": None,
            "msg_bytes_hint": None})
    return rows
