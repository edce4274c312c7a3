"""``meshscope plan --from RUN``: the cost model's terms measured on one (or more) real runs.

From a measured run of the same model (``Measured``, filled from the run's report by
``layouts.ranked.measured``), each term of ``cost.py`` is solved for in turn:

1. **communication**: the run's own transfers — every matched instance's op, group size,
   message size and transfer time (the report's bandwidth table) — become the comm model's
   table, in front of a ``bench-comm`` baseline when one is given; so the op and size mixes
   the run had are timed as achieved, under that run's contention.
2. **compute**: each rank's measured compute per step (the breakdown's compute less the
   step timers' optimizer time), divided by the run's contention κ, less its FLOPs at the
   device rate R, shared over its layer-microbatches: the fixed cost c₀ of a
   layer-microbatch — or, in a run with tensor parallelism, c₀ + c_tp (c_tp is then what
   that exceeds a tp-free run's c₀, when one is given too).
3. **exposure** of each dimension the run had: its measured exposed time (mean over ranks)
   over the modelled transfer time of that dimension, between 0 and 1.
4. **optimizer**: the step timers' optimizer time per local parameter (÷ κ).
5. **bubble excess**: the measured bubble fraction over the closed form (pipelined runs).
6. **overhead**: what the measured step time exceeds the model's prediction for the run
   itself with the terms above (never negative; with several runs, the smallest).

Several runs (``--from A --from B``) average each term over the runs that determine it.
What a run cannot tell (the DTensor cost c_tp without a tp run, a pipeline's excess without a
pipeline) keeps its assumed value; ``Calibration.notes`` says which.
"""
from __future__ import annotations

import dataclasses
import statistics

from meshscope.theory.schedules import bubble_fraction as theory_fraction

from .candidate import Candidate
from .comm_model import CommModel
from .cost import (Rates, contention, dim_transfer_us, layer_microbatches, local_params,
                   predict, rank_flops)
from .spec import ModelSpec
from .traffic import transfers


@dataclasses.dataclass(frozen=True)
class Measured:
    """What calibration reads of a measured run (all per step)."""
    name: str
    spec: ModelSpec
    candidate: Candidate
    step_time_us: float
    compute_us: dict[int, float]          # rank -> compute per profiled step (breakdown)
    optimizer_us: float                   # the slowest rank's optimizer phase (step timers)
    exposed_comm_us: dict[str, float]     # dim -> mean over ranks
    bubble_fraction: float | None         # mean over pipeline stages
    transfers: list[dict]                 # op, n_ranks, size_bytes, time_us per instance


@dataclasses.dataclass(frozen=True)
class Calibration:
    rates: Rates
    comm: CommModel
    notes: list[str]


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def calibrate(runs: list[Measured], base: Rates, baseline: CommModel | None = None
              ) -> Calibration:
    if not runs:
        raise ValueError("calibration needs at least one measured run")
    notes = []
    comm = None
    for m in runs:
        table = CommModel.from_rows(m.transfers, alpha_us=base_alpha(baseline),
                                    busbw_gbps=base_bw(baseline), source=f"measured in {m.name}")
        comm = table if comm is None else comm.merged(table)
    if baseline is not None:
        comm = comm.merged(baseline)
    c0s, ctps, opts, excess = [], [], [], []
    for m in runs:
        cand, kappa = m.candidate, contention(m.candidate, base)
        per_lm = []
        for rank, c in m.compute_us.items():
            r = cand.layout.coordinates(rank)["pp"]
            flops_us = rank_flops(m.spec, cand, r) / base.flops_per_s * 1e6
            fb = max(0.0, c - m.optimizer_us)
            per_lm.append(max(0.0, fb / kappa - flops_us) / layer_microbatches(m.spec, cand, r))
        (ctps if cand.layout.size("tp") > 1 else c0s).append(statistics.fmean(per_lm))
        params = max(local_params(m.spec, cand, r) for r in range(cand.pp))
        if m.optimizer_us > 0 and params:
            opts.append(m.optimizer_us / kappa / params * 1e3)
        theory = theory_fraction(cand.schedule, cand.pp, cand.microbatches, cand.v)
        if cand.pp > 1 and theory > 0 and m.bubble_fraction:
            excess.append(m.bubble_fraction / theory)
    c0 = _mean(c0s)
    c_tp = _mean(ctps)
    if c0 is None:
        c0, c_tp = 0.0, c_tp
        notes.append("no calibration run without tensor parallelism: its per-layer cost is "
                     "folded into the tp runs' (c₀ = 0)")
    elif c_tp is not None:
        c_tp = max(0.0, c_tp - c0)
    if c_tp is None:
        c_tp = base.tp_layer_overhead_us
        notes.append("no calibration run with tensor parallelism: DTensor's per-layer host "
                     "cost is not known and tp layouts are predicted without it")
    if not excess:
        notes.append("no pipelined calibration run: bubbles at the schedule's closed form")
    exposure: dict[str, list[float]] = {}
    for m in runs:
        trs = transfers(m.spec, m.candidate)
        modelled: dict[str, list[float]] = {}
        for rank in range(m.candidate.layout.world_size):
            r = m.candidate.layout.coordinates(rank)["pp"]
            for dim, t in dim_transfer_us(trs, comm, r).items():
                modelled.setdefault("dp" if dim == "ep_replica" else dim, []).append(t)
        for dim, ts in modelled.items():
            t = statistics.fmean(ts)
            if t > 0 and dim in m.exposed_comm_us:
                exposure.setdefault(dim, []).append(min(1.0, m.exposed_comm_us[dim] / t))
    rates = dataclasses.replace(
        base, layer_overhead_us=c0, tp_layer_overhead_us=c_tp,
        optimizer_ns_per_param=_mean(opts) or base.optimizer_ns_per_param,
        bubble_excess=_mean(excess) or base.bubble_excess,
        exposure=tuple(sorted((d, statistics.fmean(v)) for d, v in exposure.items())),
        step_overhead_us=0.0,
        source=f"calibrated from {', '.join(m.name for m in runs)}")
    residuals = [m.step_time_us - predict(m.spec, m.candidate, rates, comm).step_time_us
                 for m in runs]
    # A fixed cost every layout pays: the smallest run's residual (a tp run's is mostly
    # DTensor's, which c_tp already carries for tp layouts only).
    rates = dataclasses.replace(rates, step_overhead_us=max(0.0, min(residuals)))
    return Calibration(rates=rates, comm=comm, notes=notes)


def base_alpha(baseline: CommModel | None) -> float:
    return baseline.alpha_us if baseline is not None else CommModel().alpha_us


def base_bw(baseline: CommModel | None) -> float:
    return baseline.busbw_gbps if baseline is not None else CommModel().busbw_gbps
