"""A GPU job's plan held against its traces: ``compare … --detail`` for runs that are not the
runner's (anyone's Kineto traces, no run.json).

The traces say what ran, not which model or layout: the user says them with ``plan``'s flags
(``--model-json``, ``--seq-len``, ``--global-batch``, ``--micro-batch-size``, ``--device``,
``--style``, ``--dp-modes``, ``--recompute``, ``--precision``) and the analysis' ``--layout``;
``JobDescription`` holds them as the planner's records and plans the job's layout once
(``plan_one``, calibrated by ``--from TRACE`` when given: the device's GEMM curves scaled
through the trace's achieved rate, as ``plan --from TRACE`` does).

    from meshscope.layouts.job_vs_plan import job_vs_plan, render
    j = job_vs_plan(side, row, job)          # a compare Side, its RunRow, a JobDescription
    [(t.term, t.measured, t.planned, t.ratio, t.not_measured) for t in j.rows]

One ``TermRow`` a term, per step:

=============== =============================================================================
term            ``step``, ``compute``, ``exposed <dim>`` for each dimension of the layout and
                each the trace measures (``unknown``: communication without mesh names),
                ``bubble``, ``peak memory`` (allocated: the plan's peak less the allocator's
                reserve), and ``GEMMs`` (the calibration's own term)
measured        the report's number (the compare row's: summary.json's per-rank means, its
                pipeline stages, the allocator's peak; never derived again here); None where
                the trace cannot measure it, ``not_measured`` saying why
planned         the planner's number for the described layout (``StepEstimate``, the
                fullest pipeline rank's memory); None where it has none (``not_planned``)
ratio           measured / planned, where both are known and planned is not 0
=============== =============================================================================

``GEMMs`` is the time the report's 16-bit matrix products took on the GPU (its ``gemms``
table: the profiled steps) against what the device's bf16 curve expects at the same shapes
(``layouts.plan.trace_gemms``, the one reading ``plan --from TRACE`` makes of the same trace,
over the whole trace): ``plan --from`` the same trace scales every GEMM curve by planned /
measured, so its factor is 1 / this ratio where the profiled steps hold the trace's GEMMs (the
corpus' H100 trace), and with ``--from`` given the ratio is close to 1, not 1 (0.990 on the
corpus' H100 trace: ``GemmCurve.scaled`` scales the curve's peak rate, not its fixed cost per
product, which the measured times include).
"""
from __future__ import annotations

import dataclasses
import functools

from meshscope.analysis.compare import Side
from meshscope.analysis.compare.quantities import unattributed
from meshscope.analysis.compare.ranking import Predicted, RunRow
from meshscope.layouts.ranked import predicted_of
from meshscope.vocabulary import COMM_DIMS, PARALLEL_DIMS

__all__ = ["JobDescription", "JobVsPlan", "TermRow", "job_vs_plan", "render"]


@dataclasses.dataclass(frozen=True)
class JobDescription:
    """What the user says of a GPU job its traces cannot: the model, the training setup, the
    device and topology (``plan_inputs``), the layout and batch; ``source`` names the rates
    (the device's curves, or the trace that calibrated them)."""
    spec: object                # layouts.plan.ModelSpec
    training: object            # layouts.plan.training.Training
    device: object | None       # layouts.plan.devices.DeviceSpec; None: memory and traffic only
    topology: object            # layouts.plan.topology.Topology
    options: object             # layouts.plan.job_step.JobOptions
    layout_text: str
    global_batch: int
    micro_batch_size: int
    dp_mode: str
    source: str

    def candidate(self):
        """The described layout as the planner's ``Candidate``; ValueError naming the flag
        when the batch does not divide."""
        from meshscope.layouts.plan import Candidate
        from meshscope.parallel.layout import parse_layout

        layout = parse_layout(self.layout_text)
        dp = layout.size("dp")
        if self.global_batch % (dp * self.micro_batch_size):
            raise ValueError(f"--global-batch {self.global_batch} is not divisible by dp={dp} "
                             f"× --micro-batch-size {self.micro_batch_size}")
        return Candidate(layout=layout, schedule="1f1b",
                         microbatches=self.global_batch // (dp * self.micro_batch_size),
                         dp_mode=self.dp_mode, global_batch=self.global_batch)

    @functools.cached_property
    def row(self):
        """The planner's row for the layout (``plan_one``)."""
        from meshscope.layouts.plan.planner import plan_one

        return plan_one(self.spec, self.candidate(), precision=self.training.as_precision(),
                        training=self.training, device=self.device, topology=self.topology,
                        job_options=self.options)

    def predicted(self) -> Predicted:
        """The row as the comparison's ``Predicted`` (the table's plan ms and plan MB)."""
        return predicted_of(self.row, self.source, self.row.candidate.pp)


@dataclasses.dataclass(frozen=True)
class TermRow:
    term: str
    unit: str                       # "us", "bytes" or "fraction"
    measured: float | None
    planned: float | None
    not_measured: str | None = None     # why measured is None
    not_planned: str | None = None      # why planned is None

    @property
    def ratio(self) -> float | None:
        if self.measured is None or not self.planned:
            return None
        return self.measured / self.planned


@dataclasses.dataclass(frozen=True)
class JobVsPlan:
    run: str
    source: str
    rows: list[TermRow]
    notes: list[str]

    def term(self, name: str) -> TermRow | None:
        return next((r for r in self.rows if r.term == name), None)

    def to_dict(self) -> dict:
        return {"run": self.run, "source": self.source, "notes": self.notes,
                "rows": [{**dataclasses.asdict(r), "ratio": r.ratio} for r in self.rows]}


NO_DEVICE = "no --device (memory and traffic only)"


def _gemms(side: Side, job: JobDescription) -> TermRow:
    """The report's 16-bit GEMMs (its ``gemms`` table, the one reading ``plan --from TRACE``
    makes too: ``layouts.plan.trace_gemms``): their kernels' time against the (calibrated)
    device curve's at their shapes."""
    from meshscope.layouts.plan.trace_gemms import expected_gemm_us, gemms_of_table

    label = "GEMMs"
    if job.device is None:
        return TermRow(label, "us", None, None, not_planned=NO_DEVICE)
    if not side.has_table("gemms"):
        return TermRow(label, "us", None, None,
                       not_measured="the report has no GEMM table (written by an older "
                                    "meshscope: analyse the traces again)",
                       not_planned="nothing measured to plan")
    gemms = gemms_of_table(side.table("gemms"))
    measured = sum(g.kernel_us for g in gemms)
    if not measured:
        return TermRow(label, "us", None, None,
                       not_measured="no 16-bit matrix products with input shapes and kernels "
                                    "(record the trace with record_shapes=True)",
                       not_planned="nothing measured to plan")
    return TermRow(label, "us", measured, expected_gemm_us(gemms, job.device))


def job_vs_plan(side: Side, row: RunRow, job: JobDescription) -> JobVsPlan:
    """The terms of the module docstring for one compared run of a described GPU job."""
    plan = job.row
    est = plan.estimate
    cand = plan.candidate
    no_est = None if est is not None else NO_DEVICE
    rows = [TermRow("step", "us", row.step_time_us, est.step_time_us if est else None,
                    not_measured=None if row.step_time_us is not None else
                    "no step in the trace", not_planned=no_est),
            TermRow("compute", "us", row.compute_us, est.compute_us if est else None,
                    not_measured=None if row.compute_us is not None else
                    "no per-rank breakdown in the report", not_planned=no_est)]
    planned_exposed = dict(est.exposed_comm_us) if est else {}
    dims = [d for d in COMM_DIMS if (d in PARALLEL_DIMS and cand.layout.size(d) > 1)
            or d in planned_exposed or d in row.exposed_comm_us]
    for d in dims:
        why = unattributed(side, f"exposed_comm.{d}") if d != "unknown" else None
        if why:     # --layout is given here (the job's): which of its two uses failed
            why = (f"its communication carries no mesh names and its report maps none of its "
                   f"process groups to a dimension (analysed without --layout "
                   f"{job.layout_text}, or its groups' ranks do not fit it): none of it can "
                   f"be told to be {d}, it is filed under 'unknown'")
        measured = None if why else row.exposed_comm_us.get(d, 0.0)
        planned = planned_exposed.get(d, 0.0) if est else None
        rows.append(TermRow(f"exposed {d}", "us", measured, planned, not_measured=why,
                            not_planned=no_est if est is None else
                            ("the planner has no dimension for communication without mesh "
                             "names" if d == "unknown" else None)))
        if d == "unknown":
            rows[-1] = dataclasses.replace(rows[-1], planned=None)
    if cand.pp > 1:
        rows.append(TermRow("bubble", "fraction", row.bubble_fraction,
                            est.bubble_fraction if est else None,
                            not_measured=None if row.bubble_fraction is not None else
                            "the report has no pipeline stages (send/recv without mesh names: "
                            "give --layout)", not_planned=no_est))
    # allocated against allocated: a trace of anyone's has no step timers, so the report's
    # peak is the allocator's allocated peak (quantities.measure "peak_memory"); the plan's
    # peak less the caching allocator's reserve it adds (job_memory.py)
    peak = plan.peak
    rows.append(TermRow("peak memory", "bytes", row.peak_memory_bytes,
                        peak.total_bytes - float(peak.terms.get("allocator_reserve", 0.0)),
                        not_measured=None if row.peak_memory_bytes is not None else
                        "the traces hold no memory events (record with profile_memory=True)"))
    rows.append(_gemms(side, job))
    notes = []
    if row.ranks != cand.layout.world_size:
        notes.append(f"the layout has {cand.layout.world_size} ranks, the report {row.ranks}: "
                     f"measured terms are its ranks' means")
    if cand.pp == 1:
        notes.append("bubble: no pipeline in the layout (pp=1), none planned")
    return JobVsPlan(run=row.name, source=job.source, rows=rows, notes=notes)


def _value(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "us":
        return f"{x / 1e3:.2f} ms"
    if unit == "bytes":
        return f"{x / 2 ** 30:.2f} GiB"
    return f"{x * 100:.1f}%"


def render(j: JobVsPlan) -> str:
    """The rows as text: term, measured, planned, measured / planned, and why a side is
    missing."""
    lines = [f"  a GPU job's terms, measured (the report) against planned ({j.source}):",
             f"    {'term':<20} {'measured':>12} {'planned':>12} {'ratio':>7}"]
    for r in j.rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        measured = "not measured" if r.measured is None else _value(r.measured, r.unit)
        planned = "not planned" if r.planned is None else _value(r.planned, r.unit)
        why = "; ".join(w for w in (r.not_measured and f"not measured: {r.not_measured}",
                                    r.not_planned and f"not planned: {r.not_planned}") if w)
        lines.append(f"    {r.term:<20} {measured:>12} {planned:>12} {ratio:>7}"
                     + (f"  ({why})" if why else ""))
    lines += [f"    note: {n}" for n in j.notes]
    return "\n".join(lines)
