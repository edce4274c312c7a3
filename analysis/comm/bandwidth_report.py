"""The bandwidth report: every operation of the instance table with its bytes, its transfer
and wait, and nccl-tests' algbw/busbw — per operation and rank, and per (dimension, op, group
size, message-size bucket).

**Per operation and rank** (``bandwidth_table``), from the matched instance table
(``analysis/comm/instances.py``, ``matching.py``): dur_us is the rank's executing span (the
``gloo:`` range, the NCCL kernel); transfer_us is the matched operation's transfer — for a
collective the shortest span over its ranks (the rank that arrived last waited for nobody), for
a send/recv pair the time both sides' kernels ran together (``matching.p2p_table``: the time a
receive waits for its sender is wait, not transfer; null, and so no bandwidth, where the trace
cannot separate them — every gloo send/recv, whose ranges are the wait for asynchronous work);
wait_us = dur_us − transfer_us (at least 0) is this rank's waiting for the others, and for a
send/recv of unknown transfer the part of its span before its peer posted (``send_wait_us`` /
``recv_wait_us``: the waiting the trace does show). A collective with no match uses its own
span; an unmatched send/recv has no transfer. algbw/busbw (``analysis/comm/bandwidth.py``) use msg_bytes (S as
nccl-tests defines it) over transfer_us with n = the group's size; unknown bytes give an empty
busbw, never 0. gloo runs reduce_scatter as an all_reduce of the whole input: the row keeps the
algorithm's op and bytes and names the backend's op in ``backend_op`` (its bus traffic is
2(n−1)/n × S instead of (n−1)/n × S).

Columns: rank, step, match_id, pg_ranks, dim, op, backend_op, k, seq, msg_bytes, group_size,
dur_us, transfer_us, wait_us, bus_factor, algbw_gbps, busbw_gbps.

**Summary** (``bandwidth_summary``): per (dim, op, group_size, size_bucket): instances, median
msg_bytes, median transfer_us, median and max busbw_gbps, and — when a baseline is given
(``meshscope bench-comm`` or nccl-tests output) — the baseline busbw of the same op, bucket and
group size and ``efficiency`` = median busbw / baseline busbw.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import pandas as pd

from meshscope.analysis.comm.bandwidth import add_bandwidth, canonical_op, size_buckets

TABLE_COLUMNS = ["rank", "step", "match_id", "pg_ranks", "dim", "op", "backend_op", "k", "seq",
                 "msg_bytes", "group_size", "dur_us", "transfer_us", "wait_us"]
SUMMARY_COLUMNS = ["dim", "op", "group_size", "size_bucket", "instances", "msg_bytes",
                   "transfer_us", "busbw_gbps", "busbw_max_gbps", "baseline_busbw_gbps",
                   "efficiency"]
_KEYS = ["dim", "op", "group_size", "size_bucket"]


def bandwidth_table(inst: pd.DataFrame, collectives: pd.DataFrame,
                    p2p: pd.DataFrame) -> pd.DataFrame:
    """Per operation and rank (module docstring)."""
    if inst.empty:
        return add_bandwidth(pd.DataFrame(columns=TABLE_COLUMNS), op="op", time="transfer_us")
    t = inst.copy()
    t["dur_us"] = (t["exec_end_us"] - t["exec_ts_us"]).where(t["exec_ts_us"].notna(),
                                                             t["call_end_us"] - t["call_ts_us"])
    transfer = pd.concat([collectives.set_index("match_id")["transfer_us"],
                          p2p.set_index("match_id")["transfer_us"]]) \
        if len(collectives) or len(p2p) else pd.Series(dtype=float)
    t["transfer_us"] = t["match_id"].map(transfer)
    # Only a collective without a match uses its own span; a matched operation whose transfer
    # the trace cannot separate from waiting stays null, and so does every unmatched send/recv
    # (its span holds the wait for a peer nobody saw).
    own_span = ~t["match_id"].isin(transfer.index) & ~t["p2p"].astype(bool)
    t["transfer_us"] = t["transfer_us"].where(~own_span, t["dur_us"])
    t["wait_us"] = (t["dur_us"] - t["transfer_us"]).clip(lower=0.0)
    # A send/recv whose transfer is unknown still knows its wait for the peer's post.
    if len(p2p):
        by_mid = p2p.set_index("match_id")
        side_wait = np.where(t["op"] == "send", t["match_id"].map(by_mid["send_wait_us"]),
                             t["match_id"].map(by_mid["recv_wait_us"])).astype(float)
        fill = t["p2p"].astype(bool).to_numpy() & t["transfer_us"].isna().to_numpy()
        t.loc[fill, "wait_us"] = side_wait[fill]
    return add_bandwidth(t[TABLE_COLUMNS], op="op", size="msg_bytes", time="transfer_us",
                         group="group_size")


def bandwidth_summary(table: pd.DataFrame | Callable[[], Iterable[pd.DataFrame]],
                      baseline: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (dim, op, group size, size bucket) (module docstring), of ``table``, or of the parts
    that ``table()`` gives one after another (``table_parts.TableParts.parts``: the bandwidth
    table of a big run, a row per operation and rank, is never read whole, issue 51).

    The groups are found part by part and numbered over the parts; then each column whose
    statistics are taken is read from the parts alone (float64, as pandas takes the statistics
    of a number column), its values put in the order of their groups, and each group's median
    (the middle value, or the mean of the two middle ones) and maximum taken of its slice, its
    missing values left out. The same groups, in the same order, and the same numbers as one
    ``groupby`` of the whole table; held at once, a group number and one column's value a row
    (12 bytes), not the table's key columns and a sorted copy of its columns.
    """
    parts = (lambda: [table]) if isinstance(table, pd.DataFrame) else table
    keys: list[pd.DataFrame] = []          # each part's groups, in the order of its numbers
    numbers: list[np.ndarray] = []         # each row's group, numbered over the parts' groups
    seen = 0                               # the groups of the parts before
    for part in parts():
        if len(part):
            g = part[_KEYS[:3]].assign(size_bucket=size_buckets(part["msg_bytes"])).groupby(
                _KEYS, dropna=False, sort=False)
            numbers.append((g.ngroup().to_numpy() + seen).astype(np.int32))
            keys.append(g.size().index.to_frame(index=False))
            seen += len(keys[-1])
        del part
    if not keys:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    # The parts' groups made one (sorted, as a groupby of the whole table sorts them), and the
    # rows in the order of their groups.
    groups = pd.concat(keys, ignore_index=True).groupby(_KEYS, dropna=False, sort=True)
    group = groups.ngroup().to_numpy().astype(np.int32)[np.concatenate(numbers)]
    del numbers
    order = np.argsort(group, kind="stable")
    edges = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=groups.ngroups))])
    del group

    def by_group(column: str, *stats: Callable[[np.ndarray], float]) -> list[pd.Series]:
        """Each of ``stats`` of each group's values of ``column`` (as float64, as pandas takes
        them of a number column, missing values left out; NaN for a group without values),
        typed as pandas types them (Float64 of a nullable column)."""
        joined, start, nullable = np.empty(len(order)), 0, False
        for p in parts():
            col = p[column]
            nullable |= isinstance(col.array, (pd.arrays.IntegerArray, pd.arrays.FloatingArray))
            joined[start:start + len(col)] = col.to_numpy(np.float64, na_value=np.nan)
            start += len(col)
        ordered = joined[order]
        del joined
        out = np.full((len(stats), len(edges) - 1), np.nan)
        for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
            values = ordered[lo:hi][~np.isnan(ordered[lo:hi])]
            if len(values):
                out[:, i] = [stat(values) for stat in stats]
        return [pd.Series(pd.array(o, dtype="Float64") if nullable else o) for o in out]
    transfer_us, = by_group("transfer_us", np.median)
    busbw_gbps, busbw_max_gbps = by_group("busbw_gbps", np.median, np.max)
    msg_bytes, = by_group("msg_bytes", np.median)
    out = groups.size().index.to_frame(index=False).assign(
        instances=np.diff(edges), msg_bytes=msg_bytes, transfer_us=transfer_us,
        busbw_gbps=busbw_gbps, busbw_max_gbps=busbw_max_gbps)
    out["baseline_busbw_gbps"] = np.nan
    if baseline is not None and not baseline.empty:
        b = baseline.assign(op=baseline["op"].map(canonical_op),
                            size_bucket=size_buckets(baseline["size_bytes"]))
        b = b.groupby(["op", "n_ranks", "size_bucket"])["busbw_gbps"].median()
        out["baseline_busbw_gbps"] = [
            b.get((op, n, sb), np.nan) for op, n, sb in
            zip(out["op"], out["group_size"], out["size_bucket"])]
    out["efficiency"] = out["busbw_gbps"] / out["baseline_busbw_gbps"]
    return out[SUMMARY_COLUMNS]
