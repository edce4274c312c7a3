"""summary.json: what a report says, built once as a typed ``model.Summary``.

``build(facts, tables)`` makes it inside ``analyze``: every number in it is one of the report's
tables aggregated (means over profiled steps, medians over non-warm-up steps), never computed
anew; the findings, computed from those numbers, are part of it. ``codec.encode`` writes it
(``Report.write``), ``reader.read_summary`` reads it back — today's and every older schema —
into the same record; ``summary_schema.schema()`` is its JSON Schema, generated from the record
(docs/summary.schema.json). NaN and infinity are written as null.

The headline step time is chosen once, here (``step_time``), from the three step times a run
may have: the step timers', the profiled window and the replayed makespan.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import pathlib
from typing import Any

import pandas as pd

from meshscope.analysis.pipeline.schedule import imbalance_summary
from meshscope.analysis.records.steps import StepRecords
from meshscope.analysis.report import codec, model
from meshscope.analysis.report.model import (REPORT_SCHEMA_VERSION, Finding, StepTime, Summary,
                                             choose_headline)
from meshscope.analysis.report.tables import (CommTables, GpuTables, GraphTables, MemoryTables,
                                              PipelineTables, RecordTables, StepTimeTables)
from meshscope.analysis.timeline.breakdown import mean_window_us, rank_means
from meshscope.collectors.run_info import RunInfo

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


def step_time(throughput: dict, replayed_us: float | None,
              breakdown: pd.DataFrame) -> StepTime:
    """The three step times a report knows, each under its own name, and the headline — the
    one place their inputs are gathered (the findings' cost base and summary.json read it):

    - ``timer_us``: the step timers' slowest rank per step, median over the non-warm-up steps
      (``throughput.step_time_us``; tokens/s and MFU are computed from it);
    - ``replayed_us``: the profiled steps' makespan replayed through the cross-rank dependency
      graph, mean over profiled steps (None without a graph);
    - ``window_us``: the longest rank's step window per profiled step, mean over profiled steps
      (``breakdown.mean_window_us``: what the breakdown bars add up to for that rank).

    The headline is the first known of timer, window, replayed — measured before modelled
    (``model.choose_headline``); ``source`` says which (labels in
    ``vocabulary.STEP_TIME_SOURCES``)."""
    timer = clean(throughput.get("step_time_us")) if throughput else None
    replayed = clean(replayed_us)
    window = clean(mean_window_us(breakdown))
    head, source = choose_headline(timer, replayed, window)
    return StepTime(head, source, timer, replayed, window)


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


def _typed(tp: Any, value: Any, place: str) -> Any:
    """``value`` (cleaned) as ``tp``, strictly: a key the record does not declare, or a value
    of the wrong type, is a bug of the analysis (``codec.CodecError`` naming the place)."""
    return codec.decode(tp, clean(value), strict=True, path=f"$.{place}")


def rows(tp: type, df: pd.DataFrame | None, place: str) -> list:
    """Each row of ``df`` as a ``tp`` record (its columns are the record's fields)."""
    if df is None or df.empty:
        return []
    return [_typed(tp, row, f"{place}[{i}]")
            for i, row in enumerate(df.to_dict(orient="records"))]


def _run(run: RunInfo | None) -> model.RunFacts | None:
    if run is None:
        return None
    return model.RunFacts(
        run_id=run.run_id, layout_str=run.layout_str, layout=dict(run.layout),
        world_size=run.world_size, schedule=run.schedule, microbatches=run.microbatches,
        virtual_stages=run.virtual_stages, steps=run.steps,
        profile_steps=list(run.profile_steps) if run.profile_steps else None,
        status=run.status,
        device=model.RunDevice(run.device.type, run.device.name, clean(run.device.peak_flops)),
        model=model.RunModel(run.model.preset, clean(run.model.n_params),
                             clean(run.model.flops_per_token)))


def _top_kernels(kernels: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """Each rank's ``n`` kernels with the most time (the ``(other kernels)`` row left out)."""
    named = kernels[~kernels["name"].str.startswith("(other kernels")]
    return named.sort_values(["rank", "total_us"], ascending=[True, False]) \
        .groupby("rank").head(n)


def _stages(bubbles: pd.DataFrame) -> pd.DataFrame:
    """Per pipeline stage: the bubble fraction, mean over its ranks and steps, the closed form,
    its ranks and the replayed fraction."""
    if bubbles.empty:
        return bubbles
    if "replayed_bubble_fraction" not in bubbles:
        bubbles = bubbles.assign(replayed_bubble_fraction=math.nan)
    return bubbles.groupby(["stage"]).agg(
        bubble_fraction=("bubble_fraction", "mean"),
        theory_fraction=("theory_fraction", "first"),
        ranks=("rank", lambda s: sorted(set(int(x) for x in s))),
        replayed_bubble_fraction=("replayed_bubble_fraction", "mean")).reset_index()


def _gpu_idle(idle: pd.DataFrame) -> pd.DataFrame:
    """Per rank, its GPU idle by cause, mean over the profiled steps; its total is the
    breakdown's ``idle_us`` (written once, in ``per_rank_mean``)."""
    return rank_means(idle).reset_index().drop(columns=["idle_us"], errors="ignore")


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the analysis knows besides its tables, for ``build``."""
    source: pathlib.Path
    run: RunInfo | None
    device: str                       # "gpu" | "cpu"
    ranks: list[int]
    missing_ranks: list[int]
    problems: list[str]
    notes: list[str]
    step_time: StepTime
    throughput: dict                  # records.steps.throughput_summary
    step_records: StepRecords
    cross_rank: dict                  # matchable, why_not, matched_on, noise, floor, resolution
    straggler: dict | None            # crossrank.whatif's straggler
    imbalance: dict | None            # crossrank.whatif's stage balance without it
    findings: list[Finding]
    memory: dict                      # memory_stage.memory_facts: stages, snapshots, memory
    flight_recorder_ranks: list[int]  # the ranks whose Flight Recorder dump was read
    environments: list[dict] = dataclasses.field(default_factory=list)  # rank_work's, per rank
    trust: model.Trust | None = None  # analysis/report/trust_verdict.trust; None: nothing was checked


@dataclasses.dataclass(frozen=True)
class Groups:
    """The report's table groups: what ``build`` reads, and the first fields of a ``Report``."""
    steps: StepTimeTables
    records: RecordTables
    pipeline: PipelineTables
    comm: CommTables
    graph: GraphTables
    gpu: GpuTables
    memory: MemoryTables


def build(facts: Facts, t: Groups) -> Summary:
    """The report's ``Summary`` (module docstring) from its facts and tables."""
    bd = t.steps.breakdown
    st = facts.step_time
    savings = t.graph.rank_waits[["rank", "saving_us", "saving_pct", "reference", "wait_us",
                                  "wait_caused_us"]] if len(t.graph.rank_waits) else None
    measured = imbalance_summary(t.pipeline.stage_imbalance) \
        if len(t.pipeline.stage_imbalance) else None
    return Summary(
        schema_version=REPORT_SCHEMA_VERSION,
        generated=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        source=str(facts.source), run=_run(facts.run), device=facts.device,
        environment=environment(facts.environments, facts.run),
        ranks=list(facts.ranks), missing_ranks=list(facts.missing_ranks),
        problems=list(facts.problems), notes=list(facts.notes),
        steps=sorted(int(s) for s in bd["step"].unique()) if not bd.empty else [],
        step_time_us=st.us, step_time_source=st.source, step_time_timer_us=st.timer_us,
        step_time_replayed_us=st.replayed_us, window_us=st.window_us,
        throughput=_typed(model.Throughput, facts.throughput or
                          {"step_time_us": None, "tokens_per_s": None, "mfu_pct": None,
                           "steps": []}, "throughput"),
        per_rank_mean=rows(model.RankMean, rank_means(bd).reset_index(), "per_rank_mean"),
        trace_overlap=rows(model.TraceOverlap, t.steps.trace_overlap, "trace_overlap"),
        pipeline_stages=rows(model.Stage, _stages(t.pipeline.bubbles), "pipeline_stages"),
        stage_imbalance_measured=None if measured is None else
        _typed(model.StageImbalance, measured, "stage_imbalance_measured"),
        stage_imbalance_without_straggler=None if facts.imbalance is None else
        _typed(model.ReplayedImbalance, facts.imbalance, "stage_imbalance_without_straggler"),
        clock_offsets=rows(model.ClockOffset, t.comm.clock_offsets, "clock_offsets"),
        table_clocks=dict(TABLE_CLOCKS),
        cross_rank=_cross_rank(facts, savings),
        warmup_steps=list(facts.step_records.warmup_steps),
        slow_steps=list(facts.step_records.slow_steps),
        hangs=rows(model.Hang, t.records.flight_recorder, "hangs"),
        flight_recorder_ranks=sorted(int(r) for r in facts.flight_recorder_ranks),
        hang_causes=rows(model.HangCause, t.records.hang_causes, "hang_causes"),
        findings=list(facts.findings),
        bandwidth=rows(model.BandwidthRow, t.comm.bandwidth_summary, "bandwidth"),
        gpu_idle_per_rank_mean=rows(model.GpuIdle, _gpu_idle(t.steps.idle),
                                    "gpu_idle_per_rank_mean"),
        top_kernels=rows(model.TopKernel, _top_kernels(t.gpu.kernels), "top_kernels"),
        memory=model.MemorySummary(
            devices=rows(model.MemoryDevice, t.memory.memory_devices, "memory.devices"),
            stages=_typed(list[model.MemoryStage], facts.memory.get("stages", []),
                          "memory.stages"),
            snapshots=_typed(list[model.MemorySnapshot], facts.memory.get("snapshots", []),
                             "memory.snapshots"),
            device_memory_bytes=clean(facts.memory.get("device_memory_bytes"))),
        trust=_clean_trust(facts.trust))


def _clean_trust(t: model.Trust | None) -> model.Trust | None:
    """``t`` with its numbers JSON-safe (numpy scalars unwrapped, NaN as None), checked
    against the record as any other field is."""
    return None if t is None else _typed(model.Trust, codec.encode(t), "trust")


def environment(per_rank: list[dict], run: RunInfo | None) -> model.Environment:
    """The run's ``Environment``: each field's distinct values over the ranks
    (``rank_work.environment_of``), sorted; the world size from run.json where the traces do
    not say it, the torch version from run.json (traces do not record it)."""
    def values(key: str) -> list:
        return sorted({e[key] for e in per_rank if e.get(key) is not None}, key=str)
    worlds = values("world_size") or ([run.world_size] if run is not None else [])
    torch = run.versions.get("torch") if run is not None else None
    return model.Environment(
        devices=values("device"), device_counts=values("device_count"), world_sizes=worlds,
        backends=values("backend"), nccl_versions=values("nccl_version"),
        cuda_runtime_versions=values("cuda_runtime_version"),
        cuda_driver_versions=values("cuda_driver_version"),
        torch_versions=[str(torch)] if torch else [],
        profiler_settings=values("profiler_settings"),
        step_definitions=values("step_definition"))


def _cross_rank(facts: Facts, savings: pd.DataFrame | None) -> model.CrossRank:
    cr = facts.cross_rank
    return model.CrossRank(
        matchable=bool(cr["matchable"]), why_not=[str(w) for w in cr["why_not"]],
        matched_on=cr.get("matched_on"), noise_us=clean(cr.get("noise_us")),
        floor_us=clean(cr.get("floor_us")), resolution_us=clean(cr.get("resolution_us")),
        straggler=None if facts.straggler is None else
        _typed(model.Straggler, facts.straggler, "cross_rank.straggler"),
        rank_savings=rows(model.RankSaving, savings, "cross_rank.rank_savings"))


def document(summary: Summary) -> dict:
    """summary.json's document of ``summary`` (``codec.encode``; the findings' evidence may
    hold numpy scalars and NaN, written as numbers and null)."""
    return clean(codec.encode(summary))
