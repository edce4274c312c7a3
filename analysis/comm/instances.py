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
import sys
from typing import Iterable

import numpy as np
import pandas as pd

from meshscope.analysis.column_join import joined_by_column
from meshscope.analysis.comm import gloo_rows, nccl_rows
from meshscope.analysis.comm.bandwidth import ALL_GATHER, RECV, REDUCE_SCATTER, canonical_op
from meshscope.analysis.comm.dims import attribute
from meshscope.analysis.ingest.comm_meta import tensor_bytes
from meshscope.analysis.records.fr_table import FlightRecords
from meshscope.analysis.timeline.rank_timeline import scope_at
from meshscope.collectors.run_info import RunInfo, ranks_key

INSTANCE_COLUMNS = ["rank", "step", "op", "backend_op", "p2p", "peer", "pg_name", "pg_desc",
                    "pg_ranks", "group_size", "dim", "dim_source", "seq", "k", "call_ts_us",
                    "call_end_us", "exec_ts_us", "exec_end_us", "arrival_us", "end_us",
                    "msg_bytes", "in_bytes", "out_bytes", "dtype", "source"]
_INT_COLUMNS = ("peer", "group_size", "seq", "msg_bytes", "in_bytes", "out_bytes")
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


# -- the Flight Recorder join (gloo traces: their groups and sequence numbers) -------------

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
                    (e["op"] == row["op"] or gloo_rows.compatible(row["op"], e["op"])):
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
        b = tensor_bytes(dims, dt)
        if b is None:
            return None
        total += b
    return total


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
    rows = nccl_rows.kernel_rows(trace.events, trace.rank) if on_gpu else gloo_rows.gloo_rows(trace.events, trace.rank)
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


def joined(tables: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """One instance table of ``tables`` (``table_of``'s, in order), joined a column at a time
    (``column_join``): the instance table is the cross-rank stage's largest, a row per
    operation and rank, and one ``pd.concat`` held it twice (issue 51)."""
    out = joined_by_column(tables, INSTANCE_COLUMNS)
    return empty() if out is None else out


def finalize_rows(raw: pd.DataFrame, *, rank: int, meta: dict, timeline,
                  run: RunInfo | None, flight: FlightRecords | None = None,
                  layout_map: dict[str, str] | None = None) -> list[dict]:
    """``finalize``'s rows, before they are made a table (``table_of``): each raw operation in
    a step, with its Flight Recorder entry's group, sequence number and bytes (CPU traces),
    its group's ranks, its dimension, its peer and its message size, numbered within its
    (group, step, op, peer)."""
    rows = _plain_rows(raw)
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
            _take_flight_record(row, fr)
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
            _take_group(row, mine.get(dim), groups_in_trace if run is None else {})
        n = row["pg_ranks"].count(",") + 1 if row["pg_ranks"] else row["group_size"]
        row["group_size"] = n
        row["peer"] = _peer(row, row.pop("peer_local"), rank)
        hint = row.pop("msg_bytes_hint")
        row["msg_bytes"] = hint if hint is not None else \
            _msg_bytes(row["op"], row["in_bytes"], row["out_bytes"], n)
        out.append(row)
    _number_repeats(out)
    return out


def _plain_rows(raw: pd.DataFrame) -> list[dict]:
    """``raw.to_dict("records")``, made from each column's list of Python values at once, a
    missing value (NaN, NA) None — but in the four times, where it is NaN — and a missing
    ``pg_ranks`` empty."""
    columns = list(raw.columns)
    rows = [dict(zip(columns, values))
            for values in zip(*(raw[c].tolist() for c in columns))] if len(raw) else []
    # Found per column, so that only the rows holding a missing value are looked at.
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
    return rows


def _take_flight_record(row: dict, fr: dict) -> None:
    """``row`` given its Flight Recorder entry's group, sequence number and bytes (the
    bytes only where the entry knows them)."""
    row["pg_name"], row["pg_desc"] = fr["pg_name"], fr["pg_desc"]
    row["seq"] = fr["seq"] if isinstance(fr["seq"], int) else None
    b_in = _sizes_bytes(fr["input_sizes"], fr["input_dtypes"])
    b_out = _sizes_bytes(fr["output_sizes"], fr["output_dtypes"])
    row["in_bytes"] = b_in if b_in is not None else row["in_bytes"]
    row["out_bytes"] = b_out if b_out is not None else row["out_bytes"]


def _take_group(row: dict, group, groups_in_trace: dict) -> None:
    """A row whose group's ranks are unknown given them: from run.json's group of its
    dimension (``group``), else — without run.json — from the trace's one process group
    (``groups_in_trace`` with one entry: plain DDP and the like); name and description only
    where the row has none."""
    if group is not None:
        row["pg_ranks"] = group.ranks_key
        row["pg_name"] = row["pg_name"] if row["pg_name"] is not None else group.name
        row["pg_desc"] = row["pg_desc"] if row["pg_desc"] is not None else group.desc
    elif len(groups_in_trace) == 1:
        ((name, (key, desc)),) = groups_in_trace.items()
        row.update(pg_ranks=key, pg_name=row["pg_name"] or name,
                   pg_desc=row["pg_desc"] or desc)


def _peer(row: dict, local, rank: int) -> int | None:
    """The global rank a send or receive of ``rank`` went to or came from: its group's
    member ``local`` (the peer's rank in the group), else the other rank of a group of two;
    None for a collective or where unknown."""
    if not (row["p2p"] and row["pg_ranks"]):
        return None
    members = [int(x) for x in row["pg_ranks"].split(",")]
    if local is not None and 0 <= int(local) < len(members):
        return members[int(local)]
    if len(members) == 2 and rank in members:
        return members[0] if members[1] == rank else members[1]
    return None


def _number_repeats(rows: list[dict]) -> None:
    """Each row's ``k``: how many rows of the same (group, step, op, peer) came before it."""
    counters: dict = {}
    for row in rows:
        key = (row["pg_ranks"] or row["pg_name"] or "", row["step"], row["op"],
               row["peer"] if row["p2p"] else None)
        row["k"] = counters.get(key, 0)
        counters[key] = row["k"] + 1


def _shared_text(df: pd.DataFrame) -> pd.DataFrame:
    """``pg_ranks`` as Python strings, one object per distinct group shared by every row that
    names it (``sys.intern``), rather than each row's own copy of the text: a data-parallel
    group of 512 ranks is 2 kB of text, and its every collective on every rank holds it —
    ranks × rows × group size bytes, which the cross-rank stage's filters and joins copied
    again and again. Copies of a shared-object column copy pointers."""
    df["pg_ranks"] = pd.Series([sys.intern(r) if isinstance(r, str) else "" for r in
                                df["pg_ranks"]], index=df.index, dtype=object)
    return df
