"""The kernels a rank ran: the top kernels by time with their category, and the achieved
throughput of its matrix multiplications against the device's peak.

``kernel_table`` — one row per kernel name (the top ``TOP_KERNELS`` by total time, and one row
``(other kernels)`` for the rest), per rank, over the profiled step windows:

============ ======================================================================
column       meaning
============ ======================================================================
rank         the rank
name         the kernel's name (memcpy / memset by their trace names)
category     ``CATEGORIES``: gemm, attention, convolution, norm/elementwise, reduction,
             communication, memcpy/memset, other (``category``)
count        how many ran
total_us     their summed duration
mean_us      total_us / count
share_pct    total_us over the rank's device time in these windows × 100
graph        True when launched by a CUDA graph (``cudaGraphLaunch``): counted as any other
============ ======================================================================

``kernel_totals`` — every device event of the profiled steps, by name: one row per (rank,
step, name) with ``category``, ``count`` and ``total_us``. An event belongs to the step that
launched it (``step_windows.device_step_of``: the step whose host range holds its launching
runtime call), as HTA assigns kernels to iterations; events no profiled step launched are not
counted. Nothing is cut to the top: this is what ``meshscope compare`` diffs kernel by kernel
(``analysis/compare/``), and the sum of ``total_us`` over a step's rows is the device time its
launches ran.

``gemm_table`` — one row per matrix-multiplication operator call whose shapes the trace
records (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear`` with
``Input Dims`` and ``Input type``: ``record_shapes=True``): ``op``, ``shapes`` (text),
``dtype``, ``flops`` (2·M·N·K, times the batch), ``kernel_us`` (the kernels it launched, by
correlation), ``tflops`` (achieved, flops / kernel time), ``peak_tflops`` (the device's peak
for that type, ``collectors/devices.py``; null when unknown) and ``efficiency`` (tflops over
peak). Rows are aggregated by (op, shapes, dtype): ``calls`` counts them.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from meshscope.analysis.ingest import classify
from meshscope.collectors import devices

TOP_KERNELS = 20
CATEGORIES = ("gemm", "attention", "convolution", "norm/elementwise", "reduction",
              "communication", "memcpy/memset", "other")
KERNEL_COLUMNS = ["rank", "name", "category", "count", "total_us", "mean_us", "share_pct",
                  "graph"]
TOTALS_COLUMNS = ["rank", "step", "name", "category", "count", "total_us"]
GEMM_COLUMNS = ["rank", "op", "shapes", "dtype", "calls", "flops", "kernel_us", "tflops",
                "peak_tflops", "efficiency"]
GEMM_OPS = classify.GEMM_OPS

_CONV = re.compile(r"conv(?!ert)|implicit_gemm|implicit_convolve|dgrad|wgrad|fprop|winograd|"
                   r"scudnn|MIOpen", re.I)
_RULES = (
    ("other", re.compile(r"embedding|embedding_bag|split_embedding", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|softmax_warp", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|cublas|ampere_.*_tn|sm\d+_xmma|nvjet|Cijk_|"
                        r"matmul|_mm_|\bbmm|bmm_|wgmma|hipblaslt", re.I)),
    ("norm/elementwise", re.compile(r"layer_?norm|rms_?norm|batch_?norm|group_?norm|bn_",
                                    re.I)),
    ("reduction", re.compile(r"reduce|sum_|welford|argmax|argmin|cub::|scan", re.I)),
    ("norm/elementwise", re.compile(r"elementwise|vectorized|unrolled|relu|gelu|silu|add|mul|"
                                    r"copy|fill|cat|index|transpose|triton_", re.I)),
)


def category(name: str, cat: str, kind: str) -> str:
    """The ``CATEGORIES`` label of one device event, by its kind and name: communication and
    copies by kind; then convolution (cuDNN's and MIOpen's kernels, implicit-GEMM convolutions —
    ``conv`` but not ``Convert``), embedding lookups (other), attention, GEMM (also batched:
    ``bmm``), reduction, normalisation and elementwise, in that order."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy/memset"
    if kind == classify.COMMUNICATION:
        return "communication"
    if _CONV.search(name):
        return "convolution"
    for label, rx in _RULES:
        if rx.search(name):
            return label
    return "other"


def kernel_table(rank: int, dev: pd.DataFrame, graph_corr: set[int]) -> pd.DataFrame:
    """The rank's top kernels (module docstring). ``dev``: its device events inside the step
    windows; ``graph_corr``: correlation ids of ``cudaGraphLaunch`` calls."""
    if dev.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    g = dev.assign(graph=dev["correlation"].isin(graph_corr)).groupby("name", sort=False).agg(
        count=("dur_us", "size"), total_us=("dur_us", "sum"), cat=("cat", "first"),
        kind=("kind", "first"), graph=("graph", "any")).reset_index()
    total = float(g["total_us"].sum())
    g = g.sort_values("total_us", ascending=False, kind="stable")
    top, rest = g.iloc[:TOP_KERNELS], g.iloc[TOP_KERNELS:]
    rows = [{"rank": rank, "name": n, "category": category(n, c, k), "count": int(cnt),
             "total_us": float(t), "graph": bool(gr)}
            for n, c, k, cnt, t, gr in zip(top["name"], top["cat"], top["kind"], top["count"],
                                           top["total_us"], top["graph"])]
    if len(rest):
        rows.append({"rank": rank, "name": f"(other kernels: {len(rest)} names)",
                     "category": "other", "count": int(rest["count"].sum()),
                     "total_us": float(rest["total_us"].sum()),
                     "graph": bool(rest["graph"].any())})
    out = pd.DataFrame(rows)
    out["mean_us"] = out["total_us"] / out["count"]
    out["share_pct"] = out["total_us"] / total * 100 if total > 0 else np.nan
    return out[KERNEL_COLUMNS]


def kernel_totals(rank: int, dev: pd.DataFrame, step: np.ndarray) -> pd.DataFrame:
    """Every device event by (step, name) (module docstring, ``TOTALS_COLUMNS``). ``dev``: the
    rank's device events (name, cat, kind, dur_us); ``step``: the profiled step of each
    (``step_windows.device_step_of``; -1 for none)."""
    kept = step >= 0
    if not kept.any():
        return pd.DataFrame(columns=TOTALS_COLUMNS)
    d = dev.loc[kept, ["name", "cat", "kind", "dur_us"]].assign(step=step[kept])
    g = d.groupby(["step", "name"], sort=True, observed=True).agg(
        count=("dur_us", "size"), total_us=("dur_us", "sum"), cat=("cat", "first"),
        kind=("kind", "first")).reset_index()
    label = {}
    for n, c, k in zip(g["name"], g["cat"], g["kind"]):
        if n not in label:
            label[n] = category(str(n), str(c), str(k))
    g["category"] = g["name"].map(label).astype(object)
    g["name"] = g["name"].astype(object)
    g["count"] = g["count"].astype(np.int64)
    g["total_us"] = g["total_us"].astype(np.float64)
    return g.assign(rank=rank)[TOTALS_COLUMNS]


def category_totals(rank: int, dev: pd.DataFrame) -> pd.DataFrame:
    """Device time per category (rank, category, count, total_us)."""
    if dev.empty:
        return pd.DataFrame(columns=["rank", "category", "count", "total_us"])
    names = dev[["name", "cat", "kind"]].drop_duplicates()
    label = {n: category(n, c, k) for n, c, k in zip(names["name"], names["cat"],
                                                     names["kind"])}
    g = dev.assign(category=dev["name"].map(label)).groupby("category").agg(
        count=("dur_us", "size"), total_us=("dur_us", "sum")).reset_index()
    return g.assign(rank=rank)[["rank", "category", "count", "total_us"]]


def gemm_shape(op: str, dims) -> tuple[int, int, int, int] | None:
    """(M, N, K, batch) of one matrix-multiplication call from its ``Input Dims``: the product
    of an M×K and a K×N matrix, ``batch`` times (bmm, baddbmm; 1 otherwise; ``linear`` and
    ``matmul`` fold the input's leading dimensions into M). None when the shapes do not fit
    the op (the trace's values are not trusted: any list of lists of integers, or anything
    else, gives a shape or None, never an error)."""
    if not isinstance(dims, list):
        return None
    shapes = []
    for d in dims:
        if not isinstance(d, list) or not all(type(x) is int and 0 <= x < 1 << 40 for x in d):
            shapes.append(None)
        else:
            shapes.append(d)
    nonempty = [s for s in shapes if s]

    def mat(s) -> bool:
        return s is not None and len(s) == 2

    if op == "aten::mm" and len(shapes) >= 2 and mat(shapes[0]) and mat(shapes[1]) \
            and shapes[0][1] == shapes[1][0]:
        (m, k), n = shapes[0], shapes[1][1]
        return m, n, k, 1
    if op == "aten::addmm" and len(shapes) >= 3 and mat(shapes[1]) and mat(shapes[2]) \
            and shapes[1][1] == shapes[2][0]:
        (m, k), n = shapes[1], shapes[2][1]
        return m, n, k, 1
    if op in ("aten::bmm", "aten::baddbmm"):
        i = 0 if op == "aten::bmm" else 1
        if len(shapes) < i + 2:
            return None
        a, b = shapes[i], shapes[i + 1]
        if a is not None and b is not None and len(a) == 3 and len(b) == 3 \
                and a[0] == b[0] and a[2] == b[1]:
            return a[1], b[2], a[2], a[0]
        return None
    if op == "aten::linear" and len(nonempty) >= 2 and mat(nonempty[1]) and nonempty[0] \
            and nonempty[0][-1] == nonempty[1][1]:
        x, w = nonempty[0], nonempty[1]
        return math.prod(x[:-1]), w[0], x[-1], 1
    if op == "aten::matmul" and len(nonempty) >= 2 and len(nonempty[0]) >= 2 \
            and len(nonempty[1]) == 2 and nonempty[0][-1] == nonempty[1][0]:
        x, w = nonempty[0], nonempty[1]
        return math.prod(x[:-1]), w[1], x[-1], 1
    return None


def gemm_flops(op: str, dims) -> float | None:
    """2·M·N·K (times the batch) of one matrix-multiplication call from its ``Input Dims``
    (``gemm_shape``); None when the shapes do not fit the op."""
    shape = gemm_shape(op, dims)
    if shape is None:
        return None
    m, n, k, batch = shape
    return 2.0 * m * n * k * batch


def _innermost(ops: pd.DataFrame) -> pd.DataFrame:
    """The GEMM operators that hold no other: ``aten::linear`` → ``aten::addmm`` keeps the
    ``addmm`` alone, so a kernel is counted once."""
    keep = []
    for _, g in ops.groupby("lane", sort=False):
        g = g.assign(_neg_end=-g["end_us"]).sort_values(["ts_us", "_neg_end"], kind="stable")
        ts, end = g["ts_us"].to_numpy(), g["end_us"].to_numpy()
        holds = np.zeros(len(g), dtype=bool)
        holds[:-1] = (ts[1:] < end[:-1]) & (end[1:] <= end[:-1])
        keep.append(g[~holds].drop(columns="_neg_end"))
    return pd.concat(keep) if keep else ops


def _gemm_call(name: str, args) -> tuple[float, str, str] | None:
    """(flops, shapes as text, dtype) of one GEMM call of op ``name`` from its recorded
    arguments (``call_args``' JSON text); None when they do not parse or give no FLOPs."""
    try:
        parsed = json.loads(args)
    except (TypeError, ValueError):
        return None
    dims, types = parsed.get("dims") or [], parsed.get("types") or []
    flops = gemm_flops(name, dims)
    if not flops:
        return None
    dtype = next((t for t in types if isinstance(t, str) and t), "")
    return flops, json.dumps(dims), dtype


def gemm_table(rank: int, host: pd.DataFrame, dev: pd.DataFrame, launch_lane_ts: pd.DataFrame,
               device_name: str | None) -> pd.DataFrame:
    """The rank's matrix multiplications with shapes (module docstring). ``host``: its host
    events with ``call_args``; ``dev``: device events in the windows; ``launch_lane_ts``: the
    launching runtime calls (lane, ts_us, end_us, correlation)."""
    ops = _innermost(host[host["name"].isin(GEMM_OPS)])
    ops = ops[ops["call_args"].notna()]
    if ops.empty or dev.empty or launch_lane_ts.empty:
        return pd.DataFrame(columns=GEMM_COLUMNS)
    kernel_us = dev.groupby("correlation")["dur_us"].sum()
    calls = launch_lane_ts[launch_lane_ts["correlation"].isin(kernel_us.index)]
    rows = []
    of_call: dict = {}              # (op, arguments) → _gemm_call's answer, made once each
    for lane, g in ops.groupby("lane", sort=False):
        c = calls[calls["lane"] == lane].sort_values("ts_us")
        if c.empty:
            continue
        cts = c["ts_us"].to_numpy()
        # Each launching call's kernel time (0 where it launched none), so that an operator's
        # is the sum over the calls inside it, as ``Series.sum`` adds them (NaN as 0).
        k_of_call = kernel_us.reindex(c["correlation"]).to_numpy(dtype=np.float64)
        k_of_call = np.where(np.isnan(k_of_call), 0.0, k_of_call)
        lows = np.searchsorted(cts, g["ts_us"].to_numpy(), "left").tolist()
        highs = np.searchsorted(cts, g["end_us"].to_numpy(), "right").tolist()
        for name, args, lo, hi in zip(g["name"], g["call_args"], lows, highs):
            if hi <= lo:
                continue
            key = (name, args)
            if key not in of_call:
                of_call[key] = _gemm_call(name, args)
            call = of_call[key]
            if call is None:
                continue
            k_us = float(k_of_call[lo:hi].sum())
            if k_us <= 0:
                continue
            flops, shapes, dtype = call
            rows.append({"op": name, "shapes": shapes, "dtype": dtype,
                         "flops": flops, "kernel_us": k_us})
    if not rows:
        return pd.DataFrame(columns=GEMM_COLUMNS)
    df = pd.DataFrame(rows).groupby(["op", "shapes", "dtype"], sort=False).agg(
        calls=("flops", "size"), flops=("flops", "sum"), kernel_us=("kernel_us", "sum")
    ).reset_index()
    df["tflops"] = df["flops"] / df["kernel_us"] / 1e6
    peak = [devices.peak_flops(device_name, t) for t in df["dtype"]]
    df["peak_tflops"] = [p / 1e12 if p else np.nan for p in peak]
    df["efficiency"] = df["tflops"] / df["peak_tflops"]
    df.insert(0, "rank", rank)
    return df.sort_values("flops", ascending=False, ignore_index=True)[GEMM_COLUMNS]
