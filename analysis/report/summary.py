"""summary.json: what a report says, in one JSON document (schema in docs/report-format.md).

``summary_of(report)`` builds it from a ``Report``; every number in it is one of the report's
tables aggregated (means over profiled steps, medians over non-warm-up steps), never computed
anew. NaN and infinity are written as null.
"""
from __future__ import annotations

import datetime as _dt
import math

import pandas as pd

from meshscope.analysis.pipeline.schedule import imbalance_summary
from meshscope.analysis.report.model import choose_headline
from meshscope.analysis.timeline.breakdown import mean_window_us

REPORT_SCHEMA_VERSION = 3


#: The clock of every report table that holds points in time (the others hold durations):
#: one alignment (``crossrank.clocks``: each rank's ``clock_offsets.applied_us`` subtracted
#: once, in ``analyze``), and every reader takes these tables as they are.
TABLE_CLOCKS = {
    "instances": "aligned",            # µs on the reference rank's clock, offsets applied
    "collectives": "aligned",
    "bubbles": "step",                 # window_start_us: from the step's earliest start
    "critical_path": "step",           # µs from the step's earliest start, aligned clock
    "timeline": "step",
    "microbatches": "pipeline window",  # µs from that rank's pipeline window of the step
    "sync_calls": "own",               # the rank's own trace clock (per-rank GPU tables)
    "memory_steps": "own",             # start_us, end_us, the peaks' times
    "memory_devices": "own",           # peak_us
    "memory_curve": "own",
}


def step_times(report, throughput: dict) -> dict:
    """The three step times a report knows, each under its own name, and the headline.

    - ``step_time_timer_us``: the step timers' slowest rank per step, median over the
      non-warm-up steps (``throughput.step_time_us``; tokens/s and MFU are computed from it);
    - ``step_time_replayed_us``: the profiled steps' makespan replayed through the cross-rank
      dependency graph, mean over profiled steps (null without a graph);
    - ``window_us``: the longest rank's step window per profiled step, mean over profiled steps
      (what the breakdown bars add up to for that rank).

    ``step_time_us`` is the first known of timer, window, replayed — measured before modelled
    (``model.choose_headline``) — and ``step_time_source`` says which (``timer``, ``window``,
    ``replayed``; labels in ``vocabulary.STEP_TIME_SOURCES``)."""
    timer = clean(throughput.get("step_time_us")) if throughput else None
    replayed = clean(report.step_time_us) if len(report.graph.whatif) else None
    window = clean(mean_window_us(report.steps.breakdown))
    head, source = choose_headline(timer, replayed, window)
    return {"step_time_us": head, "step_time_source": source, "step_time_timer_us": timer,
            "step_time_replayed_us": replayed, "window_us": window}


def clean(x):
    """A JSON-safe value: numpy scalars unwrapped, NaN/inf → None, containers walked."""
    if hasattr(x, "item") and not isinstance(x, (list, dict, str)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if x is pd.NA or x is pd.NaT:
        return None
    return x


def records(df: pd.DataFrame | None) -> list[dict]:
    if df is None or df.empty:
        return []
    return [clean(row) for row in df.to_dict(orient="records")]


def _run(report) -> dict | None:
    run = report.run
    if run is None:
        return None
    return {"run_id": run.run_id, "layout_str": run.layout_str, "layout": dict(run.layout),
            "world_size": run.world_size, "schedule": run.schedule,
            "microbatches": run.microbatches, "virtual_stages": run.virtual_stages,
            "steps": run.steps, "profile_steps": list(run.profile_steps)
            if run.profile_steps else None, "status": run.status,
            "device": {"type": run.device.type, "name": run.device.name,
                       "peak_flops": run.device.peak_flops},
            "model": {"preset": run.model.preset, "n_params": run.model.n_params,
                      "flops_per_token": run.model.flops_per_token}}


def _top_kernels(kernels: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """Each rank's ``n`` kernels with the most time (the ``(other kernels)`` row left out)."""
    named = kernels[~kernels["name"].str.startswith("(other kernels")]
    return named.sort_values(["rank", "total_us"], ascending=[True, False]) \
        .groupby("rank").head(n)


def summary_of(report) -> dict:
    r = report
    bd, bubbles = r.steps.breakdown, r.pipeline.bubbles
    per_rank = bd.drop(columns=["step"]).groupby("rank").mean().reset_index() \
        if not bd.empty else bd
    stages = pd.DataFrame()
    if not bubbles.empty:
        extra = {"replayed_bubble_fraction": ("replayed_bubble_fraction", "mean")} \
            if "replayed_bubble_fraction" in bubbles else {}
        stages = bubbles.groupby(["stage"]).agg(
            bubble_fraction=("bubble_fraction", "mean"),
            theory_fraction=("theory_fraction", "first"),
            ranks=("rank", lambda s: sorted(set(int(x) for x in s))), **extra).reset_index()
    savings = r.graph.rank_waits
    rank_savings = [{"rank": int(s.rank), "saving_us": s.saving_us, "saving_pct": s.saving_pct,
                     "reference": s.reference, "wait_us": s.wait_us,
                     "wait_caused_us": s.wait_caused_us}
                    for s in savings.itertuples()] if len(savings) else []
    rec = r.step_records
    throughput = r.throughput_summary
    return clean({
        "schema_version": REPORT_SCHEMA_VERSION,
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": str(r.source),
        "run": _run(r),
        "device": r.device,
        "ranks": r.ranks,
        "missing_ranks": r.missing_ranks,
        "problems": r.problems,
        "notes": r.notes,
        "steps": sorted(int(s) for s in bd["step"].unique()) if not bd.empty else [],
        **step_times(r, throughput),
        "throughput": throughput,
        "per_rank_mean": records(per_rank),
        "trace_overlap": records(r.steps.trace_overlap),
        "pipeline_stages": records(stages),
        "stage_imbalance_measured": imbalance_summary(r.pipeline.stage_imbalance)
        if len(r.pipeline.stage_imbalance) else None,
        "stage_imbalance_without_straggler": r.imbalance,
        "clock_offsets": records(r.comm.clock_offsets),
        "table_clocks": TABLE_CLOCKS,
        "cross_rank": {**r.cross_rank, "straggler": r.straggler, "rank_savings": rank_savings},
        "warmup_steps": rec.warmup_steps,
        "slow_steps": rec.slow_steps,
        "hangs": records(r.records.flight_recorder),
        "findings": [f.to_dict() for f in r.findings],
        "bandwidth": records(r.comm.bandwidth_summary),
        "gpu_idle_per_rank_mean": records(
            r.steps.idle.drop(columns=["step"]).groupby("rank").mean().reset_index())
        if len(r.steps.idle) else [],
        "top_kernels": records(_top_kernels(r.gpu.kernels)),
        "memory": memory_summary(r),
    })


def memory_summary(report) -> dict:
    """summary.json's ``memory`` (docs/report-format.md): ``devices`` (the rows of
    ``memory_devices.parquet``: per rank and device, the peaks, where they fall, reserved −
    allocated there, the growth across steps, the device's memory where known), ``stages``
    (per pipeline stage, its largest peak and which rank holds it), ``snapshots`` (per memory
    snapshot and device: reserved, allocated, free in segments, the largest moment, the
    out-of-memory record) and ``device_memory_bytes`` (``--device-memory``, or null)."""
    extra = report.memory_facts or {}
    return {"devices": records(report.memory.memory_devices),
            "stages": extra.get("stages", []), "snapshots": extra.get("snapshots", []),
            "device_memory_bytes": extra.get("device_memory_bytes")}
