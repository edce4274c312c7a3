"""Analyse a run directory (or any folder of Kineto traces) and write its report.

``analyze(path, options)`` (``options``: ``AnalysisOptions``, ``report/options.py``) runs the
analysis in named stages, each a function that returns a new value from the values before it
(none changes what it was given, except that the cross-rank stage lets go of each rank's raw
operations and own-clock timeline once their replacements exist, ``RankStage``):

1. **Ingest** (``inputs.gather`` → ``inputs.Inputs``): run.json, the trace files, the Flight
   Recorder dumps and the step timers, read and checked once; problems recorded, never fatal
   while a rank remains.
2. **Per rank** (``_per_rank`` → ``RankStage``; ``rank_work.rank_work`` in worker processes,
   ``engines.py``): each trace reduced to its small tables (timeline, operations); the event
   table never leaves the worker.
3. **Cross-rank**, here, on those small tables — clocks first, because every figure after
   them compares ranks: ``_instance_blocks`` (the collective-instance table,
   ``comm/instances``: Flight Recorder join, groups, dimensions; kept in pieces of a rank and
   a step and never put together, ``instance_blocks``; how it is matched across ranks decided
   from sums over its rows, ``comm/matching``) → ``_aligned`` → ``Aligned`` (matched, clock
   offsets applied to every rank's times and instances a step at a time, ``crossrank/clocks``;
   the collective and send/recv tables; per-dimension communication sets) → ``_step_tables``
   → ``StepTables`` (pipeline windows, the step breakdown and bubbles, ``timeline/breakdown``,
   ``pipeline/``) → ``records_of`` → ``Records`` (step-timer records and Flight Recorder
   verdicts, ``always_on.py``) → ``_whatif`` (each step's dependency graph, critical path and
   what-if savings, ``crossrank/``); the memory tables and snapshots (``memory_stage.py``).
4. **Findings** (``_findings``, ``report/findings``) from every value above, and the trust
   verdict (``analysis/trust/``: each rank's checks, the checks across ranks) whose failed
   checks mark the findings resting on them; bandwidth
   (``comm/bandwidth_report``) and the aligned timeline go into the ``Report``
   (``result.py``), its tables in the registry's groups (``report/tables.py``).
5. **Write**: ``Report.write(dir)`` stores every table of the registry as parquet and
   ``summary.json``, crash-safe (``crash_safe.py``; docs/report-format.md lists them,
   docs/metrics.md defines every number).

Without a usable trace — a run that failed or hung before its profiled steps, a folder of
PyTorch's own Flight Recorder dumps alone, a memory snapshot alone — the report is what the
rest says (``without_traces.py``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import pathlib
from typing import Mapping

import numpy as np
import pandas as pd

from meshscope.analysis.comm import bandwidth_report, dims, instances
from meshscope.analysis.crossrank import clocks, program, whatif
from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest import allocator, budgets
from meshscope.analysis.memory import gather as memory_gather
from meshscope.analysis.pipeline import bubble, schedule
from meshscope.analysis.records import steps as step_records
from meshscope.analysis.report import device_findings, engines, findings as findings_mod
from meshscope.analysis.report import inputs, instance_blocks, rank_work, without_traces
from meshscope.analysis.report.always_on import Records, records_of
from meshscope.analysis.report.memory_findings import memory_findings
from meshscope.analysis.report.memory_stage import memory_facts, memory_of
from meshscope.analysis.report.options import AnalysisOptions
from meshscope.analysis.rank_order import in_rank_order
from meshscope.analysis.report.result import Report
from meshscope.analysis.report import summary
from meshscope.analysis.report.model import REPORT_SCHEMA_VERSION
from meshscope.analysis.report import spill
from meshscope.analysis.report import table_parts
from meshscope.analysis.report import tables as report_tables
from meshscope.analysis.timeline import breakdown, segments
from meshscope.analysis.timeline.rank_timeline import RankTimeline
from meshscope.analysis.report import trust_verdict as verdict
from meshscope.analysis.trust import run_checks
from meshscope.collectors.run_info import RunInfo

__all__ = ["REPORT_SCHEMA_VERSION", "AnalysisOptions", "analyze"]


def _empty(columns) -> pd.DataFrame:
    return pd.DataFrame(columns=list(columns))


def analyze(path: pathlib.Path, options: AnalysisOptions | None = None, **fields) -> Report:
    """Analyse the traces under ``path`` (module docstring) as ``options`` say
    (``analysis/report/options.py``, field by field; None: the defaults). ``fields`` replace
    single options — ``analyze(path, warmup_steps=1)`` is
    ``analyze(path, AnalysisOptions(warmup_steps=1))`` — for the notebook and the tests."""
    options = AnalysisOptions.of(options, **fields)
    with _budgets_in_force(options.budgets):
        inp = inputs.select_flight(inputs.gather(path), options.fr_groups, options.fr_ranks)
        if not inp.trace_files:
            if not inp.has_dumps and (options.snapshots or inputs.find_snapshots(inp.path)):
                return without_traces.snapshots_only(inp, options)
            if inp.run is not None and inp.has_dumps:
                return without_traces.records_only(_with_problem(
                    inp, "no traces: the run ended before its profiled steps"),
                    options.warmup_steps)
            if inp.has_dumps:               # PyTorch's own Flight Recorder dumps, alone
                if not inp.flight.ranks:
                    raise InputError(inp.path, "no usable Flight Recorder dump: "
                                     + "; ".join(inp.problems))
                return without_traces.records_only(inp, options.warmup_steps)
            raise InputError(inp.path, "no trace files (*.json, *.json.gz) found"
                             + (" in traces/" if inp.run is not None else "")
                             + ("" if inp.run is not None else
                                ", nor Flight Recorder dumps (<prefix><rank>, as PyTorch "
                                "writes them)")
                             + "".join(f"; {p}" for p in inp.problems))
        layout_map = _layout_map(inp, options)
        store = spill.RankStore(options.cache_dir)
        try:
            stage = _per_rank(inp, _rank_options(inp, options), options, store)
            if not stage.results:
                if inp.has_dumps and inp.flight.ranks:
                    return without_traces.records_only(stage.inputs, options.warmup_steps)
                raise InputError(inp.path,
                                 "no usable trace: " + "; ".join(stage.inputs.problems))
            return _cross_rank(stage, layout_map, options)
        finally:
            store.close()


@contextlib.contextmanager
def _budgets_in_force(limits: budgets.Budgets | None):
    """``limits`` set in this process' environment (``budgets.ENV``) for the ``with`` block,
    the environment as it was afterwards; nothing changes when None."""
    if limits is None:
        yield
        return
    saved = budgets.environment()
    budgets.export(**dataclasses.asdict(limits))
    try:
        yield
    finally:
        budgets.set_environment(saved)


def _with_problem(inp: inputs.Inputs, problem: str) -> inputs.Inputs:
    """``inp`` with one more problem (a new value; ``inp`` is left as it is)."""
    return dataclasses.replace(inp, problems=[*inp.problems, problem])


def _layout_map(inp: inputs.Inputs, options: AnalysisOptions):
    """The process groups of ``options.layout`` / ``rank_order`` (None without a layout)."""
    try:
        return dims.LayoutMap.parse(options.layout, options.rank_order).groups() \
            if options.layout else None
    except ValueError as e:
        raise InputError(inp.path, str(e)) from None


def _rank_options(inp: inputs.Inputs, options: AnalysisOptions) -> rank_work.RankOptions:
    """What every rank's work needs (compiled patterns, the cache), sent with each trace."""
    try:
        patterns = options.patterns()
    except ValueError as e:
        raise InputError(inp.path, str(e)) from None
    return rank_work.RankOptions(
        comm_kernel_re=patterns.comm_kernel_re, rank_regex=patterns.rank_regex,
        cache_dir=options.cache_dir, step_annotation=patterns.step_annotation)


@dataclasses.dataclass(frozen=True)
class RankStage:
    """The per-rank stage's value: the results kept, in the order of the trace files, and the
    inputs with every problem and note of the per-rank work after their own.

    The cross-rank stage consumes ``results``: it lets go of each rank's raw operations and
    own-clock timeline once it has made their replacements (``rank_work.RankResult``), so
    that at 512 ranks they are never held twice."""
    inputs: inputs.Inputs
    results: list[rank_work.RankResult]
    # Where the results' large fields are kept (``spill.RankStore``); None: in memory.
    store: spill.RankStore | None = None


def _per_rank(inp: inputs.Inputs, opts: rank_work.RankOptions,
              options: AnalysisOptions, store: spill.RankStore | None = None) -> RankStage:
    """Stage 2: every trace reduced to its rank's small tables where it is read
    (``engines.map_ranks``); a file that failed is a problem, one whose identity loses to
    another's (``inputs.resolve_identities``) or whose timeline is implausible is left out.
    Each result is put in ``store`` as it arrives (``spill.py``): what this process holds is
    the results in flight, whatever the number of ranks."""
    problems, notes = list(inp.problems), list(inp.notes)
    results = []
    for _, result in engines.map_ranks(inp.trace_files, rank_work.rank_work, (opts,),
                                       engine=options.engine, scheduler=options.scheduler,
                                       workers=options.workers, progress=options.progress):
        if isinstance(result, str):
            problems.append(result)
        else:
            results.append(store.put(result) if store is not None else result)
            del result
    chosen = inputs.resolve_identities([r.identity for r in results], run=inp.run,
                                       problems=problems)
    kept = []
    for r in results:
        if r.identity.path not in chosen:
            continue
        problems.extend(r.problems)
        notes.extend(r.notes)
        if r.implausible:
            problems.append(f"{r.identity.path}: {r.implausible}; rank {r.rank} left out "
                            f"of the report")
            continue
        kept.append(r)
    notes.extend(rank_work.same_startup_steps(kept))
    return RankStage(dataclasses.replace(inp, problems=problems, notes=notes), kept, store)


def _cross_rank(stage: RankStage, layout_map, options: AnalysisOptions) -> Report:
    """Stage 3 and 4 (``_cross_rank_of``) on the instance table's pieces, whose folder is
    removed after (the report's tables are kept apart, ``table_parts``)."""
    ranks = sorted(r.rank for r in stage.results)
    blocks = _instance_blocks(stage.inputs, stage.results, layout_map, options)
    try:
        return _cross_rank_of(stage, blocks, ranks, options)
    finally:
        blocks.close()


def _cross_rank_of(stage: RankStage, blocks: instance_blocks.InstanceBlocks, ranks: list[int],
                   options: AnalysisOptions) -> Report:
    """One named step after another, each returning a new value: the matching plan →
    everything on the common clock → the per-step tables → the always-on records → the
    dependency graph's what-if → the findings → the Report (module docstring)."""
    inp, results = stage.inputs, stage.results
    trace_world = max((r.identity.world_size or 0 for r in results), default=0) or None
    matched = blocks.plan(ranks, world_size=inp.run.world_size if inp.run else None,
                          trace_world=trace_world)
    # One rank has nobody to wait for: no cross-rank graph (its exposed communication is
    # costed from its own timeline, device_findings).
    matchable = not matched.why_not and blocks.rows > 0 and len(ranks) > 1
    aligned = _aligned(results, blocks, ranks, matchable, stage.store)
    allocator.trim()        # what matching and aligning freed, given back (issue 51)
    tables = _step_tables(aligned.timelines, results, inp.run, ranks)
    recs = records_of(inp, options.warmup_steps)
    wi = _whatif(aligned, blocks, inp.run, recs.records) if matchable else None
    allocator.trim()
    replayed = wi.step_time_us if wi is not None and np.isfinite(wi.step_time_us) else None
    st = summary.step_time(recs.throughput_summary, replayed, tables.breakdown)
    resolution = wi.resolution_us if wi is not None else whatif.resolution(
        recs.records.noise_us,
        tables.breakdown["step"].nunique() if len(tables.breakdown) else 1)
    on_gpu = any(r.on_gpu for r in results)
    # The report's tables with rows per rank kept on disk from the stage that makes them to
    # the write (the largest: a row per instance and rank; the memory curve, ~5,000 rows a
    # device, as each rank's is read), the bandwidth table made a slice of the instance table
    # at a time (issue 51, ``table_parts``).
    kept = table_parts.PartStore(options.cache_dir)
    mem = memory_of(results, inp, options, kept, ROWS_PER_PART)
    run = inp.run
    world = run.world_size if run is not None else \
        max((r.identity.world_size or 0 for r in results), default=0) or None
    found = _findings(inp, tables, recs, aligned, wi,
                      step_us=st.us if st.us is not None else float("nan"),
                      resolution_us=resolution, on_gpu=on_gpu, memory=mem,
                      replicas=run.size("dp") if run is not None else world)
    expected = set(range(run.world_size)) if run is not None else set()
    trust = verdict.trust({r.rank: list(r.trust) for r in results}, run_checks.run_checks(
        ranks, world, tables.breakdown, blocks.counts(), aligned.offsets, st.us))
    found = verdict.with_caveats(found, trust)
    allocator.trim()        # what the findings and checks freed, before the Report is made
    inst = _cut_in_parts(blocks.frames(), kept, "instances", blocks.columns,
                         empty=blocks.empty_matched())
    bw = _bandwidth(inst, blocks.empty_matched(), aligned, kept)
    allocator.trim()
    bw_summary = bandwidth_report.bandwidth_summary(bw.parts, options.baseline)
    allocator.trim()

    def kept_table(table: pd.DataFrame, name: str) -> pd.DataFrame:
        return report_tables.on_disk(_in_parts(table, kept, name))
    groups = summary.Groups(
        steps=report_tables.StepTimeTables(
            breakdown=tables.breakdown, exposed_comm=tables.exposed_comm,
            operator_totals=kept_table(tables.operator_totals, "operator_totals"),
            trace_overlap=tables.trace_overlap,
            timeline=report_tables.on_disk(_cut_in_parts(
                segments.segment_frames(aligned.timelines, tables.windows,
                                        wi.charged if wi else []),
                kept, "timeline", segments.COLUMNS)),
            idle=tables.idle),
        records=recs.tables,
        pipeline=tables.pipeline,
        comm=report_tables.CommTables(
            instances=report_tables.on_disk(inst), collectives=aligned.collectives,
            clock_offsets=aligned.offsets, bandwidth=report_tables.on_disk(bw),
            bandwidth_summary=bw_summary),
        graph=report_tables.GraphTables(whatif=wi.table, critical_path=wi.critical_path,
                                        rank_waits=wi.savings) if wi
        else report_tables.GraphTables.empty(),
        gpu=dataclasses.replace(tables.gpu, kernel_totals=kept_table(
            tables.gpu.kernel_totals, "kernel_totals")),
        memory=report_tables.MemoryTables(**mem.tables))
    facts = summary.Facts(
        source=inp.path, run=run, ranks=ranks, missing_ranks=sorted(expected - set(ranks)),
        problems=[*inp.problems, *mem.problems],
        notes=[*inp.notes, *matched.notes, *aligned.notes,
               *device_findings.gemm_coverage_notes(tables.gpu)],
        device="gpu" if on_gpu or any(r.device_name for r in results) else "cpu",
        step_time=st, throughput=recs.throughput_summary, step_records=recs.records,
        cross_rank={"matchable": matchable, "why_not": matched.why_not,
                    "matched_on": matched.matched_on if matchable else None,
                    "noise_us": recs.records.noise_us,
                    "floor_us": wi.floor_us if wi is not None else None,
                    "resolution_us": resolution},
        straggler=wi.straggler if wi else None, imbalance=wi.imbalance if wi else None,
        findings=found, memory=memory_facts(mem), flight_recorder_ranks=list(inp.flight.ranks),
        environments=[r.environment for r in results], trust=trust)
    return Report.of(facts, groups, on_gpu)


# Rows of a report table made into one part of those kept on disk (``table_parts``): the
# bandwidth of this many instance rows is computed at a time. A part's numeric column is
# 512 kB, over the size the C library maps on its own and gives back when freed
# (``process_memory.MMAP_THRESHOLD_BYTES``), so a part read back and let go leaves no holes in
# the heap; it is also a row group of the written file (``table_parts.ROWS_PER_GROUP``).
ROWS_PER_PART = 65_536


def _in_parts(table: pd.DataFrame, store: table_parts.PartStore,
              name: str) -> table_parts.TableParts:
    """``table`` on disk in parts of ``ROWS_PER_PART`` rows."""
    out = store.table(name, list(table.columns))
    out.append(table.iloc[:0])
    for start in range(0, len(table), ROWS_PER_PART):
        out.append(table.iloc[start:start + ROWS_PER_PART])
    return out


def _cut_in_parts(frames, store: table_parts.PartStore, name: str,
                  columns: list[str], empty: pd.DataFrame | None = None) -> table_parts.TableParts:
    """The table of ``frames`` (in order; none: ``empty``, else a table of ``columns`` without
    rows) on disk in parts of ``ROWS_PER_PART`` rows as they come — the parts ``_in_parts``
    cuts the whole table into, without the whole table made first."""
    cut = store.cut(name, columns, ROWS_PER_PART, empty)
    for frame in frames:
        cut.add(frame)
    return cut.close()


def _bandwidth(inst: table_parts.TableParts, empty: pd.DataFrame, aligned: Aligned,
               store: table_parts.PartStore) -> table_parts.TableParts:
    """The bandwidth table (``comm/bandwidth_report``) of each part of the instance table
    (``ROWS_PER_PART`` rows; ``empty``: the table without rows), on disk in parts: its rows
    are each a function of its instance row and of the matched operation's, so the parts put
    together are the table made whole."""
    out = store.table("bandwidth", report_tables.COLUMNS["bandwidth"])
    out.append(bandwidth_report.bandwidth_table(empty, aligned.collectives, aligned.p2p))
    for part in inst.parts():
        out.append(bandwidth_report.bandwidth_table(part, aligned.collectives, aligned.p2p))
    return out


def _instance_blocks(inp: inputs.Inputs, results: list[rank_work.RankResult], layout_map,
                     options: AnalysisOptions) -> instance_blocks.InstanceBlocks:
    """The collective-instance table of every rank (``_instance_tables``) in pieces of a rank
    and a step (``instance_blocks``), each rank's times still on its own clock."""
    return instance_blocks.InstanceBlocks.collect(
        _instance_tables(results, inp, inp.run, layout_map), options.cache_dir)


@dataclasses.dataclass(frozen=True)
class Aligned:
    """Everything on the common clock (``crossrank/clocks``), before any cross-rank figure:
    the offsets, the instance table and its collective and point-to-point tables, each rank's
    timeline shifted with its communication split by dimension (``comm_by_dim``), and the
    notes that describe the alignment."""
    offsets: pd.DataFrame
    collectives: pd.DataFrame
    p2p: pd.DataFrame
    timelines: dict[int, RankTimeline]
    notes: list[str]


def _aligned(results: list[rank_work.RankResult], blocks: instance_blocks.InstanceBlocks,
             ranks: list[int], matchable: bool,
             store: spill.RankStore | None = None) -> Aligned:
    """The clock offsets (only where the instances matched), applied to every rank's
    timeline and to the instances (``blocks.align``: kept aligned, a step's rows at a time);
    each timeline's communication split by dimension from the rank's aligned instances
    (``dims.interval_sets``). The aligned timelines are kept in ``store`` when there is one
    (``spill.RankStore.timelines``), one rank's at a time."""
    hosts = {r.rank: r.meta.get("host_name") for r in results}
    offsets = blocks.clock_offsets(ranks, hosts) if matchable else _empty(clocks.COLUMNS)
    applied = clocks.applied_by_rank(offsets)
    collectives, p2p = blocks.align(offsets)

    def aligned_timelines():
        for r in results:     # each rank's timeline on the common clock replaces its own
            tl = r.timeline.shifted(applied.get(r.rank, 0.0))
            r.timeline = None
            by_op = dims.interval_sets(blocks.rank_rows(r.rank, dims.INTERVAL_COLUMNS),
                                       tl.waits, tl.wait_until) \
                if blocks.has_rows(r.rank) else {}
            yield r.rank, dataclasses.replace(tl, comm_by_dim=dims.by_dimension(by_op),
                                              comm_by_dim_op=by_op)
    timelines = store.timelines(aligned_timelines()) if store is not None else \
        dict(aligned_timelines())
    step_windows = [b - a for tl in timelines.values() for a, b in tl.steps.values()]
    return Aligned(offsets=offsets, collectives=collectives, p2p=p2p, timelines=timelines,
                   notes=clocks.describe(offsets, float(np.median(step_windows))
                                         if step_windows else None))


@dataclasses.dataclass(frozen=True)
class StepTables:
    """The per-step tables of the aligned timelines: each rank's pipeline window per step
    (``windows``; empty without pipeline parallelism), the step breakdown, its exposed
    communication per (dimension, op), the operators per step, idle, the GPU
    tables, the trace overlap, and the pipeline's tables (bubbles with the schedule replay's
    columns, microbatches, pipeline phases and stage imbalance)."""
    windows: dict
    breakdown: pd.DataFrame
    exposed_comm: pd.DataFrame
    operator_totals: pd.DataFrame
    idle: pd.DataFrame
    gpu: report_tables.GpuTables
    trace_overlap: pd.DataFrame
    pipeline: report_tables.PipelineTables


def _step_tables(timelines: dict[int, RankTimeline], results: list[rank_work.RankResult],
                 run: RunInfo | None, ranks: list[int]) -> StepTables:
    """Pipeline windows, the step breakdown, bubbles (``timeline/breakdown``, ``pipeline/``)."""
    pipelined = run is not None and run.pipeline_stages > 1
    windows = bubble.pipeline_windows(timelines, run) if pipelined else {}
    wide, long_rows, idle_rows = _breakdown_rows(timelines, windows)
    bd = pd.DataFrame(wide, columns=breakdown.COLUMNS)
    exposed = pd.DataFrame(long_rows, columns=breakdown.EXPOSED_COLUMNS)
    idle = pd.DataFrame(idle_rows, columns=breakdown.IDLE_COLUMNS)
    by_rank = sorted(results, key=lambda x: x.rank)
    gpus = [r.gpu for r in by_rank]         # each rank's read once (a spilled result's file)
    gpu = report_tables.GpuTables(**{
        name: _concat([g.get(name) for g in gpus], columns)
        for name, columns in report_tables.GPU_COLUMNS.items()})
    del gpus
    trace_ov = pd.DataFrame(sorted((r.trace_overlap for r in results), key=lambda o: o["rank"]))
    bub = bubble.bubble_table(timelines, windows, run)
    mb = schedule.microbatch_table(timelines, windows)
    if not bub.empty:
        replayed = schedule.replay(mb, bubble.pipeline_groups(run, ranks))
        bub = bub.merge(replayed, on=["rank", "step"], how="left")
    ops = _concat([r.operators for r in by_rank], report_tables.COLUMNS["operator_totals"])
    return StepTables(windows=windows, breakdown=bd, exposed_comm=exposed,
                      operator_totals=ops, idle=idle, gpu=gpu,
                      trace_overlap=trace_ov, pipeline=report_tables.PipelineTables(
                          bubbles=bub, microbatches=mb,
                          pipeline_phases=schedule.phase_table(mb, windows),
                          stage_imbalance=schedule.imbalance_table(mb)))


def _breakdown_rows(timelines: Mapping[int, RankTimeline], windows: dict
                    ) -> tuple[list, list, list]:
    """The rows of the step breakdown, its exposed communication and idle
    (``timeline/breakdown``), every rank's in rank order: one rank's timeline read at a time
    (``rank_order``), none held once done."""
    wide: list = []
    exposed: list = []
    idle: list = []
    for r, tl in in_rank_order(timelines):
        rows, exposed_rows = breakdown.step_tables(tl, windows.get(r))
        wide += rows
        exposed += exposed_rows
        idle += breakdown.idle_rows(tl, windows.get(r))
    return wide, exposed, idle


def _whatif(aligned: Aligned, blocks: instance_blocks.InstanceBlocks, run: RunInfo | None,
            records: step_records.StepRecords) -> whatif.WhatIf:
    """Each step's dependency graph (each rank's aligned rows of the step read from
    ``blocks``), its critical path, the what-if savings and the straggler (``crossrank/``);
    of the instances the what-if reads each match id's op and the bytes of the all-to-alls
    alone (``whatif.reference_scales``, expert parallelism: a key per instance row of every
    rank was ~3 MB a rank of 16,160 collectives, issue 51)."""
    graphs = program.step_graphs(aligned.timelines, blocks, aligned.collectives, aligned.p2p)
    return whatif.analyse(graphs, run, blocks.ops, blocks.a2a_bytes, records.noise_us)


def _findings(inp: inputs.Inputs, tables: StepTables, recs: Records, aligned: Aligned,
              wi: whatif.WhatIf | None, *, step_us: float, resolution_us: float,
              on_gpu: bool, memory: memory_gather.Memory,
              replicas: int | None) -> list[findings_mod.Finding]:
    """The ranked findings (``report/findings``, ``report/memory_findings``) from every
    stage's value."""
    run, records = inp.run, recs.records
    colls, p2p = aligned.collectives, aligned.p2p
    return findings_mod.findings(findings_mod.FindingInputs(
        step_us=step_us, noise_us=resolution_us, breakdown=tables.breakdown,
        bubbles=tables.pipeline.bubbles, schedule=run.schedule if run else None,
        stages=run.pipeline_stages if run else 1,
        microbatches=run.microbatches if run else 1,
        virtual_stages=run.virtual_stages if run else 1,
        straggler=wi.straggler if wi else None,
        savings=wi.savings if wi else _empty(whatif.SAVINGS_COLUMNS),
        imbalance=wi.imbalance if wi else None, dim_savings=wi.dim_savings if wi else {},
        dim_timing=_dim_timing(colls, p2p),
        hangs=recs.tables.flight_recorder, hang_causes=recs.tables.hang_causes,
        slow_steps=records.slow_steps,
        warmup_steps=records.warmup_steps,
        step_times=step_records.slowest_rank_per_step(inp.steps),
        median_step_us=records.median_step_us, on_gpu=on_gpu, idle=tables.idle,
        sync_calls=tables.gpu.sync_calls, kernels=tables.gpu.kernels,
        gemms=tables.gpu.gemms, collectives=colls,
        whatif_dims=_matched_dims(colls, p2p) if wi is not None else set(),
        memory=memory_findings(memory.tables["memory_devices"], memory.tables["memory_live"],
                               memory.snapshots, memory.stage_of, replicas=replicas),
        kernel_categories=tables.gpu.kernel_categories,
        graph_captures=sum(tl.graph_captures for tl in aligned.timelines.values()),
        graph_replays=sum(tl.graph_replays for tl in aligned.timelines.values())))


def _concat(tables: list, columns: list[str]) -> pd.DataFrame:
    """Every rank's rows of one GPU table (``columns`` in that order; empty when none)."""
    tables = [t for t in tables if t is not None and len(t)]
    if not tables:
        return _empty(columns)
    return pd.concat(tables, ignore_index=True)[columns]


# Instance rows made into one table at a time, whole ranks each: a table per rank cost 5 s of
# the cross-rank stage's 55 at 512 ranks of a few dozen rows (profiled), and the rows as
# Python dicts take about 1.3 kB each — 64 ranks of a 1.73M-event GPU trace (16,160
# collectives a rank) held a million of them at once, 21 MB a rank (issue 51). A table is made
# once its ranks' rows reach this count.
ROWS_PER_TABLE = 10_000


def _instance_tables(results: list[rank_work.RankResult], inp: inputs.Inputs, run,
                     layout_map):
    """The instance tables (``instances.finalize``) of whole ranks, a table once their rows
    reach ``ROWS_PER_TABLE``; a rank's raw operations are let go once its rows are made, so
    they are not held twice while every rank's are joined."""
    rows: list[dict] = []
    made = 0
    for r in results:
        rows += instances.finalize_rows(r.operations, rank=r.rank, meta=r.meta,
                                        timeline=r.timeline, run=run,
                                        flight=inp.flight, layout_map=layout_map)
        r.operations = None
        if len(rows) >= ROWS_PER_TABLE:
            yield instances.table_of(rows)
            rows, made = [], made + 1
    if rows or not made:
        yield instances.table_of(rows)


def _matched_dims(colls: pd.DataFrame, p2p: pd.DataFrame) -> set[str]:
    """The dimensions whose operations matched across ranks (the what-if replay covers them)."""
    return {str(d) for d in pd.concat([colls["dim"], p2p["dim"]]).dropna()}


def _dim_timing(colls: pd.DataFrame, p2p: pd.DataFrame) -> dict[str, dict]:
    """dimension → medians of its matched operations' transfer and completion after the last
    arrival, and its operations per step (the evidence of an exposed-communication finding)."""
    both = pd.concat([colls[["dim", "step", "transfer_us", "after_last_us"]],
                      p2p[["dim", "step", "transfer_us", "after_last_us"]]],
                     ignore_index=True)
    out = {}
    for dim, g in both.groupby("dim"):
        out[str(dim)] = {"transfer_us": float(g["transfer_us"].median()),
                         "after_last_us": float(g["after_last_us"].median()),
                         "ops_per_step": float(g.groupby("step").size().mean())}
    return out


