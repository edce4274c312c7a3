"""The bandwidth report: every collective instance with its bytes, its transfer time and wait,
and nccl-tests' algbw/busbw — per instance and per (dimension, op, message-size bucket).

**Instances** (``rank_transfers``, one rank at a time). On CPU/gloo traces each collective is a
pair (``collectives.gloo_pairs``): the ``c10d::`` call names the *algorithm*
(``_reduce_scatter_base_`` is a reduce_scatter), and the ``gloo:`` range that ran it gives its
duration and the tensor it moved. gloo runs reduce_scatter as an all_reduce of the whole input: the row
keeps the algorithm's op and bytes and names the backend's op in ``backend_op`` (its bus
traffic is 2(n−1)/n × S instead of (n−1)/n × S). On GPU traces the NCCL kernel gives the
duration and its op; bytes and group come from the matching ``record_param_comms`` (the k-th of
the same op on that rank). Its columns: rank, step, group, dim, op, backend_op, k, msg_bytes (S
as nccl-tests defines it; for gloo's all_gather the range holds one rank's share, so S = n ×
share), group_size, dur_us.

**Transfer and wait** (``bandwidth_table``). A matched instance (group, step, op, k) runs on
every rank of its group; its transfer time is the minimum duration over the ranks (the rank
that arrived last waited for nobody), and each rank's wait_us = dur_us − transfer_us. algbw and
busbw use the transfer time (``analysis/bandwidth.py``; n = the group's size). Unmatched
instances (a rank of the group absent) use their own duration.

**Summary** (``bandwidth_summary``): per (dim, op, size_bucket): instances, median msg_bytes,
median transfer_us, median and max busbw_gbps, and — when a baseline is given (``meshscope
bench-comm`` or nccl-tests output) — the baseline busbw of the same op, bucket and group size
and ``efficiency`` = median busbw / baseline busbw.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.ingest import classify
from meshscope.analysis.comm.bandwidth import add_bandwidth, canonical_op, size_buckets
from meshscope.analysis.comm.collectives import gloo_pairs, rank_groups
from meshscope.analysis.timeline.rank_timeline import comm_dimension, scope_at

TRANSFER_COLUMNS = ["rank", "step", "group", "dim", "op", "backend_op", "k", "msg_bytes",
                    "group_size", "dur_us"]


def _group_size(group: str) -> int | None:
    return len(group.split(",")) if group else None


def rank_transfers(tr, tl, run: dict | None) -> pd.DataFrame:
    ev = tr.events
    comm = ev[ev["kind"] == classify.COMMUNICATION]
    groups = rank_groups(tr.rank, run, tr.meta)
    rows = []
    for step, (s, e) in sorted(tl.steps.items()):
        inside = comm[(comm["ts_us"] >= s) & (comm["ts_us"] < e)]
        counters: dict = {}
        if tl.on_gpu:
            kernels = inside[inside["device"]].sort_values("ts_us")
            meta = inside[(inside["name"] == "record_param_comms")].sort_values("ts_us")
            meta_by_op: dict = {}
            for m in meta.itertuples():
                meta_by_op.setdefault(canonical_op(m.coll_name), []).append(m)
            items = []
            for kern in kernels.itertuples():
                op = canonical_op(kern.name)
                k = counters.get(op, 0)
                counters[op] = k + 1
                m = meta_by_op.get(op, [])
                m = m[k] if k < len(m) else None
                group = (m.pg_ranks if m is not None and isinstance(m.pg_ranks, str)
                         else groups.get("unknown", ""))
                desc = m.pg_desc if m is not None and isinstance(m.pg_desc, str) else ""
                items.append((op, op, group, m.msg_bytes if m is not None else np.nan,
                              kern.dur_us, desc if desc.startswith("mesh_") else kern.name,
                              kern.ts_us))
            counters = {}
        else:
            items = []
            for _, rng, op in gloo_pairs(inside):
                backend = canonical_op(rng.name)
                dim = comm_dimension(rng.name, run, scope_at(tl.scopes, rng.ts_us))
                group = groups.get(dim, "")
                n = _group_size(group)
                size = rng.msg_bytes
                if op == "all_gather" and n and not pd.isna(size):
                    size = size * n  # the range holds one rank's share; S is the gathered whole
                items.append((op, backend, group, size, rng.dur_us, rng.name, rng.ts_us))
        for op, backend, group, size, dur, name, ts in items:
            dim = name[len("mesh_"):] if name.startswith("mesh_") else \
                comm_dimension(name, run, scope_at(tl.scopes, ts))
            k = counters.get((group, op), 0)
            counters[(group, op)] = k + 1
            rows.append({"rank": tr.rank, "step": step, "group": group, "dim": dim, "op": op,
                         "backend_op": backend if backend != op else None, "k": k,
                         "msg_bytes": size, "group_size": _group_size(group), "dur_us": dur})
    return pd.DataFrame(rows, columns=TRANSFER_COLUMNS)


def bandwidth_table(transfers: pd.DataFrame) -> pd.DataFrame:
    """Instances with transfer_us, wait_us, bus_factor, algbw_gbps, busbw_gbps."""
    if transfers.empty:
        return transfers.assign(transfer_us=[], wait_us=[], bus_factor=[], algbw_gbps=[],
                                busbw_gbps=[])
    keys = ["group", "step", "op", "k"]
    t = transfers.copy()
    t["transfer_us"] = t.groupby(keys)["dur_us"].transform("min")
    t["wait_us"] = t["dur_us"] - t["transfer_us"]
    return add_bandwidth(t, op="op", size="msg_bytes", time="transfer_us", group="group_size")


def bandwidth_summary(table: pd.DataFrame, baseline: pd.DataFrame | None = None
                      ) -> pd.DataFrame:
    cols = ["dim", "op", "group_size", "size_bucket", "instances", "msg_bytes",
            "transfer_us", "busbw_gbps", "busbw_max_gbps", "baseline_busbw_gbps", "efficiency"]
    if table.empty:
        return pd.DataFrame(columns=cols)
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
    return out[cols]
