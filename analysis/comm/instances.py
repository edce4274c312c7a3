"""The collective-instance table: every collective and point-to-point operation of one rank,
built once from its ingested events and read by every cross-rank analyser (the step
breakdown's per-dimension sets, bandwidth, arrivals and waits, clock alignment, the dependency
graph and the Flight Recorder cross-check).

``finalize(extract(trace, on_gpu), rank=, meta=, timeline=, run=, flight=None,
layout_map=None)`` returns one row per
operation the rank issued inside its profiled steps, in issue order:

============== ======= ===================================================================
column         dtype   meaning
============== ======= ===================================================================
rank           int     the rank
step           int     the profiled step whose window holds the arrival
op             str     the algorithm's op (``analysis.comm.bandwidth.OPS``): what the
                       program asked for (``reduce_scatter``, ``all_to_all``)
backend_op     str     the op the backend ran when it differs (gloo's reduce_scatter runs
                       as an ``all_reduce``; NCCL's all_to_all as ``send_recv`` kernels);
                       null when the same
p2p            bool    a point-to-point send or recv
peer           Int64   for send/recv: the global rank on the other side; null when unknown
pg_name        str     torch's name of the process group; null when unknown
pg_desc        str     its description (``mesh_dp``, ``default_pg``); null when unknown
pg_ranks       str     the group's global ranks, ``"0,1"``; "" when unknown (one string
                       object per group, shared by its rows: ``_shared_text``)
group_size     Int64   ranks in the group; null when unknown
dim            str     parallel dimension: dp, tp, pp, cp, ep, or ``unknown``
dim_source     str     where ``dim`` came from (``vocabulary.DIM_SOURCES``)
seq            Int64   the op's sequence number in its group (``Seq`` of the trace, or the
                       Flight Recorder's ``collective_seq_id``); null where neither has it
k              int     its index among this rank's ops of the same group, step and op (and
                       peer, for send/recv): the match key where ``seq`` is unknown
call_ts_us     float   the host call (``c10d::…`` on CPU, ``record_param_comms`` / ``nccl:…``
call_end_us    float   on GPU): start and end; NaN where the trace has none
exec_ts_us     float   the span that ran it (the ``gloo:…`` range; the NCCL kernel):
exec_end_us    float   start and end; NaN where the trace has none
arrival_us     float   when the rank reached the op: the host call's start on CPU, the
                       kernel's start on GPU (it spins there until every rank arrives)
end_us         float   when the operation finished on this rank (the executing span's end)
msg_bytes      Int64   S as nccl-tests defines it (``analysis/comm/bandwidth.py``); null
                       when the trace does not say (never 0 for unknown)
in_bytes       Int64   bytes this rank put in (its input buffer); null when unknown
out_bytes      Int64   bytes this rank got out (its output buffer); null when unknown
dtype          str     element type; null when unknown
source         str     ``gloo``, ``nccl`` (kernel), ``custom-kernel``, ``host`` (a host call
                       with no executing span in the trace)
============== ======= ===================================================================

Where each field comes from, in order of preference:

- *Group and sequence number*: the trace's ``record_param_comms`` arguments (GPU traces of
  recent torch); else the rank's Flight Recorder entry for the same call (``flight``: its
  ``time_created_ns``, converted with the trace's ``baseTimeNanoseconds``, lies inside the host
  call; gloo traces carry no group otherwise); else run.json through the dimension.
- *Dimension*: a DeviceMesh description ``mesh_<dim>``; run.json's group of that name or rank
  set; ``--layout`` (``layout_map``, for foreign traces); a ``meshscope/comm dim=D`` range
  around the call; the run's layout (send/recv are pp — or cp inside ring attention —,
  all_to_all is ep, any other collective the one remaining dimension of size > 1); ``unknown``.
- *Bytes*: the kernel's or ``record_param_comms``' element counts; the host call's or the
  ``gloo:``/``nccl:`` range's ``Input Dims`` (an all_gather range holds one rank's share, so
  S = n × share); the Flight Recorder's sizes.
- *Peer* (send/recv): the call's destination or source rank (``Concrete Inputs`` of
  ``c10d::send`` / ``c10d::recv_``, group-local) mapped through the group's sorted ranks.
"""
from __future__ import annotations

import bisect
import json
import math
import sys

import numpy as np
import pandas as pd

from meshscope.analysis.comm.bandwidth import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, RECV, \
    REDUCE_SCATTER, SEND, SEND_RECV, canonical_op
from meshscope.analysis.comm.dims import attribute
from meshscope.analysis.ingest import classify
from meshscope.analysis.ingest.comm_meta import dtype_info
from meshscope.analysis.records.fr_table import FlightRecords
from meshscope.analysis.timeline.rank_timeline import scope_at
from meshscope.collectors.run_info import RunInfo, ranks_key

INSTANCE_COLUMNS = ["rank", "step", "op", "backend_op", "p2p", "peer", "pg_name", "pg_desc",
                    "pg_ranks", "group_size", "dim", "dim_source", "seq", "k", "call_ts_us",
                    "call_end_us", "exec_ts_us", "exec_end_us", "arrival_us", "end_us",
                    "msg_bytes", "in_bytes", "out_bytes", "dtype", "source"]
_INT_COLUMNS = ("peer", "group_size", "seq", "msg_bytes", "in_bytes", "out_bytes")
# Backend ops that may run an algorithm op (gloo's reduce_scatter is an all_reduce).
_RUNS_AS = {REDUCE_SCATTER: (REDUCE_SCATTER, ALL_REDUCE)}
# How long before or after its host call a Flight Recorder entry may have been created.
FR_JOIN_SLACK_US = 50.0


def empty() -> pd.DataFrame:
    return _typed(pd.DataFrame(columns=INSTANCE_COLUMNS))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    _shared_text(df)
    for c in _INT_COLUMNS:
        df[c] = pd.array(df[c].tolist(), dtype="Int64") if len(df) else \
            pd.array([], dtype="Int64")
    df["p2p"] = df["p2p"].astype(bool)
    for c in ("rank", "step", "k"):
        df[c] = df[c].astype("int64")
    return df


def _json(text):
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _numel(dims) -> int | None:
    if isinstance(dims, list) and dims and all(isinstance(d, int) and not isinstance(d, bool)
                                              and d >= 0 for d in dims):
        return math.prod(dims)
    if isinstance(dims, list) and not dims:
        return 1
    return None


def _bytes(dims, dtype) -> int | None:
    n = _numel(dims)
    size = dtype_info(dtype)[1]
    return n * size if n is not None and size is not None else None


# -- CPU / gloo ------------------------------------------------------------------------------

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


def _compatible(call_op: str, range_op: str) -> bool:
    return range_op in _RUNS_AS.get(call_op, (call_op,))


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
        for rop in _RUNS_AS.get(op, (op,)):
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


def _fr_entries(flight: FlightRecords | None, rank: int, meta: dict) -> list[dict]:
    """``rank``'s Flight Recorder entries with ``created_us`` on the trace's clock
    (``time_created_ns`` minus the trace's ``baseTimeNanoseconds``), sorted; [] when either is
    missing."""
    base = meta.get("baseTimeNanoseconds") if isinstance(meta, dict) else None
    cols = flight.entries_of(rank) if flight is not None else None
    if not isinstance(base, int) or cols is None:
        return []
    out = []
    for created, pg, seq, p2p, sig in zip(*(cols[k].tolist() for k in (
            "created_ns", "pg", "seq", "p2p", "sig"))):
        if created < 0:
            continue
        s = flight.signatures[sig]
        op = canonical_op(s.profiling_name.split(":", 1)[-1].split(" ")[0])
        if op is None:
            continue
        name, desc = flight.groups[pg]
        out.append({"created_us": (created - base) / 1e3, "op": op, "p2p": p2p,
                    "pg_name": name, "pg_desc": desc, "seq": seq,
                    "input_sizes": s.input_sizes, "output_sizes": s.output_sizes,
                    "input_dtypes": s.input_dtypes, "output_dtypes": s.output_dtypes})
    out.sort(key=lambda e: e["created_us"])
    return out


def _join_fr(rows: list[dict], entries: list[dict]) -> int:
    """Give each row the Flight Recorder entry created inside its host call (same op, one entry
    per row); returns how many were joined."""
    if not entries:
        return 0
    times = [e["created_us"] for e in entries]
    taken = [False] * len(entries)
    joined = 0
    for row in rows:
        a, b = row["call_ts_us"], row["call_end_us"]
        if not (a == a and b == b):
            continue
        i = bisect.bisect_left(times, a - FR_JOIN_SLACK_US)
        while i < len(entries) and times[i] <= b + FR_JOIN_SLACK_US:
            e = entries[i]
            if not taken[i] and e["p2p"] == row["p2p"] and \
                    (e["op"] == row["op"] or _compatible(row["op"], e["op"])):
                taken[i] = True
                row["fr"] = e
                joined += 1
                break
            i += 1
    return joined


def _sizes_bytes(sizes, dtypes) -> int | None:
    """Total bytes of a Flight Recorder size list (``[[2, 64], [3]]``) with its dtypes."""
    if not isinstance(sizes, list):
        return None
    total = 0
    for i, dims in enumerate(sizes):
        dt = dtypes[i] if isinstance(dtypes, list) and i < len(dtypes) else None
        b = _bytes(dims, dt)
        if b is None:
            return None
        total += b
    return total


def _tensor_bytes(dims, types, index: int) -> int | None:
    """Bytes of the ``index``-th argument of a call (a tensor, or a tensor list whose tensors
    are summed), from its ``Input Dims`` and ``Input type``."""
    if not isinstance(dims, list) or index >= len(dims):
        return None
    d = dims[index]
    t = types[index] if isinstance(types, list) and index < len(types) else None
    if isinstance(d, list) and d and all(isinstance(x, list) for x in d):   # a tensor list
        parts = [_bytes(x, t if t not in ("TensorList", "GenericList") else "float") for x in d]
        return sum(parts) if parts and None not in parts else None
    if isinstance(d, list) and d:
        return _bytes(d, t)
    return None


# Which call arguments hold the output and the input, by op: c10d's schemas put the output
# first for the ``*_base_`` and all_to_all calls, a single in-place buffer for the others.
_CALL_BUFFERS = {"all_to_all": (1, 0), "all_gather": (1, 0), "reduce_scatter": (1, 0),
                 "scatter": (1, 0), "gather": (0, 1), "recv": (None, 0)}


def _call_bytes(op: str, dims, types) -> tuple[int | None, int | None]:
    """(in_bytes, out_bytes) from a ``c10d::`` call's recorded argument shapes."""
    i_in, i_out = _CALL_BUFFERS.get(op, (0, 0))
    return (None if i_in is None else _tensor_bytes(dims, types, i_in),
            _tensor_bytes(dims, types, i_out))


def _gloo_rows(events: pd.DataFrame, rank: int) -> list[dict]:
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


# -- GPU / NCCL ------------------------------------------------------------------------------

_META = ("coll_name", "in_nelems", "out_nelems", "dtype", "pg_name", "pg_desc", "pg_ranks",
         "group_size", "seq", "msg_bytes")


def _meta_of(row) -> dict:
    out = {}
    for c in _META:
        v = getattr(row, c)
        out[c] = None if v is None or (not isinstance(v, str) and pd.isna(v)) else v
    if out.get("seq") is not None and out["seq"] < 0:
        out["seq"] = None
    return out


def _merge_meta(parts: list[dict]) -> dict:
    """Field by field, the first known value among ``parts`` (innermost first)."""
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            if out.get(k) in (None, "") and v not in (None, ""):
                out[k] = v
    return out


class _HostIndex:
    """Host events carrying collective metadata, per lane, to find the one enclosing a time."""

    def __init__(self, host: pd.DataFrame):
        self.by_lane: dict[str, tuple[list, list]] = {}
        for lane, g in host.sort_values("ts_us").groupby("lane", sort=False):
            rows = list(g.itertuples())
            self.by_lane[lane] = ([r.ts_us for r in rows], rows)

    def enclosing(self, lane: str, t: float) -> list:
        starts, rows = self.by_lane.get(lane, ([], []))
        i = bisect.bisect_right(starts, t) - 1
        found = []
        for j in range(i, max(i - 12, -1), -1):
            if rows[j].end_us >= t:
                found.append(rows[j])
        return sorted(found, key=lambda r: -r.ts_us)       # innermost (latest start) first


def _gpu_rows(events: pd.DataFrame, rank: int) -> list[dict]:
    dev = events[events["device"]]
    kernels = dev[dev["kind"] == classify.COMMUNICATION].sort_values("ts_us")
    if kernels.empty:
        return []
    # The host rows are selected by masks, never copied whole (every column of every host
    # event: about 126 MB of a 1.7M-event rank): only the rows with collective metadata and
    # the three columns of the kernels' launches are taken.
    host = ~events["device"].to_numpy(dtype=bool)
    meta_host = events[host & events["coll_name"].notna().to_numpy()
                       & (events["cat"] != "gpu_user_annotation").to_numpy()]
    index = _HostIndex(meta_host)
    metas = _metas(meta_host)
    launches = events.loc[host & events["correlation"].isin(kernels["correlation"]).to_numpy()
                          & events["cat"].isin(["cuda_runtime", "cuda_driver"]).to_numpy(),
                          ["correlation", "ts_us", "lane"]]
    launch = dict(zip(launches["correlation"].tolist(),
                      zip(launches["ts_us"].tolist(), launches["lane"].tolist())))
    rows, unlinked = [], []
    names: dict = {}                # kernel name → what _kernel_row reads of it, made once
    for kern in kernels.itertuples():
        own = _meta_of(kern) if isinstance(kern.coll_name, str) else {}
        hosts = []
        if kern.correlation in launch:
            t, lane = launch[kern.correlation]
            hosts = index.enclosing(lane, t)
        meta = _merge_meta([own] + [metas[h.Index] for h in hosts])
        call = hosts[-1] if hosts else None                 # the outermost metadata event
        of_name = names.get(kern.name)
        if of_name is None:
            of_name = names[kern.name] = _of_kernel_name(kern.name)
        row = _kernel_row(rank, kern, meta, call, of_name)
        rows.append(row)
        if not hosts and not own:
            unlinked.append(row)
    if unlinked:
        _link_by_order(unlinked, meta_host)
    return rows


def _of_kernel_name(name: str) -> tuple:
    """(op, source, likely dimension) of a communication kernel's name (``_kernel_row``)."""
    return (canonical_op(name) or classify.comm_kernel_op(name),
            "nccl" if classify.COMM_KERNEL_RE.search(name) else "custom-kernel",
            classify.comm_kernel_dim(name))


def _metas(frame: pd.DataFrame) -> dict:
    """Row label → ``_meta_of`` of that row of ``frame``, made column by column."""
    cols = []
    for c in _META:
        values = frame[c].tolist()
        missing = frame[c].isna().to_numpy()
        cols.append([None if m else v for v, m in zip(values, missing)])
    out = {}
    for label, *values in zip(frame.index.tolist(), *cols):
        meta = dict(zip(_META, values))
        if meta["seq"] is not None and meta["seq"] < 0:
            meta["seq"] = None
        out[label] = meta
    return out


def _kernel_row(rank: int, kern, meta: dict, call, of_name: tuple | None = None) -> dict:
    kop, source, likely = of_name if of_name is not None else _of_kernel_name(kern.name)
    hop = canonical_op(meta.get("coll_name")) if meta.get("coll_name") else None
    op = hop or kop or "unknown"
    backend = kop if kop and kop != op else None
    in_n, out_n = meta.get("in_nelems"), meta.get("out_nelems")
    size = dtype_info(meta.get("dtype"))[1]
    return {
        "rank": rank, "op": op, "backend_op": backend,
        "p2p": op in (SEND, RECV) or (op == SEND_RECV and hop in (None, SEND_RECV)),
        "peer_local": None,
        "call_ts_us": call.ts_us if call is not None else np.nan,
        "call_end_us": call.end_us if call is not None else np.nan,
        "exec_ts_us": kern.ts_us, "exec_end_us": kern.end_us,
        "arrival_us": kern.ts_us, "end_us": kern.end_us,
        "in_bytes": in_n * size if in_n is not None and size else None,
        "out_bytes": out_n * size if out_n is not None and size else None,
        "dtype": meta.get("dtype"),
        "source": source,
        "pg_name": meta.get("pg_name"), "pg_desc": meta.get("pg_desc"),
        "pg_ranks": meta.get("pg_ranks") or "", "group_size": meta.get("group_size"),
        "seq": meta.get("seq"), "msg_bytes_hint": meta.get("msg_bytes"),
        "likely_dim": likely}


def _link_by_order(rows: list[dict], meta_host: pd.DataFrame) -> None:
    """Kernels whose launch could not be traced to a host call take the metadata of the host
    calls of the same op in order (the k-th all_reduce kernel, the k-th all_reduce call)."""
    calls: dict[str, list] = {}
    for h in meta_host.sort_values("ts_us").itertuples():
        calls.setdefault(canonical_op(h.coll_name), []).append(h)
    used: dict[str, int] = {}
    for row in rows:
        queue = calls.get(row["op"]) or calls.get(ALL_TO_ALL if row["op"] == SEND_RECV else "")
        if not queue:
            continue
        key = row["op"] if calls.get(row["op"]) else ALL_TO_ALL
        i = used.get(key, 0)
        if i >= len(queue):
            continue
        used[key] = i + 1
        h = queue[i]
        meta = _meta_of(h)
        hop = canonical_op(meta.get("coll_name"))
        if hop and hop != row["op"]:
            row["backend_op"], row["op"] = row["op"], hop
            row["p2p"] = hop in (SEND, RECV)
        size = dtype_info(meta.get("dtype"))[1]
        if meta.get("in_nelems") is not None and size:
            row["in_bytes"] = meta["in_nelems"] * size
        row.update(call_ts_us=h.ts_us, call_end_us=h.end_us, dtype=meta.get("dtype"),
                   pg_name=meta.get("pg_name"), pg_desc=meta.get("pg_desc"),
                   pg_ranks=meta.get("pg_ranks") or "", group_size=meta.get("group_size"),
                   seq=meta.get("seq"), msg_bytes_hint=meta.get("msg_bytes"))


# -- assembly --------------------------------------------------------------------------------

def _trace_groups(meta: dict) -> dict[str, tuple[str, str]]:
    """pg_name → (ranks_key, desc) from the trace's ``distributedInfo.pg_config``."""
    info = meta.get("distributedInfo") if isinstance(meta, dict) else None
    out = {}
    for g in (info or {}).get("pg_config") or [] if isinstance(info, dict) else []:
        if isinstance(g, dict) and isinstance(g.get("ranks"), list) and \
                all(isinstance(r, int) and not isinstance(r, bool) for r in g["ranks"]):
            out[str(g.get("pg_name"))] = (ranks_key(g["ranks"]), g.get("pg_desc"))
    return out


def _msg_bytes(op: str, in_b, out_b, n) -> int | None:
    """S of nccl-tests from this rank's input and output bytes and the group size n: for
    all_gather n × the rank's input (its output as recorded may be one rank's share — gloo
    records a coalesced all_gather's output as one ``[1, …]`` tensor), for reduce_scatter the
    rank's whole input (gloo runs it as an all_reduce and records the full buffer as its
    output too), else n × its output."""
    def times_n(b):
        return b * n if b is not None and n else None
    if op == ALL_GATHER:
        return times_n(in_b) if in_b and n else out_b
    if op == REDUCE_SCATTER:
        return in_b if in_b else times_n(out_b)
    if op in ("scatter",):
        return in_b if in_b else times_n(out_b)
    if op in ("gather",):
        return out_b if out_b else times_n(in_b)
    if op == RECV:
        return out_b if out_b is not None else in_b
    return in_b if in_b is not None else out_b


RAW_COLUMNS = ["rank", "op", "backend_op", "p2p", "peer_local", "call_ts_us", "call_end_us",
               "exec_ts_us", "exec_end_us", "arrival_us", "end_us", "in_bytes", "out_bytes",
               "dtype", "source", "pg_name", "pg_desc", "pg_ranks", "group_size", "seq",
               "msg_bytes_hint", "likely_dim"]


def extract(trace, on_gpu: bool) -> pd.DataFrame:
    """The rank's operations as the trace alone describes them (``RAW_COLUMNS``), before the
    Flight Recorder join and the group and dimension attribution of ``finalize``. Runs where
    the trace is read (``analysis/report/rank_work.py``): the event table stays there."""
    rows = _gpu_rows(trace.events, trace.rank) if on_gpu else _gloo_rows(trace.events, trace.rank)
    for row in rows:
        row.setdefault("likely_dim", None)
    return pd.DataFrame(rows, columns=RAW_COLUMNS)


def small_meta(meta: dict) -> dict:
    """What the cross-rank stage needs of a trace's metadata: its clock base, its host and its
    process groups."""
    info = meta.get("distributedInfo") if isinstance(meta, dict) else None
    host = meta.get("host_name") if isinstance(meta, dict) else None
    return {"baseTimeNanoseconds": meta.get("baseTimeNanoseconds") if isinstance(meta, dict)
            else None, "host_name": host if isinstance(host, str) else None,
            "distributedInfo": {"pg_config": info.get("pg_config")}
            if isinstance(info, dict) else None}


def finalize(raw: pd.DataFrame, *, rank: int, meta: dict, timeline, run: RunInfo | None,
             flight: FlightRecords | None = None, layout_map: dict[str, str] | None = None
             ) -> pd.DataFrame:
    """The instance table of one rank (module docstring) from ``extract``'s rows. ``meta``:
    ``small_meta`` of its trace; ``timeline``: its ``RankTimeline`` (step windows,
    ``meshscope/comm`` scopes); ``flight``: the run's Flight Recorder buffers
    (``records.fr_table.FlightRecords``), if any; ``layout_map``: ranks_key → dimension
    from ``--layout`` (``dims.LayoutMap.groups``)."""
    return table_of(finalize_rows(raw, rank=rank, meta=meta, timeline=timeline, run=run,
                                  flight=flight, layout_map=layout_map))


def table_of(rows: list[dict]) -> pd.DataFrame:
    """The instance table of ``finalize_rows``' rows, of one rank or of several in a row (one
    table made for many ranks' rows spares the cost of making a table per rank)."""
    if not rows:
        return empty()
    return _typed(pd.DataFrame(rows, columns=INSTANCE_COLUMNS))


def finalize_rows(raw: pd.DataFrame, *, rank: int, meta: dict, timeline,
                  run: RunInfo | None, flight: FlightRecords | None = None,
                  layout_map: dict[str, str] | None = None) -> list[dict]:
    """``finalize``'s rows, before they are made a table (``table_of``)."""
    # ``raw.to_dict("records")``, made from each column's list of Python values at once.
    columns = list(raw.columns)
    rows = [dict(zip(columns, values))
            for values in zip(*(raw[c].tolist() for c in columns))] if len(raw) else []
    # A missing value (NaN, NA) is None, but in the four times, where it is NaN: found per
    # column, so that only the rows holding one are looked at.
    for k in raw.columns:
        missing = raw[k].isna().to_numpy()
        if not missing.any():
            continue
        blank = np.nan if k in ("call_ts_us", "call_end_us", "exec_ts_us", "exec_end_us") \
            else None
        for i in np.flatnonzero(missing).tolist():
            if rows[i][k] is not None:
                rows[i][k] = blank
    for row in rows:
        if row["pg_ranks"] is None:
            row["pg_ranks"] = ""
    if not timeline.on_gpu:
        _join_fr(rows, _fr_entries(flight, rank, meta))
    steps = sorted(timeline.steps.items())
    starts = [s for _, (s, _) in steps]
    groups_in_trace = _trace_groups(meta)
    mine = run.groups_of(rank) if run is not None else {}
    out = []
    for row in rows:
        i = bisect.bisect_right(starts, row["arrival_us"]) - 1
        if i < 0 or row["arrival_us"] >= steps[i][1][1]:
            continue
        row["step"] = steps[i][0]
        fr = row.pop("fr", None)
        if fr is not None:
            row["pg_name"], row["pg_desc"] = fr["pg_name"], fr["pg_desc"]
            row["seq"] = fr["seq"] if isinstance(fr["seq"], int) else None
            b_in = _sizes_bytes(fr["input_sizes"], fr["input_dtypes"])
            b_out = _sizes_bytes(fr["output_sizes"], fr["output_dtypes"])
            row["in_bytes"] = b_in if b_in is not None else row["in_bytes"]
            row["out_bytes"] = b_out if b_out is not None else row["out_bytes"]
        if not row["pg_ranks"] and row["pg_name"] is not None:
            g = run.group_named(row["pg_name"]) if run is not None else None
            if g is not None:
                row["pg_ranks"] = g.ranks_key
            elif row["pg_name"] in groups_in_trace:
                row["pg_ranks"] = groups_in_trace[row["pg_name"]][0]
        scope = scope_at(timeline.scopes, row["arrival_us"])
        likely = row.pop("likely_dim", None)
        dim, source = attribute(op=row["op"], p2p=row["p2p"], pg_name=row["pg_name"],
                                pg_desc=row["pg_desc"], pg_ranks=row["pg_ranks"], run=run,
                                layout_map=layout_map, scope=scope or likely)
        if fr is not None and source == "run.json":
            source = "flight_recorder"
        row["dim"], row["dim_source"] = dim, source
        if not row["pg_ranks"]:
            g = mine.get(dim)
            if g is not None:
                row["pg_ranks"] = g.ranks_key
                row["pg_name"] = row["pg_name"] if row["pg_name"] is not None else g.name
                row["pg_desc"] = row["pg_desc"] if row["pg_desc"] is not None else g.desc
            elif run is None and len(groups_in_trace) == 1:
                # Plain DDP and the like: a job with one process group.
                ((name, (key, desc)),) = groups_in_trace.items()
                row.update(pg_ranks=key, pg_name=row["pg_name"] or name,
                           pg_desc=row["pg_desc"] or desc)
        n = row["pg_ranks"].count(",") + 1 if row["pg_ranks"] else row["group_size"]
        row["group_size"] = n
        local = row.pop("peer_local")
        row["peer"] = None
        if row["p2p"] and row["pg_ranks"]:
            members = [int(x) for x in row["pg_ranks"].split(",")]
            if local is not None and 0 <= int(local) < len(members):
                row["peer"] = members[int(local)]
            elif len(members) == 2 and rank in members:
                row["peer"] = members[0] if members[1] == rank else members[1]
        hint = row.pop("msg_bytes_hint")
        row["msg_bytes"] = hint if hint is not None else \
            _msg_bytes(row["op"], row["in_bytes"], row["out_bytes"], n)
        out.append(row)
    counters: dict = {}
    for row in out:
        key = (row["pg_ranks"] or row["pg_name"] or "", row["step"], row["op"],
               row["peer"] if row["p2p"] else None)
        row["k"] = counters.get(key, 0)
        counters[key] = row["k"] + 1
    return out


def _shared_text(df: pd.DataFrame) -> pd.DataFrame:
    """``pg_ranks`` as Python strings, one object per distinct group shared by every row that
    names it (``sys.intern``), rather than each row's own copy of the text: a data-parallel
    group of 512 ranks is 2 kB of text, and its every collective on every rank holds it —
    ranks × rows × group size bytes, which the cross-rank stage's filters and joins copied
    again and again. Copies of a shared-object column copy pointers."""
    df["pg_ranks"] = pd.Series([sys.intern(r) if isinstance(r, str) else "" for r in
                                df["pg_ranks"]], index=df.index, dtype=object)
    return df
