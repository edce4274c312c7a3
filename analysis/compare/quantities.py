"""The named quantities of a report that a comparison — and its gate — speak of.

Each name is one figure of one run, read from the report's own tables (nothing is measured
again), with the per-step values it is the mean or median of, and the run's step-to-step
noise of it: ``noise`` = 1.4826 × the median absolute deviation of those per-step values
(``analysis.records.steps.noise``, the estimator of the run's own ``noise_us``; unknown with
fewer than three steps). The names, their unit and where each comes from:

============================ ====== ==========================================================
name                         unit   value (per-step values)
============================ ====== ==========================================================
step_time                    µs     the report's headline step time (summary ``step_time_us``:
                                    the step timer, else the profiled window, else the
                                    replayed makespan); per step: the timer's slowest rank of
                                    each non-warm-up step, the replayed makespan or the
                                    longest window of each profiled step. Its noise is the
                                    report's ``noise_us`` where the headline is the timer
window                       µs     the step window, mean over ranks (breakdown)
compute                      µs     compute, mean over ranks (breakdown ``compute_us``)
comm, overlapped_comm        µs     all / hidden communication, mean over ranks
exposed_comm                 µs     exposed communication, mean over ranks
exposed_comm.<dim>           µs     of one dimension (pp, tp, cp, ep, dp, unknown)
exposed_comm.<dim>.<op>      µs     of one operation of it (``exposed_comm`` table)
bubble, other, idle          µs     pipeline bubble, other device work (copies), idle
idle.<cause>                 µs     GPU idle by cause (dataloader, sync, wait_rank, launch,
                                    cpu, queued, other; ``idle`` table)
overlap_pct                  %      communication hidden behind compute, mean over ranks
kernels.<category>           µs     GPU kernel time of one category (gemm, attention,
                                    convolution, norm/elementwise, reduction, communication,
                                    memcpy/memset, other) per step, mean over ranks
busbw.<op>, busbw.<dim>.<op> GB/s   median bus bandwidth of the operation's instances
tokens_per_s                 1/s    the step timers' tokens per second (median)
mfu_pct                      %      model FLOPs utilisation (median; needs the device peak)
peak_memory                  bytes  the step timers' peak memory: the largest over ranks and
                                    steps (CUDA: allocated; CPU: resident set); its noise from
                                    the non-warm-up steps' peaks. Without step timers, the
                                    traces' peak allocated (below)
peak_allocated,              bytes  the traces' allocator peaks (``[memory]`` events,
peak_reserved                       ``memory_steps``): the largest over ranks and profiled
                                    steps on each rank's main device (its GPU, else the CPU)
============================ ====== ==========================================================

Every time is per step (µs), means over profiled steps of the mean over the analysed ranks.
``compute + exposed_comm + bubble + other + idle = window`` on every step (the breakdown's
identity, ``analysis/timeline/breakdown.py``), so the parts of a difference add up.
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pandas as pd

from meshscope.analysis.gpu.kernels import CATEGORIES as KERNEL_CATEGORIES
from meshscope.analysis.records.steps import noise as robust_noise
from meshscope.analysis.timeline.breakdown import DIM_ORDER, window_per_step_us
from meshscope.vocabulary import COMM_DIMS, IDLE_CAUSES, OPS

from .sides import Side

US, BYTES, PCT, RATE, GBPS = "us", "bytes", "pct", "per_s", "gbps"

#: The plain names and their units; the families with a dot are matched by ``unit_of``.
PLAIN: dict[str, str] = {
    "step_time": US, "window": US, "compute": US, "comm": US, "overlapped_comm": US,
    "exposed_comm": US, "bubble": US, "other": US, "idle": US, "overlap_pct": PCT,
    "tokens_per_s": RATE, "mfu_pct": PCT, "peak_memory": BYTES,
    "peak_allocated": BYTES, "peak_reserved": BYTES,
}
#: The breakdown column of each plain time. ``window`` is the mean over ranks of the step
#: window, not the report's window (summary ``window_us``, the longest rank's per step): the
#: parts, means over ranks too, add up to it exactly, which a difference's parts need.
_BREAKDOWN = {"window": "window_us", "compute": "compute_us", "comm": "comm_us",
              "overlapped_comm": "overlapped_comm_us", "exposed_comm": "exposed_comm_us",
              "bubble": "bubble_us", "other": "other_us", "idle": "idle_us",
              "overlap_pct": "overlap_pct"}
_OP_WORD = r"[a-z_]+"
FAMILIES: tuple[tuple[str, re.Pattern, str], ...] = (
    ("exposed_comm.<dim>", re.compile(rf"exposed_comm\.({'|'.join(DIM_ORDER)})"), US),
    ("exposed_comm.<dim>.<op>",
     re.compile(rf"exposed_comm\.({'|'.join(DIM_ORDER)})\.({_OP_WORD})"), US),
    ("idle.<cause>", re.compile(rf"idle\.({'|'.join(IDLE_CAUSES)})"), US),
    ("kernels.<category>", re.compile(
        r"kernels\.(" + "|".join(re.escape(c) for c in KERNEL_CATEGORIES) + ")"), US),
    ("busbw.<op>", re.compile(rf"busbw\.({'|'.join(OPS)})"), GBPS),
    ("busbw.<dim>.<op>", re.compile(rf"busbw\.({'|'.join(COMM_DIMS)})\.({'|'.join(OPS)})"),
     GBPS),
)


#: What each ``<word>`` of a family's name may be.
WORDS: dict[str, tuple[str, ...]] = {
    "<dim>": DIM_ORDER, "<cause>": IDLE_CAUSES, "<category>": KERNEL_CATEGORIES, "<op>": OPS}


def unit_of(name: str) -> str | None:
    """The unit of the quantity ``name`` (``US``, ``BYTES``, ``PCT``, ``RATE``, ``GBPS``), or
    None when no quantity has that name."""
    if name in PLAIN:
        return PLAIN[name]
    for _, rx, unit in FAMILIES:
        if rx.fullmatch(name):
            return unit
    return None


def valid_names() -> list[str]:
    """Every plain name and the form of every family, for a message."""
    return list(PLAIN) + [form for form, _, _ in FAMILIES]


@dataclasses.dataclass(frozen=True)
class Measure:
    """One quantity on one side: its ``value``, the per-step values behind it and their
    ``noise`` (None where fewer than three steps give none)."""
    name: str
    unit: str
    value: float
    per_step: tuple[float, ...]
    noise: float | None


def _noise(values) -> float | None:
    v = robust_noise(list(values))
    return None if math.isnan(v) else v


def _per_step_mean(df: pd.DataFrame, column: str, ranks: int | None = None) -> pd.Series:
    """step → the mean over ranks of ``column`` (over ``ranks`` ranks when given: a rank
    without a row counts 0)."""
    if df.empty:
        return pd.Series(dtype=float)
    g = df.groupby("step")[column]
    return g.sum() / ranks if ranks else g.mean()


def _from_steps(name: str, unit: str, per_step: pd.Series, value: float | None = None
                ) -> Measure | None:
    per_step = per_step.dropna()
    if per_step.empty:
        return None
    values = tuple(float(x) for x in per_step.to_numpy())
    return Measure(name, unit, float(np.mean(values)) if value is None else float(value),
                   values, _noise(values))


def _ranks_per_step(side: Side) -> pd.Series:
    bd = side.table("breakdown")
    return bd.groupby("step")["rank"].nunique() if len(bd) else pd.Series(dtype=float)


def unattributed(side: Side, name: str) -> str | None:
    """Why ``side`` cannot tell ``name``'s dimension apart, for a quantity of one named
    dimension (``exposed_comm.dp``, ``exposed_comm.tp.all_reduce``); None where it can. A run
    whose communication carries no mesh names files it under ``unknown``: its 0 ms of dp is
    then not a measurement — the dp time may be inside ``unknown``. A dimension the run's
    layout does not have (run.json: size 1) is a measured 0 all the same."""
    head, _, rest = name.partition(".")
    dim = rest.partition(".")[0]
    if head != "exposed_comm" or not dim or dim == "unknown":
        return None
    typed = side.summary
    layout = typed.run.layout if typed.run is not None else {}
    if layout.get(dim) == 1:
        return None
    unknown = any(b.dim == "unknown" for b in typed.bandwidth) or \
        any((m.exposed_comm_unknown_us or 0.0) > 0 for m in typed.per_rank_mean)
    if not unknown:
        return None
    return (f"its communication carries no mesh names, so none of it can be told to be "
            f"{dim}: it is filed under 'unknown' (analyze it with the job's --layout, and "
            f"--rank-order where its ranks are laid out otherwise, to attribute it)")


def measure(side: Side, name: str) -> Measure | None:
    """The quantity ``name`` on ``side`` (module docstring); None when the side does not
    measure it (no step timers for tokens/s, no GPU for idle causes…). A dimension or op
    the run simply does not have is 0, not unknown. ValueError for a name no quantity has."""
    unit = unit_of(name)
    if unit is None:
        raise ValueError(f"{name}: not a quantity")
    if name == "step_time":
        return _step_time(side)
    if name in _BREAKDOWN:
        return _from_steps(name, unit, _per_step_mean(side.table("breakdown"), _BREAKDOWN[name]))
    if name in ("peak_allocated", "peak_reserved"):
        return _allocator_peak(side, name)
    if name == "peak_memory":
        return _timers(side, name, unit) or _allocator_peak(side, "peak_allocated", name)
    if name in ("tokens_per_s", "mfu_pct"):
        return _timers(side, name, unit)
    head, _, rest = name.partition(".")
    if head == "exposed_comm":
        dim, _, op = rest.partition(".")
        bd = side.table("breakdown")
        if not op:
            return _from_steps(name, unit, _per_step_mean(bd, f"exposed_comm_{dim}_us"))
        ex = side.table("exposed_comm")
        if not len(bd):
            return None
        mine = ex[(ex["dim"] == dim) & (ex["op"] == op)]
        per = mine.groupby("step")["exposed_us"].sum().reindex(
            sorted(bd["step"].unique()), fill_value=0.0) / _ranks_per_step(side)
        return _from_steps(name, unit, per)
    if head == "idle":
        idle = side.table("idle")
        return _from_steps(name, unit, _per_step_mean(idle, f"idle_{rest}_us")) \
            if len(idle) else None
    if head == "kernels":
        kt = side.table("kernel_totals")
        if not side.on_gpu or not side.has_table("kernel_totals"):
            return None
        gpu_ranks = kt["rank"].nunique() or 1
        steps = side.steps
        per = kt[kt["category"] == rest].groupby("step")["total_us"].sum().reindex(
            steps, fill_value=0.0) / gpu_ranks
        return _from_steps(name, unit, per)
    if head == "busbw":
        dim, _, op = rest.partition(".") if rest.count(".") else (None, "", rest)
        bw = side.table("bandwidth")
        mine = bw[(bw["op"] == op) & (bw["dim"] == dim if dim else True)]
        mine = mine[mine["busbw_gbps"].notna()]
        if mine.empty:
            return None
        per = mine.groupby("step")["busbw_gbps"].median()
        return _from_steps(name, unit, per, value=float(mine["busbw_gbps"].median()))
    raise ValueError(f"{name}: not a quantity")        # unreachable: unit_of matched a family


def _step_time(side: Side) -> Measure | None:
    st = side.summary.step_time
    if st.us is None:
        return None
    if st.source == "timer":
        tp = side.table("throughput")
        warm = set(side.summary.warmup_steps)
        per = tp[~tp["step"].isin(warm)]["step_time_us"] if len(tp) else pd.Series(dtype=float)
        values = tuple(float(x) for x in per.dropna())
        noise = side.summary.cross_rank.noise_us
        return Measure("step_time", US, st.us, values,
                       noise if noise is not None else _noise(values))
    if st.source == "replayed":
        wi = side.table("whatif")
        per = wi.groupby("step")["makespan_us"].first() if len(wi) else pd.Series(dtype=float)
    else:
        per = window_per_step_us(side.table("breakdown"))
    values = tuple(float(x) for x in per.dropna())
    return Measure("step_time", US, st.us, values, _noise(values))


def _timers(side: Side, name: str, unit: str) -> Measure | None:
    """tokens/s, MFU and peak memory from the step timers' per-step table (``throughput``),
    non-warm-up steps; the value is the summary's median for the first two (shown only
    beside the timer's step time) and the largest step for peak memory."""
    tp = side.table("throughput")
    if tp.empty:
        return None
    rest = tp[~tp["step"].isin(set(side.summary.warmup_steps))]
    rest = rest if len(rest) else tp
    if name == "peak_memory":
        def known(t):
            return t.set_index("step")["peak_memory_bytes"].astype("Float64") \
                .astype(float).dropna()
        every, per = known(tp), known(rest)
        return _from_steps(name, unit, per, value=float(every.max())) if len(every) else None
    value = side.summary.tokens_per_s if name == "tokens_per_s" else side.summary.mfu_pct
    if value is None:
        return None
    return _from_steps(name, unit, rest.set_index("step")[name], value=value)


def main_device_steps(side: Side) -> pd.DataFrame:
    """``memory_steps`` rows of each rank's main device: its GPU (``cuda:N``, ``hip:N``) where
    the rank's trace records one, else its CPU — the device a reader asks "will it fit" of."""
    ms = side.table("memory_steps")
    if ms.empty:
        return ms
    gpu = ~ms["device"].astype(str).str.startswith("cpu")
    has_gpu = ms.assign(gpu=gpu).groupby("rank")["gpu"].transform("any")
    return ms[gpu == has_gpu]


def _allocator_peak(side: Side, column: str, name: str | None = None) -> Measure | None:
    """The largest allocator peak (``peak_allocated_bytes`` / ``peak_reserved_bytes``) over
    ranks per profiled step, on each rank's main device; the value is the largest step."""
    ms = main_device_steps(side)
    col = f"{column}_bytes"
    if ms.empty or ms[col].isna().all():
        return None
    per = ms.groupby("step")[col].max().dropna().astype(float)
    return _from_steps(name or column, BYTES, per, value=float(per.max()))

