"""Runs as series of like-for-like runs, and each quantity's trend over a series.

``open_runs(paths)`` opens analysed reports only (a report folder, a run folder holding
``report/``, a folder of either): a history reads, it never analyses or writes. ``split``
puts them, in order (run.json's start time, else as given), into series: a run joins the
first series whose first run it compares like for like with — compare's own comparability
(``analysis/compare/alike.differences``: device, versions, profiler settings, step
definition, world size, layout, schedule) plus the model (run.json's preset) and the device
run.json names — and the rest are kept apart with the differences said. Told so
(``--across layout`` …, ``ACROSS``), a series spans layouts, schedules, models, world sizes
or framework versions; never devices (a run on another device is never like for like).

``trends(series)`` measures each quantity (``analysis/compare/quantities``) on every run: its
value and the run's step-to-step noise of it.
"""
from __future__ import annotations

import dataclasses
import pathlib

from meshscope.analysis.compare import alike
from meshscope.analysis.compare import quantities as Q
from meshscope.analysis.compare.sides import CompareError, Side, is_report_dir, open_side
from meshscope.analysis.timeline.breakdown import DIM_ORDER
from meshscope.collectors.run_dir import ReportDir

from .entry import reports_under

#: The quantities a history follows, where the runs measure them (docs/history.md); each
#: family (``exposed_comm.<dim>``, ``busbw.<dim>.<op>``) is expanded by ``quantity_names``.
DEFAULT_QUANTITIES = ("step_time", "window", "compute", "exposed_comm", "bubble", "other",
                      "idle", "peak_memory", "mfu_pct", "tokens_per_s")
ORDERS = ("start", "given")


class HistoryError(ValueError):
    """Runs that cannot make a history (no report, unreadable); commands exit 2."""


def open_runs(paths) -> list[Side]:
    """The analysed reports at or under ``paths`` as compare's ``Side``s, each named after
    its run; HistoryError naming a path that holds none (``meshscope analyze`` it first)."""
    sides = []
    for p in paths:
        p = pathlib.Path(p)
        if not p.exists():
            raise HistoryError(f"{p}: no such file or directory")
        reports = [p] if is_report_dir(p) else \
            ([ReportDir.of_run(p).path] if is_report_dir(ReportDir.of_run(p).path)
             else reports_under(p))
        if not reports:
            raise HistoryError(f"{p}: holds no analysed report (summary.json): run meshscope "
                               f"analyze on it first — a history only reads")
        for r in reports:
            try:
                sides.append(open_side(r))
            except CompareError as e:
                raise HistoryError(str(e)) from None
    if len({s.name for s in sides}) < len(sides):
        for s in sides:
            s.name = str(s.report_dir.parent if s.report_dir.name == "report" else
                          s.report_dir)
    return sides


def start_time(side: Side) -> str | None:
    return side.info.start_time if side.info is not None else None


def ordered(sides: list[Side], by: str) -> list[Side]:
    """``sides`` by run.json's start time (runs without one last, as given), or as given."""
    if by == "given":
        return list(sides)
    if by != "start":
        raise HistoryError(f"--order {by!r}: one of {', '.join(ORDERS)}")
    return sorted(sides, key=lambda s: (start_time(s) is None, start_time(s) or ""))


def _rank_match(a: Side, b: Side) -> str:
    if set(a.ranks) & set(b.ranks):
        return "id"
    return "position" if len(a.ranks) == len(b.ranks) else "none"


#: What a user may tell a history to follow a series across (``--across``): each a kind of
#: difference ``unlike`` names by the words before its colon.
ACROSS = {"layout": ("layout",), "schedule": ("schedule",), "model": ("model",),
          "world": ("world size", "ranks compared by position", "ranks"),
          "versions": ("PyTorch", "NCCL version", "CUDA runtime", "CUDA driver", "backend")}


def unlike(reference: Side, side: Side, across: tuple[str, ...] = ()) -> list[str]:
    """What keeps ``side`` out of the series ``reference`` starts, one line each (empty:
    like for like); the kinds of difference named in ``across`` (``ACROSS``) do not."""
    out = list(alike.differences(reference, side, _rank_match(reference, side)))
    for what, of in (("model", lambda s: s.summary.model_preset),
                     ("device (run.json)",
                      lambda s: s.summary.run.device.name if s.summary.run else None)):
        x, y = of(reference), of(side)
        if x != y and x is not None and y is not None:
            out.append(f"{what}: {x} → {y}")
    allowed = {w for a in across for w in ACROSS[a]}
    return [line for line in out if line.split(":")[0] not in allowed]


@dataclasses.dataclass
class Series:
    """Runs compared like for like, in order; ``kept_apart`` the runs that were not, each
    with why (against this series' first run)."""
    runs: list[Side]
    kept_apart: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.runs]


def split(sides: list[Side], across: tuple[str, ...] = ()) -> list[Series]:
    """The series of ``sides`` (module docstring), the longest first; each series lists the
    runs kept out of it and why. ``across``: the kinds of difference (``ACROSS``) a series
    may span, as the user said."""
    series: list[Series] = []
    for s in sides:
        for one in series:
            if not unlike(one.runs[0], s, across):
                one.runs.append(s)
                break
        else:
            series.append(Series([s]))
    series.sort(key=lambda x: -len(x.runs))
    for one in series:
        one.kept_apart = [(s.name, unlike(one.runs[0], s, across)) for other in series
                          if other is not one for s in other.runs]
    return series


def quantity_names(runs: list[Side]) -> list[str]:
    """The quantities to follow over ``runs``: ``DEFAULT_QUANTITIES``, exposed communication
    of each dimension and bus bandwidth of each (dimension, op) some run has."""
    names = list(DEFAULT_QUANTITIES)
    dims: set[str] = set()
    ops: set[tuple[str, str]] = set()
    for s in runs:
        bd = s.table("breakdown")
        for d in DIM_ORDER:
            col = f"exposed_comm_{d}_us"
            if col in bd and bd[col].fillna(0).gt(0).any():
                dims.add(d)
        bw = s.table("bandwidth")
        if len(bw):
            known = bw[bw["busbw_gbps"].notna()]
            ops |= {(str(d), str(o)) for d, o in zip(known["dim"], known["op"])}
    names += [f"exposed_comm.{d}" for d in DIM_ORDER if d in dims]
    names += [f"busbw.{d}.{o}" for d, o in sorted(ops) if Q.unit_of(f"busbw.{d}.{o}")]
    return names


@dataclasses.dataclass(frozen=True)
class Trend:
    """One quantity over a series: per run (in the series' order) its value and step-to-step
    noise (None where the run does not measure it / has fewer than three steps)."""
    name: str
    unit: str
    values: tuple[float | None, ...]
    noises: tuple[float | None, ...]


def trend(runs: list[Side], name: str) -> Trend:
    values, noises = [], []
    for s in runs:
        m = Q.measure(s, name)
        values.append(m.value if m else None)
        noises.append(m.noise if m else None)
    return Trend(name, Q.unit_of(name) or "", tuple(values), tuple(noises))


def trends(runs: list[Side], names: list[str] | None = None) -> list[Trend]:
    """Each quantity of ``names`` (default ``quantity_names``) over ``runs``; one no run
    measures is left out."""
    out = [trend(runs, n) for n in (names or quantity_names(runs))]
    return [t for t in out if any(v is not None for v in t.values)]
