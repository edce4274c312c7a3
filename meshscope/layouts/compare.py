"""Runs side by side: ``compare(paths) -> Comparison`` (``meshscope compare``, its ``--json``
and ``--csv``, and the dashboard's compare page).

    from meshscope.layouts.compare import compare
    c = compare(["runs/dp4", "runs/dp2-pp2"])      # run directories, or one sweep folder
    c.winner.name, c.rows[0].step_time_us, c.explanations
    json.dumps(c.to_dict())                        # what `meshscope compare --json` prints

Every measured number is read from the run's own report (``report/summary.json`` and its
tables; a run that has none is analysed first) and its step timers — nothing the report holds
is computed again here. ``RunRow`` fields and where each comes from:

====================== =====================================================================
field                  source
====================== =====================================================================
name, path             the run directory's name and path
layout, label, sizes   run.json (``layout_str``; ``dp2·pp2``; dimension → size)
ranks, schedule,       run.json (``world_size``, ``schedule`` — null without a pipeline —,
microbatches, dp_mode  ``microbatches``, ``dp_mode``)
step_time_us,          summary ``step_time_us`` and ``step_time_source`` read through
step_time_source       ``analysis/report/reader.py`` — the step timer (median over non-warm-up
                       steps of the slowest rank's step) where the run has step timers, the
                       same figure the runs list, the overview and ``analyze`` print; schema 1:
                       the same from the step timers (``analysis.records.steps.throughput``)
tokens_per_s, mfu_pct  summary ``throughput`` (schema 1: from the step timers), only beside the
                       step timer's step time; MFU null where the device's peak is unknown
compute_us             summary ``per_rank_mean[].compute_us``, mean over ranks
exposed_comm_us        dim → summary ``per_rank_mean[].exposed_comm_<dim>_us``, mean over
                       ranks (only dimensions with exposed time)
bubble_us,             ``per_rank_mean[].bubble_us`` mean; ``pipeline_stages[]``
bubble_fraction,       ``bubble_fraction`` and ``theory_fraction`` means over stages (null
theory_bubble_fraction without a pipeline)
bandwidth_efficiency   summary ``bandwidth[]`` ``efficiency`` weighted by ``instances`` (null
                       without a baseline)
peak_memory_bytes      the step timers' largest ``peak_memory_bytes`` over ranks and steps
comm_bytes             dim → bytes per step per rank (mean over ranks and profiled steps of
                       the sum of ``msg_bytes``) from ``report/instances.parquet``, or
                       ``report/bandwidth.parquet`` before that table exists
findings               the report's top three findings: ``id``, ``title``, ``cost_pct``
predicted              the planner's numbers for the same layout (``Predicted``), or null
====================== =====================================================================

``Comparison.rows`` are ranked by measured step time (fastest first; rows without one last);
``winner`` is the first row; ``ties`` the other rows whose step time is within ``TIE_REL``
(0.5%) of the winner's — a tie, not a loss: 914.78 and 915.01 ms are the same step time on a
machine whose steps vary by more than that (``tied``, ``worse_end``; the terminal table marks
them ``=``, the dashboard leaves them unmarked); ``explanations`` are sentences on what each other row loses
against the winner, from the rows' terms and their reports' findings; ``failed`` lists runs of a
sweep that failed or have not run (with their error).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import pathlib
import statistics

import pandas as pd

from meshscope.analysis.report import reader
from meshscope.collectors import step_timer
from meshscope.collectors.run_dir import ReportDir, RunDirError
from meshscope.collectors.run_info import RunInfo, read_run_info
from meshscope.vocabulary import COMM_DIMS, PARALLEL_DIMS, STEP_TIME_SOURCES

TOP_FINDINGS = 3
#: Two figures within this fraction of each other are a tie (docs/dashboard.md, compare):
#: below the step-to-step noise of every run we measured (1–5% on the shared CPU runners).
TIE_REL = 0.005


def tied(a: float, b: float, rel: float = TIE_REL) -> bool:
    """Whether ``a`` and ``b`` are the same figure within ``rel`` of the larger."""
    return abs(a - b) <= rel * max(abs(a), abs(b))


def worse_end(values, better: str, rel: float = TIE_REL) -> set[int]:
    """Indices of ``values`` at the worse end of a row (``better`` "low" or "high"): every
    value tied with the worst; none when the best and the worst tie, or fewer than two values
    are known (None and text are left out)."""
    known = [(float(v), j) for j, v in enumerate(values)
             if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if len(known) < 2 or better not in ("low", "high"):
        return set()
    lo, hi = min(v for v, _ in known), max(v for v, _ in known)
    if tied(lo, hi, rel):
        return set()
    worst = hi if better == "low" else lo
    return {j for v, j in known if tied(v, worst, rel)}


class CompareError(ValueError):
    """Something to compare that cannot be read; the message names the path and problem."""


@dataclasses.dataclass(frozen=True)
class FindingRef:
    id: str
    title: str
    cost_pct: float | None


@dataclasses.dataclass(frozen=True)
class Predicted:
    """The planner's numbers for a row's layout (``layouts.plan``)."""
    source: str
    step_time_us: float | None
    tokens_per_s: float | None
    compute_us: float | None
    exposed_comm_us: dict[str, float]
    bubble_fraction: float | None
    peak_memory_bytes: float
    memory_terms: dict[str, float]       # the peak rank's params/grads/optimizer/… bytes
    comm_bytes: dict[str, float]


@dataclasses.dataclass(frozen=True)
class RunRow:
    name: str
    path: str
    layout: str
    label: str
    sizes: dict[str, int]
    ranks: int
    schedule: str | None
    microbatches: int
    dp_mode: str | None
    step_time_us: float | None
    step_time_source: str | None         # "timer" | "replayed" | "window" (reader.step_time)
    tokens_per_s: float | None
    mfu_pct: float | None
    compute_us: float | None
    exposed_comm_us: dict[str, float]
    bubble_us: float | None
    bubble_fraction: float | None
    theory_bubble_fraction: float | None
    bandwidth_efficiency: float | None
    peak_memory_bytes: int | None
    comm_bytes: dict[str, float]
    findings: list[FindingRef]
    predicted: Predicted | None
    report_schema: int | None

    @property
    def exposed_total_us(self) -> float:
        return sum(self.exposed_comm_us.values())


@dataclasses.dataclass(frozen=True)
class FailedRun:
    name: str
    path: str
    layout: str | None
    status: str          # failed, pending or running (a sweep's state)
    error: str | None


@dataclasses.dataclass
class Comparison:
    rows: list[RunRow]
    winner: RunRow | None
    explanations: list[str]
    failed: list[FailedRun] = dataclasses.field(default_factory=list)
    source: str = ""
    rank_correlation: float | None = None     # Spearman, predicted vs measured step time
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def ties(self) -> list[RunRow]:
        """The rows other than the winner whose step time ties with the winner's."""
        w = self.winner
        return [r for r in self.rows if w is not None and r is not w
                and r.step_time_us is not None and tied(r.step_time_us, w.step_time_us)]

    def to_dict(self) -> dict:
        """JSON-safe: what ``meshscope compare --json`` prints (NaN → null)."""
        return _clean({
            "kind": "meshscope-comparison", "source": self.source,
            "winner": self.winner.name if self.winner else None,
            "tied_with_winner": [r.name for r in self.ties], "tie_rel": TIE_REL,
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "explanations": self.explanations,
            "failed": [dataclasses.asdict(f) for f in self.failed],
            "rank_correlation": self.rank_correlation, "notes": self.notes})

    def csv_columns(self) -> list[str]:
        dims = sorted({d for r in self.rows for d in (*r.exposed_comm_us, *r.comm_bytes)},
                      key=lambda d: COMM_DIMS.index(d) if d in COMM_DIMS else 99)
        return (["rank", "name", "layout", "ranks", "schedule", "microbatches", "dp_mode",
                 "step_time_us", "step_time_source", "tied_with_winner", "tokens_per_s",
                 "mfu_pct", "compute_us"]
                + [f"exposed_comm_{d}_us" for d in dims]
                + ["bubble_fraction", "theory_bubble_fraction", "bandwidth_efficiency",
                   "peak_memory_bytes"] + [f"comm_{d}_bytes" for d in dims]
                + ["predicted_step_time_us", "predicted_peak_memory_bytes", "top_finding"])

    def to_csv(self) -> str:
        cols = self.csv_columns()
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        ties = self.ties
        for i, r in enumerate(self.rows, 1):
            d = {"rank": i, **{k: getattr(r, k) for k in cols if hasattr(r, k)}}
            for c in cols:
                if c.startswith("exposed_comm_"):
                    d[c] = r.exposed_comm_us.get(c[len("exposed_comm_"):-3])
                elif c.startswith("comm_") and c.endswith("_bytes"):
                    d[c] = r.comm_bytes.get(c[len("comm_"):-6])
            d["predicted_step_time_us"] = r.predicted.step_time_us if r.predicted else None
            d["predicted_peak_memory_bytes"] = r.predicted.peak_memory_bytes \
                if r.predicted else None
            d["top_finding"] = r.findings[0].id if r.findings else None
            d["tied_with_winner"] = "yes" if r in ties else ""
            w.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v))
                            else v) for k, v in d.items()})
        return buf.getvalue()


def _clean(x):
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _num(x) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x


def _mean(xs) -> float | None:
    xs = [x for x in (_num(v) for v in xs) if x is not None]
    return statistics.fmean(xs) if xs else None


# -- reading one run ------------------------------------------------------------------------

def run_summary(run: pathlib.Path, *, analyse_missing: bool = True) -> dict:
    """``RUN/report/summary.json``; a run without a report is analysed (and its report
    written) first. CompareError when neither works."""
    report = ReportDir.of_run(run)
    if not report.summary.exists():
        if not analyse_missing:
            raise CompareError(f"{run}: no report (run `meshscope analyze {run}`)")
        from meshscope.analysis.errors import InputError
        from meshscope.analysis.report.analyze import analyze
        try:
            analyze(run).write(report.path)
        except (InputError, RunDirError, OSError) as e:
            raise CompareError(f"{run}: cannot be analysed ({e})") from None
    try:
        return reader.read_summary_file(report.path)
    except reader.ReportError as e:         # it names the file and the problem
        raise CompareError(str(e)) from None


def _run_info(run: pathlib.Path) -> RunInfo:
    try:
        info = read_run_info(run)
    except RunDirError as e:
        raise CompareError(str(e)) from None
    if info is None:
        raise CompareError(f"{run}: no run.json (not a run directory)")
    return info


def _throughput(run: pathlib.Path, info: RunInfo, typed: reader.Summary) -> dict:
    if typed.step_time.us is not None:   # tokens/s and MFU only beside the timer's step time
        return {"step_time_us": typed.step_time.us, "step_time_source": typed.step_time.source,
                "tokens_per_s": typed.tokens_per_s, "mfu_pct": typed.mfu_pct}
    # A report with no step time (schema 1): the step timers', per step, as the report's
    # own ``throughput`` table defines it (``analysis.records.steps.throughput``).
    from meshscope.analysis.records.steps import throughput
    steps, _ = step_timer.read_all(run)
    table = throughput(steps, info)
    if table.empty:
        return {"step_time_us": None, "step_time_source": None, "tokens_per_s": None,
                "mfu_pct": None}
    warm = set(typed.warmup_steps or [int(table["step"].min())])
    kept = table[~table["step"].isin(warm)]
    kept = kept if not kept.empty else table
    return {"step_time_us": _num(kept["step_time_us"].median()), "step_time_source": "timer",
            "tokens_per_s": _num(kept["tokens_per_s"].median()),
            "mfu_pct": _num(kept["mfu_pct"].median())}


def _comm_bytes(run: pathlib.Path) -> dict[str, float]:
    report = ReportDir.of_run(run).path
    for name in ("instances", "bandwidth"):
        if reader.table_written(report, name):
            try:
                t = reader.read_table(report, name)[["rank", "step", "dim", "msg_bytes"]]
            except reader.ReportError:
                continue
            t = t.dropna(subset=["msg_bytes"])
            if t.empty:
                return {}
            per = t.groupby(["dim", "rank", "step"])["msg_bytes"].sum()
            n_rank_steps = t.groupby(["rank", "step"]).ngroups
            return {str(d): float(v.sum()) / n_rank_steps
                    for d, v in per.groupby(level="dim")}
    return {}


def _bandwidth_efficiency(typed: reader.Summary) -> float | None:
    num = den = 0.0
    for row in typed.bandwidth:
        eff, n = row.efficiency, row.instances or 1.0
        if eff is not None:
            num += eff * n
            den += n
    return num / den if den else None


def _peak_memory(run: pathlib.Path) -> int | None:
    steps, _ = step_timer.read_all(run)
    if steps.empty or steps["peak_memory_bytes"].isna().all():
        return None
    return int(steps["peak_memory_bytes"].max())


def _findings(typed: reader.Summary) -> list[FindingRef]:
    return [FindingRef(f.id, f.title, f.cost_pct) for f in typed.findings[:TOP_FINDINGS]]


def candidate_of(info: RunInfo):
    """The planner's description of a run (None when run.json lacks what it needs)."""
    from meshscope.parallel.layout import LayoutError, parse_layout
    from meshscope.layouts.plan import Candidate
    try:
        layout = parse_layout(info.layout_str)
        counts = tuple(len(s) for s in info.stage_layers) if info.stage_layers else None
        even = counts and len(set(counts)) <= 2 and max(counts) - min(counts) <= 1 and \
            list(counts) == sorted(counts, reverse=True)
        cand = Candidate(layout=layout, schedule=info.schedule or "1f1b",
                         microbatches=info.microbatches, dp_mode=info.dp_mode or "ddp",
                         sp=info.sequence_parallel is not False,
                         global_batch=info.global_batch or 0,
                         virtual=info.virtual_stages if layout.size("pp") > 1 else None,
                         stage_layer_counts=None if even else counts)
        _ = cand.v
    except (LayoutError, ValueError, KeyError, TypeError):
        return None
    return cand if cand.global_batch else None


def spec_of(info: RunInfo):
    """The run's model as the planner's ``ModelSpec`` (None for an incomplete description)."""
    from meshscope.layouts.plan import ModelSpec, SpecError
    m = info.model
    try:
        return ModelSpec(dim=m.dim, n_layers=m.n_layers, n_heads=m.n_heads,
                         n_kv_heads=m.n_kv_heads, ffn_hidden=m.ffn_hidden,
                         vocab_size=m.vocab_size, seq_len=m.seq_len,
                         moe_experts=m.moe_experts or 0, moe_top_k=m.moe_top_k or 2,
                         moe_every=m.moe_every or 1, moe_hidden=m.moe_hidden,
                         name=m.preset or "model")
    except (SpecError, TypeError):
        return None


def _predicted(info: RunInfo, planner) -> Predicted | None:
    if planner is None:
        return None
    spec, cand = spec_of(info), candidate_of(info)
    if spec is None or cand is None:
        return None
    row = planner(spec, cand)
    if row is None:
        return None
    peak = row.peak
    est = row.estimate
    return Predicted(
        source=planner.source if hasattr(planner, "source") else "plan",
        step_time_us=est.step_time_us if est else None,
        tokens_per_s=est.tokens_per_s if est else None,
        compute_us=est.compute_us if est else None,
        exposed_comm_us=dict(est.exposed_comm_us) if est else {},
        bubble_fraction=est.bubble_fraction if est and cand.pp > 1 else None,
        peak_memory_bytes=peak.total_bytes,
        memory_terms={"params_bytes": peak.params_bytes, "grads_bytes": peak.grads_bytes,
                      "optimizer_bytes": peak.optimizer_bytes,
                      "buffers_bytes": peak.buffers_bytes,
                      "activations_bytes": peak.activations_bytes},
        comm_bytes=dict(row.comm_bytes))


def read_row(run: pathlib.Path, *, name: str | None = None, planner=None) -> RunRow:
    """One run's row (see the module docstring); ``planner(spec, candidate) -> PlanRow``
    adds the prediction."""
    run = pathlib.Path(run)
    info = _run_info(run)
    typed = reader.read_summary(run_summary(run))
    thr = _throughput(run, info, typed)
    per_rank = typed.per_rank_mean
    exposed = {}
    for d in COMM_DIMS:
        v = _mean(r.exposed_by_dim_us.get(d) for r in per_rank)
        if v:
            exposed[d] = v
    stages = typed.pipeline_stages
    sizes = {d: info.size(d) for d in PARALLEL_DIMS}
    label = "·".join(f"{d}{n}" for d, n in sizes.items() if n > 1) or "dp1"
    return RunRow(
        name=name or run.name, path=str(run), layout=info.layout_str, label=label, sizes=sizes,
        ranks=info.world_size, schedule=info.schedule if sizes["pp"] > 1 else None,
        microbatches=info.microbatches, dp_mode=info.dp_mode, **thr,
        compute_us=_mean(r.compute_us for r in per_rank), exposed_comm_us=exposed,
        bubble_us=_mean(r.bubble_us for r in per_rank) if stages else None,
        bubble_fraction=_mean(s.bubble_fraction for s in stages),
        theory_bubble_fraction=_mean(s.theory_fraction for s in stages),
        bandwidth_efficiency=_bandwidth_efficiency(typed),
        peak_memory_bytes=_peak_memory(run), comm_bytes=_comm_bytes(run),
        findings=_findings(typed), predicted=_predicted(info, planner),
        report_schema=typed.schema_version or None)


# -- what the planner calibrates from -------------------------------------------------------

def measured(run: pathlib.Path):
    """A run as ``layouts.plan.Measured`` — what ``plan --from RUN`` calibrates from."""
    from meshscope.layouts.plan import Measured
    run = pathlib.Path(run)
    info = _run_info(run)
    spec, cand = spec_of(info), candidate_of(info)
    if spec is None or cand is None:
        raise CompareError(f"{run / 'run.json'}: the model or layout is not described fully "
                           f"enough to calibrate the planner (model sizes, layout, global "
                           f"batch)")
    typed = reader.read_summary(run_summary(run))
    report = ReportDir.of_run(run).path
    try:
        bd = reader.read_table(report, "breakdown")
        bw = reader.read_table(report, "bandwidth")
    except reader.ReportError as e:         # it names the file and the problem
        raise CompareError(str(e)) from None
    if bd.empty:
        raise CompareError(f"{run}: its report has no per-rank breakdown (no usable trace)")
    # Medians over the profiled steps, each figure from the same steps: one slow step of a
    # shared machine must not set the calibration.
    profiled = sorted(int(s) for s in bd["step"].unique())
    per_rank = bd.groupby("rank").median(numeric_only=True)
    compute = {int(r): float(v) for r, v in per_rank["compute_us"].items()}
    steps, _ = step_timer.read_all(run)
    steps = steps[steps["step"].isin(profiled)]
    if steps.empty:
        raise CompareError(f"{run}: no step times for its profiled steps {profiled}")
    slowest = steps.groupby("step").agg(wall=("wall_time_us", "max"),
                                        opt=("optimizer_us", "max"))
    step_time, optimizer = float(slowest["wall"].median()), _num(slowest["opt"].median())
    exposed = {}
    for d in COMM_DIMS:
        col = f"exposed_comm_{d}_us"
        if col in per_rank:
            exposed[d] = float(per_rank[col].mean())
    stages = typed.pipeline_stages
    transfers = []
    for row in bw.itertuples():
        if _num(row.transfer_us) and _num(row.msg_bytes) and _num(row.group_size):
            transfers.append({"op": row.op, "n_ranks": int(row.group_size),
                              "size_bytes": float(row.msg_bytes),
                              "time_us": float(row.transfer_us)})
    return Measured(name=run.name, spec=spec, candidate=cand, step_time_us=step_time,
                    compute_us=compute, optimizer_us=optimizer or 0.0, exposed_comm_us=exposed,
                    bubble_fraction=_mean(s.bubble_fraction for s in stages),
                    transfers=transfers)


# -- many runs ------------------------------------------------------------------------------

def _sweep_runs(folder: pathlib.Path) -> tuple[list[tuple[str, pathlib.Path]], list[FailedRun]]:
    from meshscope.layouts.sweep import SweepError, is_complete_run, read_sweep
    try:
        data = read_sweep(folder)
    except SweepError as e:
        raise CompareError(str(e)) from None
    runs, failed = [], []
    for r in data.runs:
        path = folder / r.name
        if r.status == "completed" and is_complete_run(path):
            runs.append((r.name, path))
        else:
            status = r.status if r.status != "completed" else "failed"
            failed.append(FailedRun(r.name, str(path), r.layout, status,
                                    r.error or (None if status != "failed" else
                                                "its run directory is incomplete")))
    return runs, failed


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties share their mean rank); None for fewer than 2."""
    if len(xs) < 2:
        return None
    rx, ry = pd.Series(xs).rank(), pd.Series(ys).rank()
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(rx.corr(ry))


def compare(paths, *, planner=None) -> Comparison:
    """Compare run directories, or the runs of one sweep folder (``paths`` a folder holding
    sweep.json). ``planner(spec, candidate) -> PlanRow | None`` adds predictions (default:
    the sweep's own plan.json when comparing a sweep, else memory and traffic only)."""
    if isinstance(paths, (str, pathlib.Path)):
        paths = [paths]
    paths = [pathlib.Path(p) for p in paths]
    if not paths:
        raise CompareError("nothing to compare: give run directories or a sweep folder")
    failed: list[FailedRun] = []
    notes: list[str] = []
    if len(paths) == 1 and (paths[0] / "sweep.json").exists():
        named, failed = _sweep_runs(paths[0])
        source = str(paths[0])
        if planner is None:
            planner = sweep_planner(paths[0])
    else:
        for p in paths:
            if not p.is_dir():
                raise CompareError(f"{p}: no such run directory")
        named = [(p.name, p) for p in paths]
        source = ", ".join(map(str, paths))
    if planner is None:
        planner = default_planner()
    names = [n for n, _ in named]
    dup = {n for n in names if names.count(n) > 1}
    rows = [read_row(p, name=(f"{p.parent.name}/{n}" if n in dup else n), planner=planner)
            for n, p in named]
    rows.sort(key=lambda r: (r.step_time_us is None, r.step_time_us or 0.0))
    winner = rows[0] if rows and rows[0].step_time_us is not None else None
    pairs = [(r.predicted.step_time_us, r.step_time_us) for r in rows
             if r.predicted and r.predicted.step_time_us and r.step_time_us]
    rho = spearman([a for a, _ in pairs], [b for _, b in pairs])
    sizes = sorted({r.ranks for r in rows})
    if len(sizes) > 1:
        notes.append("these runs have different world sizes (" + ", ".join(map(str, sizes))
                     + " ranks): their step times compare layouts on different machines")
    if any(r.report_schema == 1 for r in rows):
        notes.append("some reports are schema 1: step time and tokens/s come from the step "
                     "timers (re-run `meshscope analyze` for schema 2)")
    return Comparison(rows=rows, winner=winner, explanations=explain(rows, winner),
                      failed=failed, source=source, rank_correlation=rho, notes=notes)


class _Planner:
    """``planner(spec, candidate)`` for ``compare``: the planner with fixed rates."""

    def __init__(self, rates=None, comm=None, source="plan"):
        self.rates, self.comm, self.source = rates, comm, source

    def __call__(self, spec, cand):
        from meshscope.layouts.plan import plan_one
        return plan_one(spec, cand, rates=self.rates, comm=self.comm)


def default_planner() -> _Planner:
    """Memory and traffic only (step times need rates: a sweep's plan.json or --from)."""
    return _Planner(source="plan (memory and traffic)")


def sweep_planner(folder: pathlib.Path) -> _Planner:
    """The planner with the rates a sweep planned with (its plan.json), or memory and traffic
    only when it has none."""
    from meshscope.layouts.plan.serial import load_rates
    from meshscope.collectors.run_dir import PLAN_JSON
    loaded = load_rates(folder / PLAN_JSON)
    if loaded is None:
        return default_planner()
    rates, comm = loaded
    return _Planner(rates, comm, source=f"plan ({rates.source})")


def calibrated_planner(runs: list[pathlib.Path], base_rates, baseline=None):
    """The planner calibrated from measured runs (``plan --from``); returns (planner, notes)."""
    from meshscope.layouts.plan import calibrate
    cal = calibrate([measured(r) for r in runs], base_rates, baseline)
    return _Planner(cal.rates, cal.comm, source=cal.rates.source), cal


# -- explanations ---------------------------------------------------------------------------

def _ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"


def _ms2(us: float) -> str:
    return f"{us / 1000:.2f} ms"


def _more_microbatches(row: RunRow) -> tuple[int, float] | None:
    """A microbatch count ≥ 2m that the global batch allows, and its closed-form bubble."""
    from meshscope.layouts.plan import theory_fraction
    dp = row.sizes.get("dp", 1)
    pp = row.sizes.get("pp", 1)
    try:
        info = read_run_info(pathlib.Path(row.path))
    except RunDirError:
        return None
    gb = info.global_batch if info else None
    if not gb or pp < 2 or row.schedule is None:
        return None
    for m in range(2 * row.microbatches, gb // dp + 1):
        if (gb // dp) % m == 0:
            try:
                return m, theory_fraction(row.schedule, pp, m, info.virtual_stages)
            except ValueError:
                return None
    return None


def _terms(row: RunRow) -> dict[str, float]:
    t = {"compute": row.compute_us or 0.0, "pipeline bubble": row.bubble_us or 0.0}
    for d, v in row.exposed_comm_us.items():
        t[f"exposed {d} communication"] = v
    return t


def explain(rows: list[RunRow], winner: RunRow | None) -> list[str]:
    """Sentences: the winner and why; for each other row, how much slower and the terms and
    findings that account for it."""
    if winner is None:
        return []
    labels = [r.label for r in rows]
    name = {id(r): (r.label if labels.count(r.label) == 1 else f"{r.label} ({r.name})")
            for r in rows}
    out = [f"{name[id(winner)]} wins: {_ms(winner.step_time_us)} per step"
           + (f", {winner.tokens_per_s:,.0f} tokens/s" if winner.tokens_per_s else "") + "."]
    base = _terms(winner)
    for r in rows:
        if r is winner or r.step_time_us is None:
            continue
        if tied(r.step_time_us, winner.step_time_us):
            out.append(f"{name[id(r)]} ties with {name[id(winner)]} "
                       f"({_ms2(r.step_time_us)} vs {_ms2(winner.step_time_us)} per step, "
                       f"within {TIE_REL:.1%}).")
            continue
        ratio = r.step_time_us / winner.step_time_us
        terms = _terms(r)
        deltas = sorted(((terms.get(k, 0.0) - base.get(k, 0.0), k)
                         for k in set(terms) | set(base)), reverse=True)
        parts = [f"+{_ms(d)} {k}" for d, k in deltas[:2] if d > 0.05 * winner.step_time_us]
        sentence = (f"{name[id(r)]} is {ratio:.2f}× slower than {name[id(winner)]} "
                    f"({_ms(r.step_time_us)} vs {_ms(winner.step_time_us)} per step)")
        if parts:
            sentence += ": " + ", ".join(parts)
        if r.bubble_fraction and r.bubble_fraction > 0.1:
            sentence += f"; it loses {r.bubble_fraction:.0%} to the pipeline bubble"
            more = _more_microbatches(r)
            if more:
                sentence += (f"; {more[0]} microbatches would bring it to ~{more[1]:.0%} "
                             f"(the schedule's closed form, {r.theory_bubble_fraction:.0%} "
                             f"at {r.microbatches})")
        top = next((f for f in r.findings if f.id != "pipeline-bubble"), None)
        if top:
            cost = f" ({top.cost_pct:.0f}% of its step)" if top.cost_pct else ""
            sentence += f"; its top finding: {top.title}{cost}"
        out.append(sentence + ".")
    return out


def _cell(x, width: int, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    text = "-" if x is None else format(x / scale, fmt) + suffix
    return text.rjust(width)


def _beside(row: RunRow) -> list[str]:
    """``measured / planned`` for every number the planner predicts, one line each."""
    p = row.predicted
    if p is None:
        return []

    def pair(label, meas, plan, scale, unit):
        m = "-" if meas is None else f"{meas / scale:.1f}"
        q = "-" if plan is None else f"{plan / scale:.1f}"
        return f"{label} {m} / {q} {unit}"

    items = [pair("step", row.step_time_us, p.step_time_us, 1e3, "ms"),
             pair("compute", row.compute_us, p.compute_us, 1e3, "ms")]
    for d in sorted(set(row.exposed_comm_us) | set(p.exposed_comm_us)):
        items.append(pair(f"exposed {d}", row.exposed_comm_us.get(d),
                          p.exposed_comm_us.get(d), 1e3, "ms"))
    if row.bubble_fraction is not None or p.bubble_fraction is not None:
        items.append(pair("bubble", row.bubble_fraction, p.bubble_fraction, 0.01, "%"))
    items.append(pair("peak memory", row.peak_memory_bytes, p.peak_memory_bytes, 1e6, "MB"))
    for d in sorted(set(row.comm_bytes) | set(p.comm_bytes)):
        items.append(pair(f"{d} bytes", row.comm_bytes.get(d), p.comm_bytes.get(d), 1e3,
                          "KB"))
    return [f"     measured / planned: {'; '.join(items)}"]


def render(c: Comparison, detail: bool = False) -> str:
    """The terminal table of ``meshscope compare``; ``detail`` adds under each row every
    number the planner predicts beside the measured one."""
    dims = [d for d in COMM_DIMS if any(d in r.exposed_comm_us for r in c.rows)]
    head = (f"{'#':>2} {'run':<26} {'ranks':>5} {'step ms':>9} {'plan ms':>8} {'tokens/s':>9} {'MFU':>5} "
            f"{'compute':>8} " + " ".join(f"{'exp ' + d:>8}" for d in dims)
            + f" {'bubble':>6} {'bw eff':>6} {'peak MB':>8} {'plan MB':>8}")
    lines = [head]
    ties = c.ties
    for i, r in enumerate(c.rows, 1):
        pred = r.predicted
        place = "1=" if r in ties else f"{i:>2}"
        bubble = r.bubble_fraction * 100 if r.bubble_fraction is not None else None
        lines.append(" ".join([
            f"{place:>2}", f"{r.name[:26]:<26}", f"{r.ranks:>5}",
            _cell(r.step_time_us, 9, ".1f", 1e3) + ("" if r.step_time_source in (None, "timer")
                                                    else "*"),
            _cell(pred.step_time_us if pred else None, 8, ".1f", 1e3),
            _cell(r.tokens_per_s, 9, ".0f"), _cell(r.mfu_pct, 5, ".1f"),
            _cell(r.compute_us, 8, ".1f", 1e3),
            *(_cell(r.exposed_comm_us.get(d), 8, ".1f", 1e3) for d in dims),
            _cell(bubble, 6, ".0f", suffix="%"), _cell(r.bandwidth_efficiency, 6, ".2f"),
            _cell(r.peak_memory_bytes, 8, ".0f", 1e6),
            _cell(pred.peak_memory_bytes if pred else None, 8, ".1f", 1e6)]))
        if detail:
            lines += _beside(r)
    lines.append("(times per step in ms; ranks = world size; exp = exposed communication; "
                 "plan = the planner's prediction; peak MB = the step timers' peak: CPU "
                 "resident set)")
    if ties:
        lines.append(f"(1= : a step time within {TIE_REL:.1%} of the winner's, a tie)")
    lines.append(f"(step ms = {STEP_TIME_SOURCES['timer']}"
                 + ("; * = a run without step timers: "
                    + ", ".join(sorted({STEP_TIME_SOURCES[r.step_time_source] for r in c.rows
                                        if r.step_time_source not in (None, "timer")}))
                    if any(r.step_time_source not in (None, "timer") for r in c.rows) else "")
                 + ")")
    for f_ in c.failed:
        lines.append(f"   {f_.name}: {f_.status}" + (f" — {f_.error}" if f_.error else ""))
    if c.explanations:
        lines.append("")
        lines += [f"- {e}" for e in c.explanations]
    if c.rank_correlation is not None:
        lines.append(f"\npredicted vs measured ranking: Spearman ρ = {c.rank_correlation:.2f}")
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)
