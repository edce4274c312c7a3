"""The operations of a GPU (NCCL) trace: each communication kernel, joined to the host call
that launched it, as rows of the collective-instance table before the cross-rank stage
(``instances.RAW_COLUMNS``; ``instances.extract`` calls ``kernel_rows``).

The kernel says when the operation ran on the device and, in recent traces, its element
counts, type, group and sequence number; where it does not, the ``record_param_comms`` /
``nccl:…`` range around its launch does (``_metas``, joined by correlation id or, failing
that, by order: ``_link_by_order``). An op the kernel's name does not tell
(``canonical_op``) is named by its kernel family (``classify.comm_kernel_op``); a kernel that
is not NCCL's is a ``custom-kernel``.
"""
from __future__ import annotations

import bisect

import numpy as np
import pandas as pd

from meshscope.analysis.comm.bandwidth import ALL_TO_ALL, RECV, SEND, SEND_RECV, canonical_op
from meshscope.analysis.ingest import classify
from meshscope.analysis.ingest.comm_meta import dtype_info

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


def kernel_rows(events: pd.DataFrame, rank: int) -> list[dict]:
    """One row (``instances.RAW_COLUMNS``) per communication kernel of a GPU rank, in start
    order, with the metadata of the kernel itself and of the host ranges around its launch."""
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
