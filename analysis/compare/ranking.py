"""Runs side by side, ranked: ``rank(sides) -> Comparison`` — ``meshscope compare`` of three or
more runs, or of a sweep (``meshscope/layouts/ranked.py`` adds the sweep's failed runs and the
planner's predictions), ``--json``, ``--csv`` and the dashboard's compare page.

    from meshscope.analysis.compare import open_sides, rank
    c = rank(open_sides(["runs/dp4", "runs/dp2-pp2"]))
    c.winner.name, c.rows[0].step_time_us, c.explanations

Every measured number is read from the run's own report (``report/summary.json`` and its
tables; a path that is not analysed yet is analysed first, ``sides.open_side``) — nothing the
report holds is computed again here. ``RunRow`` fields and where each comes from:

====================== =====================================================================
field                  source
====================== =====================================================================
name, path             the run's name (its folder) and path
layout, label, sizes   run.json (``layout_str``; ``dp2·pp2``; dimension → size); a folder of
                       traces without run.json has none (label: its name)
ranks, schedule,       run.json (``world_size``, ``schedule`` — null without a pipeline —,
microbatches, dp_mode  ``microbatches``, ``dp_mode``); ranks: the analysed ranks without it
step_time_us,          summary ``step_time_us`` and ``step_time_source`` read through
step_time_source       ``analysis/report/reader.py`` — the step timer (median over non-warm-up
                       steps of the slowest rank's step) where the run has step timers, the
                       same figure the runs list, the overview and ``analyze`` print
tokens_per_s, mfu_pct  summary ``throughput``, only beside the step timer's step time; MFU
                       null where the device's peak is unknown
compute_us             summary ``per_rank_mean[].compute_us``, mean over ranks
window_us              summary ``window_us`` (``step_time.window_us``): the run's profiled
                       step window, the longest rank's per step, mean over profiled steps —
                       the report's one window (``timeline/breakdown.mean_window_us``), the
                       same number ``analyze`` and the overview show; the per-rank means of
                       compute, exposed communication and bubble fit within it (the step
                       time is the timer's where the run has one)
exposed_comm_us        dim → summary ``per_rank_mean[].exposed_comm_<dim>_us``, mean over
                       ranks (only dimensions with exposed time)
bubble_us,             ``per_rank_mean[].bubble_us`` mean; ``pipeline_stages[]``
bubble_fraction,       ``bubble_fraction`` and ``theory_fraction`` means over stages (null
theory_bubble_fraction without a pipeline)
bandwidth_efficiency   summary ``bandwidth[]`` ``efficiency`` weighted by ``instances`` (null
                       without a baseline)
peak_memory_bytes      the step timers' largest peak memory over ranks and non-warm-up steps
                       (``throughput.peak_memory_bytes``; ``quantities``' ``peak_memory``)
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
them ``=``, the dashboard leaves them unmarked); ``explanations`` are sentences on what each
other row loses against the winner, from the rows' terms and their reports' findings; ``failed``
lists runs of a sweep that failed or have not run (with their error).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import statistics

import pandas as pd

from meshscope.analysis.report.summary import clean as _clean
from meshscope.theory.schedules import bubble_fraction as theory_fraction
from meshscope.vocabulary import COMM_DIMS, PARALLEL_DIMS

from . import quantities as Q
from .sides import Side

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
    layout: str | None
    label: str
    sizes: dict[str, int]
    ranks: int
    schedule: str | None
    microbatches: int | None
    dp_mode: str | None
    step_time_us: float | None
    step_time_source: str | None         # "timer" | "replayed" | "window" (reader.step_time)
    tokens_per_s: float | None
    mfu_pct: float | None
    compute_us: float | None
    exposed_comm_us: dict[str, float]
    bubble_us: float | None
    window_us: float | None              # the report's profiled window (summary
                                         # window_us; the step time may be the timer's,
                                         # over more steps)
    bubble_fraction: float | None
    theory_bubble_fraction: float | None
    bandwidth_efficiency: float | None
    peak_memory_bytes: int | None
    comm_bytes: dict[str, float]
    findings: list[FindingRef]
    predicted: Predicted | None
    report_schema: int | None
    global_batch: int | None = None
    virtual_stages: int | None = None

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
    # The runs as given (``rows`` are ranked): the first is the baseline of a before/after.
    sides: list[Side] = dataclasses.field(default_factory=list, repr=False)

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


# -- reading one run ------------------------------------------------------------------------

def num_or_none(x) -> float | None:
    """``x`` as a finite float, else None (a report value that may be missing or NaN)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x


def mean_known(xs) -> float | None:
    """The mean of the known values of ``xs`` (``num_or_none``); None when none is known."""
    xs = [x for x in (num_or_none(v) for v in xs) if x is not None]
    return statistics.fmean(xs) if xs else None


def _comm_bytes(side: Side) -> dict[str, float]:
    for name in ("instances", "bandwidth"):
        if side.has_table(name):
            t = side.table(name)[["rank", "step", "dim", "msg_bytes"]]
            t = t.dropna(subset=["msg_bytes"])
            if t.empty:
                return {}
            per = t.groupby(["dim", "rank", "step"])["msg_bytes"].sum()
            n_rank_steps = t.groupby(["rank", "step"]).ngroups
            return {str(d): float(v.sum()) / n_rank_steps
                    for d, v in per.groupby(level="dim")}
    return {}


def _bandwidth_efficiency(side: Side) -> float | None:
    num = den = 0.0
    for row in side.summary.bandwidth:
        eff, n = row.efficiency, row.instances or 1.0
        if eff is not None:
            num += eff * n
            den += n
    return num / den if den else None


def _peak_memory(side: Side) -> int | None:
    m = Q.measure(side, "peak_memory")
    return None if m is None else int(m.value)


def _findings(side: Side) -> list[FindingRef]:
    return [FindingRef(f.id, f.title, f.cost_pct) for f in side.summary.findings[:TOP_FINDINGS]]


def read_row(side: Side, predict=None) -> RunRow:
    """One run's row (see the module docstring); ``predict(side) -> Predicted | None`` adds
    the planner's prediction."""
    typed, info = side.summary, side.info
    per_rank = typed.per_rank_mean
    exposed = {}
    for d in COMM_DIMS:
        v = mean_known(r.exposed_by_dim_us.get(d) for r in per_rank)
        if v:
            exposed[d] = v
    stages = typed.pipeline_stages
    if info is not None:
        sizes = {d: info.size(d) for d in PARALLEL_DIMS}
        label = "·".join(f"{d}{n}" for d, n in sizes.items() if n > 1) or "dp1"
        layout, ranks = info.layout_str, info.world_size
        schedule = info.schedule if sizes["pp"] > 1 else None
        microbatches, dp_mode = info.microbatches, info.dp_mode
    else:
        sizes, label, layout, ranks = {}, side.name, None, len(side.ranks)
        schedule, microbatches, dp_mode = None, None, None
    return RunRow(
        name=side.name, path=str(side.path), layout=layout, label=label, sizes=sizes,
        ranks=ranks, schedule=schedule, microbatches=microbatches, dp_mode=dp_mode,
        step_time_us=typed.step_time.us, step_time_source=typed.step_time.source,
        tokens_per_s=typed.tokens_per_s, mfu_pct=typed.mfu_pct,
        compute_us=mean_known(r.compute_us for r in per_rank), exposed_comm_us=exposed,
        window_us=typed.step_time.window_us,
        bubble_us=mean_known(r.bubble_us for r in per_rank) if stages else None,
        bubble_fraction=mean_known(s.bubble_fraction for s in stages),
        theory_bubble_fraction=mean_known(s.theory_fraction for s in stages),
        bandwidth_efficiency=_bandwidth_efficiency(side),
        peak_memory_bytes=_peak_memory(side), comm_bytes=_comm_bytes(side),
        findings=_findings(side), predicted=predict(side) if predict is not None else None,
        report_schema=typed.schema_version or None, global_batch=info.global_batch
        if info is not None else None, virtual_stages=info.virtual_stages
        if info is not None else None)


# -- many runs ------------------------------------------------------------------------------

def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties share their mean rank); None for fewer than 2."""
    if len(xs) < 2:
        return None
    rx, ry = pd.Series(xs).rank(), pd.Series(ys).rank()
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(rx.corr(ry))


def rank(sides: list[Side], *, predict=None, failed=(), source: str = "") -> Comparison:
    """The runs of ``sides`` ranked by step time (module docstring); ``predict(side) ->
    Predicted | None`` adds the planner's numbers (``meshscope/layouts/ranked.py``);
    ``failed``: runs of a sweep that did not complete, listed under the table."""
    rows = [read_row(s, predict) for s in sides]
    rows.sort(key=lambda r: (r.step_time_us is None, r.step_time_us or 0.0))
    winner = rows[0] if rows and rows[0].step_time_us is not None else None
    pairs = [(r.predicted.step_time_us, r.step_time_us) for r in rows
             if r.predicted and r.predicted.step_time_us and r.step_time_us]
    rho = spearman([a for a, _ in pairs], [b for _, b in pairs])
    notes = []
    sizes = sorted({r.ranks for r in rows})
    if len(sizes) > 1:
        notes.append("these runs have different world sizes (" + ", ".join(map(str, sizes))
                     + " ranks): their step times compare layouts on different machines")
    if any(r.report_schema == 1 for r in rows):
        notes.append("some reports are schema 1: re-run `meshscope analyze` for today's "
                     "figures")
    return Comparison(rows=rows, winner=winner, explanations=explain(rows, winner),
                      failed=list(failed), source=source or ", ".join(s.name for s in sides),
                      rank_correlation=rho, notes=notes, sides=list(sides))


# -- explanations ---------------------------------------------------------------------------

def _ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"


def _ms2(us: float) -> str:
    return f"{us / 1000:.2f} ms"


def _more_microbatches(row: RunRow) -> tuple[int, float] | None:
    """A microbatch count ≥ 2m that the global batch allows, and its closed-form bubble."""
    dp = row.sizes.get("dp", 1)
    pp = row.sizes.get("pp", 1)
    gb = row.global_batch
    if not gb or pp < 2 or row.schedule is None or not row.microbatches:
        return None
    for m in range(2 * row.microbatches, gb // dp + 1):
        if (gb // dp) % m == 0:
            try:
                return m, theory_fraction(row.schedule, pp, m, row.virtual_stages or 1)
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
