"""The per-rank stage of the analysis: one trace in, that rank's small tables out.

``rank_work(path, options)`` runs where the trace is read — an ingest worker process, or a
Dask worker — and returns a ``RankResult``: the rank's identity, its timeline (interval sets,
step windows, microbatch spans, wait regions), the operations the trace shows
(``analysis.comm.instances.extract``: the instance table's rows before the cross-rank stage
joins them to the Flight Recorder and gives them groups and dimensions), its whole-trace
overlap, its memory tables (``analysis/memory/rank_memory.py``) and the problems met. The event table itself never leaves the worker, so the
cross-rank stage holds small tables only, however many ranks there are.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

import numpy as np
import pandas as pd

from meshscope.analysis.comm import instances
from meshscope.analysis.gpu import host_activity, kernels, step_categories
from meshscope.analysis.gpu import idle as gpu_idle
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import parts, pool, validate
from meshscope.analysis.memory import rank_memory
from meshscope.analysis.report import tables as report_tables
from meshscope.analysis.report.inputs import TraceIdentity, identity
from meshscope.analysis.timeline import breakdown, operators
from meshscope.analysis.timeline import rank_timeline as timeline
from meshscope.analysis.timeline import step_windows
from meshscope.analysis.trust import rank_checks
from meshscope.analysis.trust.measured import Measured


@dataclasses.dataclass(frozen=True)
class RankOptions:
    """What every rank's work needs to know (sent to the workers with each trace)."""
    comm_kernel_re: re.Pattern | None = None
    rank_regex: re.Pattern | None = None
    cache_dir: pathlib.Path | None = None
    step_annotation: re.Pattern | None = None


@dataclasses.dataclass
class RankResult:
    identity: TraceIdentity
    on_gpu: bool
    # The cross-rank stage sets ``timeline`` and ``operations`` to None once it has replaced
    # them (the aligned timeline, the instance table), so they are not held twice.
    timeline: timeline.RankTimeline | None
    trace_overlap: dict
    operations: pd.DataFrame | None  # instances.RAW_COLUMNS
    meta: dict                      # instances.small_meta of the trace
    problems: list[str]
    implausible: str | None
    # GPU ranks: the tables of ``analysis/gpu/`` (``report_tables.GPU``); empty on CPU-only traces.
    gpu: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    # The host operators per profiled step (``timeline/operators.py``).
    operators: pd.DataFrame | None = None
    # The rank's memory tables (``analysis/memory/rank_memory.py``); empty without [memory]
    # events.
    memory: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)
    # The device the trace's deviceProperties name (``device_name``), None without one.
    device_name: str | None = None
    # What the rank ran on and how it was recorded (``environment_of``).
    environment: dict = dataclasses.field(default_factory=dict)
    # The checks of its trace (``analysis/trust/rank_checks.py``), passed or not.
    trust: list[Measured] = dataclasses.field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.identity.rank


def rank_work(path: pathlib.Path, opts: RankOptions) -> RankResult:
    """The per-rank stage for the trace at ``path``; InputError when it cannot be read.

    Once the steps are known (``step_windows.step_windows``), the tables that need nothing else
    of the timeline (``_beside_timeline``: the operations, the memory tables, the operators,
    the trust checks, the kernel tables) are made beside the rest of the timeline — in a
    forked copy of this process when this process reads one large trace on every core
    (``parts.on_cores``, ``pool.Beside``), else after it here. The same functions of the same
    table either way."""
    trace = ingest.load_trace(path, comm_kernel_re=opts.comm_kernel_re,
                              rank_regex=opts.rank_regex, cache_dir=opts.cache_dir)
    steps = step_windows.step_windows(trace, step_annotation=opts.step_annotation)
    beside = pool.Beside(_beside_timeline, trace, steps) \
        if parts.has_cores() and len(trace.events) >= BESIDE_EVENTS else None
    tl = timeline.build(trace, step_annotation=opts.step_annotation, steps_of=steps)
    notes = list(getattr(trace, "notes", []) or [])
    if tl.window_source == "trace":
        notes.append(f"rank {trace.rank}: the trace has no ProfilerStep ranges"
                     + (f" and no range matches --step-annotation "
                        f"{opts.step_annotation.pattern!r}" if opts.step_annotation else "")
                     + ": the whole trace is analysed as one window (step 0)")
    elif tl.window_source == "annotation":
        notes.append(f"rank {trace.rank}: steps are the {len(tl.steps)} ranges matching "
                     f"--step-annotation {opts.step_annotation.pattern!r}")
    notes += [f"rank {trace.rank}: {n}" for n in tl.notes]
    notes += _device_notes(trace, tl)
    rows = _gpu_rows(trace) if tl.on_gpu else None    # selected once for both GPU table sets
    own = _timeline_gpu_tables(trace, tl, rows, steps) if rows is not None else {}
    # Everything this process makes of the rank is made before it waits for the forked copy's
    # tables (``beside.result``), so that the two run side by side to the end.
    overlap = breakdown.trace_overlap(tl)
    side = beside.result() if beside is not None else _beside_timeline(trace, steps, rows)
    both = {**own, **side["gpu"]}
    gpu = {name: both[name] for name in report_tables.GPU} if tl.on_gpu else {}
    return RankResult(
        identity=identity(trace.path, trace.rank, trace.meta), on_gpu=tl.on_gpu, timeline=tl,
        trace_overlap=overlap, operations=side["operations"],
        meta=instances.small_meta(trace.meta),
        problems=list(getattr(trace, "problems", []) or []),
        gpu=gpu, notes=notes, operators=side["operators"], device_name=device_name(trace.meta),
        environment=environment_of(trace.meta, tl.window_source),
        memory=side["memory"], trust=side["trust"],
        implausible=validate.step_windows_problem(
            tl.host_steps if tl.window_source != "trace" else {}, tl.span))


# A trace of at least this many complete events has its tables beside the timeline made in a
# forked process, when this process reads it on every core (``rank_work``): below it the fork
# costs more than it saves.
BESIDE_EVENTS = 400_000


def _beside_timeline(trace: ingest.RankTrace, steps: step_windows.StepWindows,
                     rows: GpuRows | None = None) -> dict:
    """The rank's tables that need only its steps (``rank_work``): its operations, memory
    tables, operators, the checks of its trace (``trust``: of its profiled steps' host
    ranges, the timeline's ``host_steps``) and, on a GPU, its kernel tables (from ``rows``
    when given, else selected here: a forked copy selects its own)."""
    return {"trust": rank_checks.rank_checks(trace.rank, trace.events, trace.damage,
                                             steps.host_steps),
            "operations": instances.extract(trace, steps.on_gpu),
            "memory": rank_memory.rank_tables(trace.rank, trace.memory, trace.events,
                                              trace.meta, steps.host_steps),
            "operators": _operators(trace, steps.host_steps),
            "gpu": _kernel_tables(trace, steps, rows if rows is not None else _gpu_rows(trace))
            if steps.on_gpu else {}}


def same_startup_steps(results: list[RankResult]) -> list[str]:
    """Leave out the same start-up steps on every rank: a step that is start-up on one rank
    (``RankTimeline.startup``) is left out of the others too, so that their steps — and the
    collectives matched across ranks by step — stay the same. Each rank's timeline, its
    per-step GPU tables and its operators lose that step; a rank that would keep no step keeps
    its own. Returns one note per rank changed."""
    start = {k: tl.startup[k] for r in results if (tl := r.timeline) is not None
             for k in tl.startup}
    notes = []
    if not start:
        return notes
    for r in results:
        tl = r.timeline
        if tl is None:
            continue
        drop = sorted(k for k in start if k in tl.steps and k not in tl.startup)
        if not drop or len(drop) == len(tl.steps):
            continue
        keep = {k: w for k, w in tl.steps.items() if k not in drop}
        r.timeline = dataclasses.replace(
            tl, steps=keep, host_steps={k: w for k, w in tl.host_steps.items() if k not in drop},
            startup={**tl.startup, **{k: tl.host_steps[k] for k in drop if k in tl.host_steps}})
        gpu = dict(r.gpu)
        for name, table in gpu.items():
            if table is not None and "step" in table:
                if name == "sync_calls":
                    gpu[name] = table.assign(step=table["step"].where(
                        ~table["step"].isin(drop), -1))
                else:
                    gpu[name] = table[~table["step"].isin(drop)]
        r.gpu = gpu                 # assigned whole: a spilled result stores it again
        if r.operators is not None and "step" in r.operators:
            r.operators = r.operators[~r.operators["step"].isin(drop)]
        notes.append(f"rank {r.rank}: step{'s' if len(drop) > 1 else ''} "
                     f"{', '.join(map(str, drop))} left out as on the ranks where "
                     f"{'they are' if len(drop) > 1 else 'it is'} start-up, so that every "
                     f"rank's steps are the same")
    return notes


#: The profiler's recording options a Kineto trace names at its top level (set: 1).
PROFILER_SETTINGS = ("record_shapes", "profile_memory", "with_stack", "with_flops",
                     "with_modules")
STEP_DEFINITIONS = {"ProfilerStep": "ProfilerStep", "annotation": "annotation",
                    "trace": "whole trace"}


def _cuda_version(v) -> str | None:
    """CUDA's integer version (12040) as "12.4"; None for anything else."""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return f"{n // 1000}.{n % 1000 // 10}" if 1000 <= n < 100_000 else None


def environment_of(meta, window_source: str) -> dict:
    """What a trace says of what it ran on and how it was recorded (``model.Environment``'s
    fields, one value each, None where the trace does not say)."""
    meta = meta if isinstance(meta, dict) else {}
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    props = meta.get("deviceProperties")
    world = dist.get("world_size")
    nccl = dist.get("nccl_version")
    return {"device": device_name(meta),
            "device_count": len(props) if isinstance(props, list) and props else None,
            "world_size": int(world) if isinstance(world, int) and world > 0 else None,
            "backend": str(dist["backend"]) if isinstance(dist.get("backend"), str) else None,
            "nccl_version": str(nccl) if isinstance(nccl, (str, int)) and nccl != "" else None,
            "cuda_runtime_version": _cuda_version(meta.get("cuda_runtime_version")),
            "cuda_driver_version": _cuda_version(meta.get("cuda_driver_version")),
            "profiler_settings": " ".join(s for s in PROFILER_SETTINGS
                                          if str(meta.get(s)) in ("1", "True", "true")) or
            "default",
            "step_definition": STEP_DEFINITIONS.get(window_source, window_source)}


def device_name(meta) -> str | None:
    """The first device the trace's ``deviceProperties`` names (None without one)."""
    props = meta.get("deviceProperties") if isinstance(meta, dict) else None
    if isinstance(props, list) and props and isinstance(props[0], dict) \
            and isinstance(props[0].get("name"), str) and props[0]["name"].strip():
        return props[0]["name"].strip()
    return None


def _device_notes(trace: ingest.RankTrace, tl: timeline.RankTimeline) -> list[str]:
    """What the report says about the rank's device beyond its figures: a GPU the trace names
    without any device activity (a CUPTI range-profiler trace holds counters, no kernels),
    and the CUDA/HIP graphs it captures or replays."""
    out = []
    name = device_name(trace.meta)
    ev = trace.events
    if not tl.on_gpu and name is not None:
        ranges = int((ev["cat"] == "cuda_profiler_range").sum())
        out.append(f"rank {trace.rank}: the trace names its device ({name}, deviceProperties) "
                   f"but records no kernel, memcpy or memset"
                   + (f" — its {ranges:,} cuda_profiler_range events are CUPTI range-profiler "
                      f"counters, which carry no device timeline" if ranges else "")
                   + ": no device figures; the host's operators are its timeline")
    if tl.graph_captures:
        out.append(f"rank {trace.rank}: the trace captures CUDA graphs "
                   f"({_n(tl.graph_captures, 'capture')}): capture is set-up — the launches "
                   f"inside a capture run nothing until the graph is replayed — and a step "
                   f"that captures is start-up, not steady state"
                   + (f"; it also replays graphs ({_n(tl.graph_replays, 'graph launch')})"
                      if tl.graph_replays else ""))
    elif tl.graph_replays:
        out.append(f"rank {trace.rank}: the trace replays CUDA graphs "
                   f"({_n(tl.graph_replays, 'graph launch')}): their kernels belong to the "
                   f"replay that launched them")
    return out


def _n(count: int, what: str) -> str:
    """``count`` ``what``, plural when it is not one (``3 graph launches``)."""
    return f"{count:,} {what}" + ("" if count == 1 else "es" if what.endswith("ch") else "s")


def _operators(trace: ingest.RankTrace, host_steps: dict) -> pd.DataFrame:
    """The rank's host operators per profiled step (``timeline/operators.py``), from the few
    columns it reads."""
    ev = trace.events
    host = ev.loc[~ev["device"].to_numpy(), ["name", "kind", "ts_us", "dur_us"]]
    return operators.operator_totals(trace.rank, host, host_steps)


# Synchronisations whose call sites are looked up (the ones that left the device idle longest).
SITES = 200


# A GPU rank's tables of ``analysis/gpu/`` (the registry's ``GpuTables``, report/tables.py),
# over its profiled step windows: ``step_categories`` (the former TensorBoard plugin's
# categories), ``stream_idle`` (HTA's idle time breakdown per stream), ``sync_calls`` (each
# synchronisation, the device idle charged to it, the profiled step it was called in — -1
# outside them — and where it was called from) — made with the timeline
# (``_timeline_gpu_tables``) —, ``kernels``, ``kernel_totals`` and ``kernel_categories`` (the
# top kernels, every kernel per step, the device time per category), ``gemms`` (matrix
# multiplications against the device's peak) — which read only its steps (``_kernel_tables``).
# The event table is not copied whole: each table takes the few rows and columns it reads (a
# copy of the host events cost 30 MB at the peak on the 216k-event reference trace).


@dataclasses.dataclass(frozen=True)
class GpuRows:
    """The rows of a GPU rank's event table that its GPU tables read: the device events
    (``_DEV_COLUMNS``) and the host events around them (``_HOST_COLUMNS``)."""
    dev: pd.DataFrame
    host: pd.DataFrame


def _gpu_rows(trace: ingest.RankTrace) -> GpuRows:
    """The device rows and the host rows the GPU tables read."""
    ev = trace.events
    device = ev["device"].to_numpy()
    dev = ev.loc[device, _DEV_COLUMNS]
    # The host rows these tables read: launches (runtime calls with a correlation id),
    # synchronisations and GEMM operators; the operators around them are read per call.
    name, cat = ev["name"], ev["cat"]
    wanted = ~device & (((ev["correlation"] >= 0) & cat.isin(host_activity.RUNTIME_CATS))
                        | name.isin(host_activity.SYNC_NAMES) | name.isin(host_activity.COPY_NAMES)
                        | name.isin(host_activity.EVENT_WAIT_NAMES) | name.isin(kernels.GEMM_OPS))
    return GpuRows(dev=dev, host=ev.loc[wanted, _HOST_COLUMNS])


def _timeline_gpu_tables(trace: ingest.RankTrace, tl: timeline.RankTimeline, rows: GpuRows,
                         steps: step_windows.StepWindows) -> dict[str, pd.DataFrame]:
    """``step_categories``, ``stream_idle``, ``sync_calls`` (``report_tables.GPU``). The
    launches of ``rows.dev`` are ``steps.launch`` (the same device rows, in the same order)."""
    ev, dev, host = trace.events, rows.dev, rows.host
    r = trace.rank
    launch_ts = _launch_times(steps, rows)
    sel = step_windows.complete_steps(dev, host, {**tl.host_steps, **tl.startup})
    sync_idle = tl.idle_causes.get("sync", np.zeros((0, 2)))
    calls = host_activity.blocking_copy_calls(host_activity.sync_calls(host), host, sync_idle)
    calls = host_activity.in_steps(gpu_idle.charged_sync(calls, sync_idle), tl.host_steps)
    if len(calls):
        order = np.argsort(-(calls["idle_after_us"].to_numpy()
                             + calls["end_us"].to_numpy() - calls["ts_us"].to_numpy()))
        mask = np.zeros(len(calls), dtype=bool)
        mask[order[:SITES]] = True
        calls = host_activity.with_sites(calls, ev, mask)
    return {
        "step_categories": pd.DataFrame(step_categories.step_rows(
            r, tl.steps, timeline.sets_in_blocks(step_categories.role_sets, ev)),
            columns=step_categories.COLUMNS),
        "stream_idle": gpu_idle.stream_idle(r, sel, launch_ts[dev.index.get_indexer(sel.index)]
                                            if len(sel) else np.zeros(0)),
        "sync_calls": calls.assign(rank=r),
    }


def _launch_times(steps: step_windows.StepWindows, rows: GpuRows) -> np.ndarray:
    """When each of ``rows.dev`` was launched: the step windows' own launches where they were
    found with them (the same device rows, in the same order), else read from the host rows."""
    return steps.launch[0] if steps.launch is not None else \
        step_windows.launches(rows.host, rows.dev)[0]


def _kernel_tables(trace: ingest.RankTrace, steps: step_windows.StepWindows, rows: GpuRows
                   ) -> dict[str, pd.DataFrame]:
    """``kernels``, ``kernel_totals``, ``kernel_categories``, ``gemms`` (``report_tables.GPU``)."""
    dev, host = rows.dev, rows.host
    r = trace.rank
    windows = step_windows.window_set(steps.steps, steps.span)
    ts, end = dev["ts_us"].to_numpy(), dev["end_us"].to_numpy()
    inside = np.zeros(len(dev), dtype=bool)
    for a, b in windows:
        inside |= (ts < b) & (end > a)
    in_dev = dev[inside]
    graph = set(host.loc[host["name"].isin(host_activity.GRAPH_LAUNCH_NAMES),
                         "correlation"].tolist())
    launch_calls = host_activity.runtime_calls(host)[["lane", "ts_us", "end_us", "correlation"]]
    return {
        "kernels": kernels.kernel_table(r, in_dev, graph),
        "kernel_totals": kernels.kernel_totals(
            r, dev, step_windows.device_step_of(steps.host_steps, host, dev,
                                                _launch_times(steps, rows))),
        "kernel_categories": kernels.category_totals(r, in_dev),
        "gemms": kernels.gemm_table(r, host, in_dev, launch_calls, device_name(trace.meta)),
    }


_DEV_COLUMNS = ["name", "cat", "ts_us", "dur_us", "end_us", "lane", "kind", "correlation"]
_HOST_COLUMNS = ["name", "cat", "ts_us", "end_us", "lane", "kind", "correlation", "call_args"]
