"""Analyse a run directory (or any folder of Kineto traces) and write its report.

``analyze(path)`` finds the traces, ingests every usable one (problems with the others are
recorded, never fatal while one rank remains), computes the tables of ``overlap`` and
``bubble``, and returns a ``Report``. ``Report.write(dir)`` stores ``breakdown.parquet``,
``trace_overlap.parquet``, ``bubbles.parquet`` and ``summary.json`` (docs/metrics.md).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import pathlib
import re

import pandas as pd

from meshscope.collectors import run_dir as rd

from meshscope.analysis.pipeline import bubble
from meshscope.analysis.comm import bandwidth_report as comm_report
from meshscope.analysis.report import findings as findings_mod
from meshscope.analysis.records import flight_recorder as hangs
from meshscope.analysis.timeline import breakdown as overlap
from meshscope.analysis.pipeline import schedule as pipeline_report
from meshscope.analysis.crossrank import stragglers
from meshscope.analysis.timeline import rank_timeline as timeline
from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest.events import compile_rank_regex
from meshscope.analysis.ingest.pool import map_files
from meshscope.analysis.report import inputs, rank_work

REPORT_SCHEMA_VERSION = 1


@dataclasses.dataclass
class Report:
    source: pathlib.Path
    run: dict | None
    breakdown: pd.DataFrame
    trace_overlap: pd.DataFrame
    bubbles: pd.DataFrame
    problems: list[str]
    missing_ranks: list[int]
    ranks: list[int]
    on_gpu: bool
    microbatches: pd.DataFrame = None
    pipeline_phases: pd.DataFrame = None
    stage_imbalance: pd.DataFrame = None
    imbalance: dict | None = None
    clock_offsets: pd.DataFrame = None
    collectives: pd.DataFrame = None
    rank_waits: pd.DataFrame = None
    straggler: dict | None = None
    unmatched: list[str] = dataclasses.field(default_factory=list)
    step_heatmap: pd.DataFrame = None
    hangs: pd.DataFrame = None
    findings: list[dict] = dataclasses.field(default_factory=list)
    bandwidth: pd.DataFrame = None
    bandwidth_summary: pd.DataFrame = None

    TABLES = ("breakdown", "trace_overlap", "bubbles", "microbatches", "pipeline_phases",
              "stage_imbalance", "clock_offsets", "collectives", "rank_waits", "step_heatmap",
              "bandwidth", "bandwidth_summary")

    def summary(self) -> dict:
        return _summary(self)

    def write(self, out: pathlib.Path) -> pathlib.Path:
        out = pathlib.Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name in self.TABLES:
            table = getattr(self, name)
            if table is not None:
                table.to_parquet(out / f"{name}.parquet", index=False)
        rd.write_json_atomic(out / "summary.json", self.summary())
        return out


def analyze(path: pathlib.Path, *, comm_kernel_re: str | None = None,
            rank_regex: str | None = None, cache_dir: pathlib.Path | None = None,
            workers: int | None = None, progress: bool = False,
            baseline: pd.DataFrame | None = None) -> Report:
    """Analyse the traces under ``path``.

    ``comm_kernel_re``: extra pattern for communication kernels. ``rank_regex``: a pattern with
    one group that takes the rank from a file name, for traces without ``distributedInfo``.
    ``cache_dir``: parquet cache of event tables (``analysis/trace_cache.py``; the CLI uses
    ``<report dir>/.cache``); None reads every trace afresh. ``workers``: ingest processes
    (default: one per core, at most one per file). ``progress``: a progress bar on stderr
    when it is a terminal and ingest takes over a second.
    """
    inp = inputs.gather(path)
    path = inp.path
    run = inp.run.raw if inp.run is not None else None
    files = inp.trace_files
    has_records = run is not None and inp.has_comms
    if not files:
        if has_records:
            inp.problems.append("no traces: the run ended before its profiled steps")
            return _records_only_report(inp)
        raise InputError(path, "no trace files (*.json, *.json.gz) found"
                         + (" in traces/" if run is not None else ""))
    pattern = re.compile(comm_kernel_re) if comm_kernel_re else None
    opts = rank_work.RankOptions(comm_kernel_re=pattern, rank_regex=compile_rank_regex(rank_regex),
                                 cache_dir=cache_dir, run=run)
    problems = inp.problems
    results: list[rank_work.RankResult] = []
    for f, result in map_files(files, rank_work.rank_work, (opts,), workers=workers,
                               progress=progress):
        if isinstance(result, str):
            problems.append(result)
        else:
            results.append(result)
    chosen, skipped = inputs.resolve_identities([r.identity for r in results])
    problems += skipped
    results = [r for r in results if r.identity.path in chosen]
    timelines: dict[int, timeline.RankTimeline] = {}
    collectives, transfers, overlaps = [], [], []
    world_seen = max((r.identity.world_size or 0 for r in results), default=0)
    for r in results:
        problems += r.problems
        if r.implausible:
            problems.append(f"{r.identity.path}: {r.implausible}; rank {r.rank} left out of "
                            f"the report")
            continue
        timelines[r.rank] = r.timeline
        collectives.append(r.collectives)
        transfers.append(r.transfers)
        overlaps.append(r.trace_overlap)
    if not timelines:
        if has_records:
            return _records_only_report(inp)
        raise InputError(path, "no usable trace: " + "; ".join(problems))
    expected = set(range(int(run["world_size"]))) if run and "world_size" in run else set()
    missing = sorted(expected - set(timelines))
    windows = bubble.pipeline_windows(timelines, run) if run and \
        run.get("layout", {}).get("pp", 1) > 1 else {}
    breakdown = pd.concat([overlap.step_breakdown(tl, windows.get(r))
                           for r, tl in sorted(timelines.items())], ignore_index=True)
    trace_ov = pd.DataFrame(sorted(overlaps, key=lambda o: o["rank"]))
    bubbles = bubble.bubble_table(timelines, windows, run)
    mb = pipeline_report.microbatch_table(timelines, windows)
    phases = pipeline_report.phase_table(mb, windows)
    imbalance_tab = pipeline_report.imbalance_table(mb)
    imbalance = pipeline_report.imbalance_summary(imbalance_tab)
    if not bubbles.empty:
        groups = [g["ranks"] for g in (run or {}).get("process_groups", [])
                  if g["dimension"] == "pp"]
        replayed = pipeline_report.replay(mb, groups)
        bubbles = bubbles.merge(replayed, on=["rank", "step"], how="left")
    coll = pd.concat(collectives, ignore_index=True) if collectives else \
        pd.DataFrame(columns=stragglers.INSTANCE_COLUMNS)
    unmatched = stragglers.matchability(coll, sorted(timelines),
                                        int(run["world_size"]) if run else world_seen or None)
    offsets = stragglers.clock_offsets(coll)
    inst, waits = stragglers.waits(coll, offsets) if not unmatched else (None, None)
    verdict = stragglers.verdict(waits) if waits is not None else None
    heatmap, hang_table = _always_on_records(inp)
    n_steps = breakdown["step"].nunique() if not breakdown.empty else 0
    found = findings_mod.findings(breakdown, bubbles, imbalance,
                                  int((run or {}).get("microbatches", 1)), verdict, n_steps,
                                  hang_table, heatmap)
    bw = comm_report.bandwidth_table(pd.concat(transfers, ignore_index=True))
    return Report(source=path, run=run, breakdown=breakdown, trace_overlap=trace_ov,
                  bubbles=bubbles, problems=problems, missing_ranks=missing,
                  ranks=sorted(timelines), on_gpu=any(t.on_gpu for t in timelines.values()),
                  bandwidth=bw, bandwidth_summary=comm_report.bandwidth_summary(bw, baseline),
                  microbatches=mb, pipeline_phases=phases, stage_imbalance=imbalance_tab,
                  imbalance=imbalance, clock_offsets=offsets, collectives=inst,
                  rank_waits=waits, straggler=verdict, unmatched=unmatched,
                  step_heatmap=heatmap, hangs=hang_table, findings=found)


def _records_only_report(inp: inputs.Inputs) -> Report:
    """A run with no usable trace (it failed or hung before its profiled steps): what the
    always-on records say — step timers and the Flight Recorder diagnosis."""
    heatmap, hang_table = _always_on_records(inp)
    empty_breakdown = pd.DataFrame(columns=overlap.COLUMNS)
    found = findings_mod.findings(empty_breakdown, pd.DataFrame(columns=bubble.COLUMNS), None,
                                  1, None, 0, hang_table, heatmap)
    return Report(source=inp.path, run=inp.run.raw, breakdown=empty_breakdown,
                  trace_overlap=pd.DataFrame(columns=["rank", "compute_us", "comm_us",
                                                      "overlapped_comm_us", "overlap_pct"]),
                  bubbles=pd.DataFrame(columns=bubble.COLUMNS), problems=inp.problems,
                  missing_ranks=list(range(inp.run.world_size)), ranks=[],
                  on_gpu=False, step_heatmap=heatmap, hangs=hang_table, findings=found)


def _always_on_records(inp: inputs.Inputs) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The step heatmap from every rank's step timers (empty when there are none) and, when the
    run has a comms/ folder, the Flight Recorder's hang table."""
    hang_table = hangs.diagnose(inp.dumps, inp.run.raw if inp.run else None, inp.steps) \
        if inp.has_comms else None
    return stragglers.step_heatmap(inp.steps), hang_table


def _clean(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    return x


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: _clean(v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in df.to_dict(orient="records")]


def _summary(r: Report) -> dict:
    per_rank = r.breakdown.drop(columns=["step"]).groupby("rank").mean().reset_index() \
        if not r.breakdown.empty else r.breakdown
    extra = {"replayed_bubble_fraction": ("replayed_bubble_fraction", "mean")} \
        if "replayed_bubble_fraction" in r.bubbles else {}
    stages = (r.bubbles.groupby(["stage"]).agg(
        bubble_fraction=("bubble_fraction", "mean"), theory_fraction=("theory_fraction", "first"),
        ranks=("rank", lambda s: sorted(set(int(x) for x in s))), **extra).reset_index()
        if not r.bubbles.empty else pd.DataFrame())
    run = r.run or {}
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": str(r.source),
        "run": {k: run.get(k) for k in ("run_id", "layout_str", "world_size", "schedule",
                                        "microbatches", "steps", "profile_steps")} if run else None,
        "device": "gpu" if r.on_gpu else "cpu",
        "ranks": r.ranks,
        "missing_ranks": r.missing_ranks,
        "problems": r.problems,
        "steps": sorted(int(s) for s in r.breakdown["step"].unique()) if not r.breakdown.empty
        else [],
        "per_rank_mean": _records(per_rank),
        "trace_overlap": _records(r.trace_overlap),
        "pipeline_stages": _records(stages),
        "stage_imbalance": r.imbalance,
        "clock_offsets": _records(r.clock_offsets) if r.clock_offsets is not None else [],
        "cross_rank": {"matchable": not r.unmatched, "why_not": r.unmatched,
                       "straggler": r.straggler,
                       "rank_waits": _records(r.rank_waits) if r.rank_waits is not None
                       else []},
        "slow_steps": sorted({int(s) for s in r.step_heatmap.loc[r.step_heatmap["slow"], "step"]})
        if r.step_heatmap is not None and not r.step_heatmap.empty else [],
        "hangs": _records(r.hangs.astype({"last_seq_of_missing": str}))
        if r.hangs is not None and not r.hangs.empty else [],
        "findings": r.findings,
        "bandwidth": _records(r.bandwidth_summary) if r.bandwidth_summary is not None else [],
    }


def load_written(report_dir: pathlib.Path) -> dict[str, object]:
    """The tables and summary of a written report directory."""
    report_dir = pathlib.Path(report_dir)
    out: dict[str, object] = {"summary": json.loads((report_dir / "summary.json").read_text())}
    for name in ("breakdown", "trace_overlap", "bubbles"):
        out[name] = pd.read_parquet(report_dir / f"{name}.parquet")
    return out
