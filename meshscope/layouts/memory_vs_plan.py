"""The plan held against the run: the planner's memory terms beside what each rank measured.

    from meshscope.layouts.memory_vs_plan import memory_vs_plan, render
    m = memory_vs_plan(pathlib.Path("runs/dp2-fsdp"))   # an analysed run directory
    m.rows[0].term, m.rows[0].planned_bytes, m.rows[0].measured_bytes, m.rows[0].off_pct
    [r for r in m.rows if r.named]                       # terms more than 10% away

For every rank of the run, each term of the planner's estimate for its pipeline rank
(``layouts/plan/memory.py``: ``weights``, ``grads``, ``optimizer_state``, ``runtime_buffers``,
``activations``) beside the rank's measurement from its report's ``memory_terms`` table
(``analysis/memory/terms.py``), one ``TermRow`` each:

=============== =============================================================================
field           meaning
=============== =============================================================================
rank, pp_rank   the rank and its pipeline coordinate (run.json's mesh)
term            the planner's term
planned_bytes   the planner's bytes for the rank
measured_bytes  what the rank measured; null where nothing measures it (below)
source          where the measurement comes from: ``events`` (the trace's [memory] events:
                gradients freed by ``zero_grad``, optimizer state allocated in the
                optimizer's step and never freed, activations live at the step's peak that
                the forward ranges allocated) or ``census`` (the runner's count of its
                storages, written into its trace; ``collectors/memory_census.py``); events
                are preferred where the trace has them
off_pct         (measured − planned) / planned × 100
named           ``abs(off_pct) > OFF_PCT`` (10): a term the plan gets wrong
=============== =============================================================================

``runtime_buffers`` is measured on a GPU trace only (``runtime_buffers``: the allocator's own
totals at a step's start less the model states, ``source`` ``events - census``). What cannot
be measured is said so, never guessed (``notes``): the runtime buffers (DDP's bucket copies,
FSDP's gathered units) are allocated when the model is wrapped, before the profiler starts,
and the CPU allocator reports nothing older than the profiler, so on a CPU trace no event and
no storage the runner can count shows them.
"""
from __future__ import annotations

import dataclasses
import pathlib

from meshscope.analysis.report import reader
from meshscope.collectors.run_dir import ReportDir, RunDirError
from meshscope.collectors.run_json import read_run_info

OFF_PCT = 10.0
TERMS = ("weights", "grads", "optimizer_state", "runtime_buffers", "activations")
LABELS = {"weights": "parameters", "grads": "gradients", "optimizer_state": "optimizer state",
          "runtime_buffers": "runtime buffers", "activations": "activations"}
SOURCE_ORDER = ("events", "census")


class PlanMemoryError(ValueError):
    """A run whose plan cannot be held against it; the message names the run and why."""


@dataclasses.dataclass(frozen=True)
class TermRow:
    rank: int
    pp_rank: int
    term: str
    planned_bytes: float
    measured_bytes: float | None
    source: str | None
    off_pct: float | None
    named: bool


@dataclasses.dataclass(frozen=True)
class MemoryVsPlan:
    run: str
    rows: list[TermRow]
    notes: list[str]

    @property
    def named(self) -> list[TermRow]:
        return [r for r in self.rows if r.named]

    def to_dict(self) -> dict:
        return {"run": self.run, "rows": [dataclasses.asdict(r) for r in self.rows],
                "notes": self.notes}


def _measured(terms, rank: int) -> dict[str, tuple[float, str]]:
    """term → (bytes, source) of one rank's ``memory_terms`` rows, events before census, the
    rank's main device (an accelerator before the CPU)."""
    mine = terms[terms["rank"] == rank]
    if mine.empty:
        return {}
    devices = sorted(set(mine["device"]), key=lambda d: (d == "cpu", d))
    mine = mine[mine["device"] == devices[0]]
    out = {}
    for source in reversed(SOURCE_ORDER):
        for term, nbytes in zip(mine.loc[mine["source"] == source, "term"],
                                mine.loc[mine["source"] == source, "bytes"]):
            out[str(term)] = (float(nbytes), source)
    return out


def runtime_buffers(devices, steps, got: dict[str, tuple[float, str]], rank: int
                    ) -> float | None:
    """What the rank holds at the start of its steps beyond its model states, where the totals
    are the allocator's own (``absolute``: a GPU trace's; ``analysis/memory/series.py``): the
    lowest start-of-step allocated total, after the first profiled step, less the weights,
    gradients and optimizer state — the runtime buffers and whatever else outlives a step.
    None on a CPU trace, or without all three states."""
    if devices.empty or steps.empty or not all(t in got for t in
                                               ("weights", "grads", "optimizer_state")):
        return None
    mine = devices[(devices["rank"] == rank) & (devices["totals"] == "absolute")]
    if mine.empty:
        return None
    device = mine.sort_values("peak_allocated_bytes", ascending=False)["device"].iloc[0]
    st = steps[(steps["rank"] == rank) & (steps["device"] == device)].sort_values("step")
    if len(st) < 2:
        return None
    start = float(st["start_allocated_bytes"].iloc[1:].min())
    states = sum(got[t][0] for t in ("weights", "grads", "optimizer_state"))
    return max(start - states, 0.0)


def memory_vs_plan(run: pathlib.Path, report_dir: pathlib.Path | None = None,
                   precision: str = "fp32") -> MemoryVsPlan:
    """The rows of the module docstring for the analysed run directory ``run`` (its report in
    ``report_dir``, default ``RUN/report``); PlanMemoryError when the run has no run.json the
    planner can describe."""
    from meshscope.layouts.ranked import candidate_of, spec_of
    from meshscope.layouts.plan import memory

    run = pathlib.Path(run)
    try:
        info = read_run_info(run)
    except RunDirError as e:
        raise PlanMemoryError(str(e)) from None
    if info is None:
        raise PlanMemoryError(f"{run}: no run.json (not a run directory)")
    spec, cand = spec_of(info), candidate_of(info)
    if spec is None or cand is None:
        raise PlanMemoryError(f"{run}: run.json does not describe the model and layout fully "
                              f"enough for the planner")
    plan = {e.pp_rank: e for e in memory(spec, cand, precision)}
    report = ReportDir(pathlib.Path(report_dir)) if report_dir else ReportDir.of_run(run)
    notes = []
    if not reader.table_written(report.path, "memory_terms"):
        notes.append(f"{report.path}: no memory_terms table (analyse the run with this "
                     f"meshscope): nothing measured")
    terms = reader.read_table(report.path, "memory_terms")
    if terms.empty and not notes:
        notes.append(f"{run}: its traces hold no memory measurement (recorded without "
                     f"profile_memory?)")
    devices = reader.read_table(report.path, "memory_devices")
    steps = reader.read_table(report.path, "memory_steps")
    rows = []
    for rank in sorted(info.coordinates):
        pp_rank = int(info.coordinates[rank].get("pp", 0))
        est = plan.get(pp_rank)
        if est is None:
            continue
        got = _measured(terms, rank)
        buffers = runtime_buffers(devices, steps, got, rank)
        if buffers is not None:
            got["runtime_buffers"] = (buffers, "events - census")
        for term in TERMS:
            planned = float(est.terms.get(term, 0.0))
            measured, source = got.get(term, (None, None))
            if measured is None and planned == 0:
                continue
            off = 100.0 * (measured - planned) / planned if measured is not None and planned \
                else None
            rows.append(TermRow(rank=rank, pp_rank=pp_rank, term=term, planned_bytes=planned,
                                measured_bytes=measured, source=source, off_pct=off,
                                named=off is not None and abs(off) > OFF_PCT))
    if any(r.term == "runtime_buffers" and r.measured_bytes is None for r in rows):
        notes.append("runtime buffers (DDP's bucket copies, FSDP's gathered units) are made "
                     "before the profiler starts: a CPU trace cannot show them (a GPU trace "
                     "does: the allocator's own totals at a step's start, less the model "
                     "states)")
    return MemoryVsPlan(run=str(run), rows=rows, notes=notes)


def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / (1 << 20):.2f}"


def render(m: MemoryVsPlan) -> str:
    """The rows as text: one line per rank and term, the terms more than 10% away marked."""
    lines = ["  memory, planned against measured (MiB):",
             "    rank  pp  term               planned  measured  off      source"]
    for r in m.rows:
        off = "-" if r.off_pct is None else f"{r.off_pct:+.1f}%"
        mark = "  <- more than 10% away" if r.named else ""
        lines.append(f"    {r.rank:>4} {r.pp_rank:>3}  {LABELS[r.term]:<17} "
                     f"{_mib(r.planned_bytes):>8} {_mib(r.measured_bytes):>9}  {off:>7}  "
                     f"{r.source or '-'}{mark}")
    lines += [f"    note: {n}" for n in m.notes]
    return "\n".join(lines)
