"""Runs ranked with the planner's predictions beside them: ``compare(paths) -> Comparison``
(``meshscope compare`` of three or more runs or of a sweep folder, the sweep's own
comparison.json, the dashboard's compare page).

The ranking itself is the analysis' (``meshscope.analysis.compare.ranking``: every measured
number read from the run's report); this module adds what belongs to the planner, which sits
above the analysis: a sweep folder's runs and the ones that failed (``sweep.json``), the
planner's numbers for each run's layout (``Predicted``, from the sweep's plan.json rates, a
calibration ``--from``, or memory and traffic only), and ``measured(run)``, a run as the
planner calibrates from it (``plan --from``).

    from meshscope.layouts.ranked import compare
    c = compare(["runs/dp4", "runs/dp2-pp2"])      # run directories, or one sweep folder
    c.winner.name, c.rows[0].step_time_us, c.explanations
"""
from __future__ import annotations

import pathlib

from meshscope.analysis.compare import CompareError, Comparison, Side, open_side, rank
from meshscope.analysis.compare.sides import label_of
from meshscope.analysis.compare.ranking import FailedRun, Predicted, mean_known, num_or_none
from meshscope.analysis.records.steps import slowest_rank_per_step
from meshscope.collectors import step_timer
from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.run_info import RunInfo
from meshscope.collectors.run_json import read_run_info
from meshscope.vocabulary import COMM_DIMS

__all__ = ["CompareError", "calibrated_planner", "candidate_of", "compare", "default_planner",
           "predictor",
           "measured", "spec_of", "sweep_planner"]


def _run_info(run: pathlib.Path) -> RunInfo:
    try:
        info = read_run_info(run)
    except RunDirError as e:
        raise CompareError(str(e)) from None
    if info is None:
        raise CompareError(f"{run}: no run.json (not a run directory)")
    return info


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


def predictor(planner, job=None):
    """``predict(side) -> Predicted | None`` for ``analysis.compare.rank``: the planner's
    numbers for the side's layout (None for a run without run.json or a full description);
    a run without run.json (anyone's traces) gets the described GPU job's (``job``, a
    ``layouts.job_vs_plan.JobDescription``), when given."""
    def predict(side: Side) -> Predicted | None:
        if side.info is None:
            return job.predicted() if job is not None else None
        return _predicted(side.info, planner)
    return predict


def _predicted(info: RunInfo, planner) -> Predicted | None:
    if planner is None:
        return None
    spec, cand = spec_of(info), candidate_of(info)
    if spec is None or cand is None:
        return None
    row = planner(spec, cand)
    if row is None:
        return None
    return predicted_of(row, planner.source if hasattr(planner, "source") else "plan",
                        cand.pp)


def predicted_of(row, source: str, pp: int) -> Predicted:
    """A planner's row (``plan_one``'s) as the comparison's ``Predicted``; the bubble only
    where the layout has a pipeline (``pp`` > 1)."""
    peak = row.peak
    est = row.estimate
    return Predicted(
        source=source,
        step_time_us=est.step_time_us if est else None,
        tokens_per_s=est.tokens_per_s if est else None,
        compute_us=est.compute_us if est else None,
        exposed_comm_us=dict(est.exposed_comm_us) if est else {},
        bubble_fraction=est.bubble_fraction if est and pp > 1 else None,
        peak_memory_bytes=peak.total_bytes,
        memory_terms={"params_bytes": peak.params_bytes, "grads_bytes": peak.grads_bytes,
                      "optimizer_bytes": peak.optimizer_bytes,
                      "buffers_bytes": peak.buffers_bytes,
                      "activations_bytes": peak.activations_bytes},
        comm_bytes=dict(row.comm_bytes))


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
    side = open_side(run)
    typed = side.summary
    bd, bw = side.table("breakdown"), side.table("bandwidth")
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
    # T over the profiled steps (records/steps.py: which steps each median of T is over).
    step_time = float(slowest_rank_per_step(steps).median())
    optimizer = num_or_none(slowest_rank_per_step(steps, "optimizer_us").median())
    exposed = {}
    for d in COMM_DIMS:
        col = f"exposed_comm_{d}_us"
        if col in per_rank:
            exposed[d] = float(per_rank[col].mean())
    stages = typed.pipeline_stages
    transfers = []
    for row in bw.itertuples():
        if num_or_none(row.transfer_us) and num_or_none(row.msg_bytes) and num_or_none(row.group_size):
            transfers.append({"op": row.op, "n_ranks": int(row.group_size),
                              "size_bytes": float(row.msg_bytes),
                              "time_us": float(row.transfer_us)})
    return Measured(name=run.name, spec=spec, candidate=cand, step_time_us=step_time,
                    compute_us=compute, optimizer_us=optimizer or 0.0, exposed_comm_us=exposed,
                    bubble_fraction=mean_known(s.bubble_fraction for s in stages),
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


def compare(paths, *, planner=None, job=None, **open_kw) -> Comparison:
    """Compare run directories, folders of traces and reports, or the runs of one sweep folder
    (``paths`` a folder holding sweep.json), ranked (``analysis.compare.rank``).
    ``planner(spec, candidate) -> PlanRow | None`` adds predictions (default: the sweep's own
    plan.json when comparing a sweep, else memory and traffic only); ``job`` (a
    ``layouts.job_vs_plan.JobDescription``) predicts the runs without run.json; ``open_kw``
    go to ``analysis.compare.open_side`` (how a path that is not analysed yet is analysed)."""
    if isinstance(paths, (str, pathlib.Path)):
        paths = [paths]
    paths = [pathlib.Path(p) for p in paths]
    if not paths:
        raise CompareError("nothing to compare: give run directories or a sweep folder")
    failed: list[FailedRun] = []
    if len(paths) == 1 and (paths[0] / "sweep.json").exists():
        named, failed = _sweep_runs(paths[0])
        source = str(paths[0])
        if planner is None:
            planner = sweep_planner(paths[0])
    else:
        for p in paths:
            if not p.exists():
                raise CompareError(f"{p}: no such run directory")
        named = [(label_of(p), p) for p in paths]
        source = ", ".join(map(str, paths))
    if planner is None:
        planner = default_planner()
    names = [n for n, _ in named]
    dup = {n for n in names if names.count(n) > 1}
    sides = [open_side(p, name=(f"{p.resolve().parent.name}/{n}" if n in dup else n),
                       **open_kw)
             for n, p in named]
    return rank(sides, predict=predictor(planner, job), failed=failed, source=source)


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


