"""The bandwidth report: every operation of the instance table with its bytes, its transfer
and wait, and nccl-tests' algbw/busbw — per operation and rank, and per (dimension, op, group
size, message-size bucket).

**Per operation and rank** (``bandwidth_table``), from the matched instance table
(``analysis/comm/instances.py``, ``matching.py``): dur_us is the rank's executing span (the
``gloo:`` range, the NCCL kernel); transfer_us is the matched operation's transfer — for a
collective the shortest span over its ranks (the rank that arrived last waited for nobody), for
a send/recv pair the receive's executing time after the send was posted (``matching.p2p_table``:
the time a receive waits for its sender is wait, not transfer; null, and so no bandwidth, when
the receive has no executing span); wait_us = dur_us − transfer_us (at least 0) is this rank's
waiting for the others. An operation with no match uses its own span. algbw/busbw (``analysis/comm/bandwidth.py``) use msg_bytes (S as
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

import numpy as np
import pandas as pd

from meshscope.analysis.comm.bandwidth import add_bandwidth, canonical_op, size_buckets

TABLE_COLUMNS = ["rank", "step", "match_id", "pg_ranks", "dim", "op", "backend_op", "k", "seq",
                 "msg_bytes", "group_size", "dur_us", "transfer_us", "wait_us"]
SUMMARY_COLUMNS = ["dim", "op", "group_size", "size_bucket", "instances", "msg_bytes",
                   "transfer_us", "busbw_gbps", "busbw_max_gbps", "baseline_busbw_gbps",
                   "efficiency"]


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
    # Only an operation without a match uses its own span; a matched one whose transfer the
    # trace cannot separate from waiting (a receive without an executing span) stays null.
    t["transfer_us"] = t["transfer_us"].where(t["match_id"].isin(transfer.index), t["dur_us"])
    t["wait_us"] = (t["dur_us"] - t["transfer_us"]).clip(lower=0.0)
    return add_bandwidth(t[TABLE_COLUMNS], op="op", size="msg_bytes", time="transfer_us",
                         group="group_size")


def bandwidth_summary(table: pd.DataFrame, baseline: pd.DataFrame | None = None
                      ) -> pd.DataFrame:
    """Per (dim, op, group size, size bucket) (module docstring)."""
    if table.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    t = table.assign(size_bucket=size_buckets(table["msg_bytes"]))
    g = t.groupby(["dim", "op", "group_size", "size_bucket"], dropna=False)
    out = g.agg(instances=("dur_us", "size"), msg_bytes=("msg_bytes", "median"),
                transfer_us=("transfer_us", "median"), busbw_gbps=("busbw_gbps", "median"),
                busbw_max_gbps=("busbw_gbps", "max")).reset_index()
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
