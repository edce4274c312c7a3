"""A step-time model: compute, communication per dimension, pipeline bubble, term by term.

For each pipeline rank r of a layout (``StepEstimate`` for the slowest), with m microbatches,
p pipeline ranks, v stages per rank:

- **compute** of forward and backward: κ · (F_r / R + n_r · (c₀ + c_tp)). F_r is the rank's
  training FLOPs per step (6 × its share of the active weights per token, attention's
  12·h·s per token and layer, the head's 6·h·V; divided by tp, the tokens by dp and cp), R the
  device's sustained FLOP/s, n_r the rank's layer-microbatches (layers × m) and c₀ the
  framework's fixed cost of one layer-microbatch (c_tp more with tensor parallelism: DTensor's
  dispatch) — both 0 unless calibrated (``calibrate.py``). κ is contention: ranks sharing
  fewer devices (a CPU's cores) run κ = max(1, busy ranks / devices) times slower, busy ranks
  being the world less the pipeline's bubble.
- **communication** (``traffic.py`` for what moves, ``comm_model.py`` for how long): tp and ep
  collectives block the microbatch that issues them; a pipeline transfer (one send and one
  receive) delays each microbatch once; the context-parallel ring's forward exchanges overlap
  the attention of the block in hand, its backward ones block; data parallelism's bucketed
  all-reduce overlaps the last microbatch's backward (about 2/3 of its compute) except its last
  bucket, FSDP's all-gathers are prefetched behind compute except the first of each pass.
  A calibrated ``exposure[dim]`` (measured exposed time / modelled transfer time) replaces
  these rules for a dimension the calibration run had.
- **pipeline**: T = T_mb · (m + i · e), i the schedule's idle microbatches
  (``theory/schedules.idle_microbatches``: p−1 for GPipe and 1F1B, (p−1)/v interleaved or
  looped BFS, (p−1)/(3v) for the zero-bubble schedules — the bubble of ``bubble_fraction``
  when e = 1; e is a calibrated measured-over-theory excess), T_mb the slowest rank's compute
  and blocking communication per microbatch.
- **step** = T + exposed data-parallel communication + optimizer (κ · local parameters · a
  calibrated or assumed cost per parameter, plus tensor parallelism's optimizer all-reduces)
  + a calibrated fixed overhead per step.

tokens/s = global batch × sequence / step; MFU = FLOPs per token × tokens/s / (world × peak)
(``analysis.records.steps.throughput``'s definition) when the peak is known.
"""
from __future__ import annotations

import dataclasses

from meshscope.theory.flops import head_training_flops_per_token, layer_training_flops_per_token
from meshscope.theory.schedules import bubble_fraction as theory_fraction
from meshscope.theory.schedules import idle_microbatches

from .candidate import Candidate
from .comm_model import CommModel
from .precision import Precision, precision_of
from .spec import ModelSpec
from .traffic import Transfer, shape_of, transfers

CPU_ASSUMED_FLOPS = 20e9         # one core, fp32, the small matmuls of a tiny model (assumed)
ASSUMED_OPTIMIZER_NS_PER_PARAM = 2.0
BACKWARD_SHARE = 2 / 3           # backward ≈ 2× forward (the 6N rule's 4N of 6N)


@dataclasses.dataclass(frozen=True)
class Rates:
    """What the device and framework cost; see the module docstring for each term."""
    flops_per_s: float
    devices: int | None = None               # devices the ranks share; None: one per rank
    layer_overhead_us: float = 0.0           # c₀
    tp_layer_overhead_us: float = 0.0        # c_tp
    optimizer_ns_per_param: float = ASSUMED_OPTIMIZER_NS_PER_PARAM
    step_overhead_us: float = 0.0
    bubble_excess: float = 1.0
    exposure: tuple[tuple[str, float], ...] = ()     # (dim, exposed share), calibrated
    peak_flops: float | None = None          # for MFU only
    source: str = "assumed"

    def exposure_of(self, dim: str) -> float | None:
        return dict(self.exposure).get(dim)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["exposure"] = dict(self.exposure)
        return d


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    step_time_us: float
    compute_us: float                # forward, backward and optimizer on the slowest rank
    optimizer_us: float
    exposed_comm_us: dict[str, float]
    bubble_us: float
    bubble_fraction: float
    overhead_us: float
    tokens_per_s: float
    mfu_pct: float | None
    critical_pp_rank: int
    terms: dict = dataclasses.field(default_factory=dict)   # every term (job_step.py)
    hw_tflops_per_gpu: float | None = None                  # with recomputation's FLOPs
    fp8_tflops_per_gpu: float | None = None                 # FLOP/s run in fp8 GEMMs

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def layer_flops_per_token(spec: ModelSpec, i: int) -> float:
    """Training FLOPs per token of layer ``i``: 6 × the weights a token passes through, plus
    attention's 12·h·s (``meshscope.theory.flops.layer_training_flops_per_token``)."""
    return layer_training_flops_per_token(spec.shape, i)


def rank_flops(spec: ModelSpec, cand: Candidate, pp_rank: int) -> float:
    """Training FLOPs of one step on a rank of pipeline coordinate ``pp_rank``."""
    sh = shape_of(spec, cand)
    tp = cand.layout.size("tp")
    layers_of = cand.stage_layers(spec.n_layers)
    per_token = 0.0
    for stage in cand.stages_of(pp_rank):
        per_token += sum(layer_flops_per_token(spec, i) for i in layers_of[stage])
        if stage == cand.n_stages - 1:
            per_token += head_training_flops_per_token(spec.shape)
    return per_token * sh.tokens * sh.m / tp


def layer_microbatches(spec: ModelSpec, cand: Candidate, pp_rank: int) -> int:
    layers_of = cand.stage_layers(spec.n_layers)
    return sum(len(layers_of[s]) for s in cand.stages_of(pp_rank)) * cand.microbatches


def local_params(spec: ModelSpec, cand: Candidate, pp_rank: int) -> float:
    """Parameters the optimizer updates on one rank (tp-split, ZeRO-1+ sharded, experts /ep)."""
    tp, ep = cand.layout.size("tp"), cand.layout.size("ep")
    layers_of = cand.stage_layers(spec.n_layers)
    dense = experts = 0.0
    for stage in cand.stages_of(pp_rank):
        groups = spec.stage_params(layers_of[stage], first=stage == 0,
                                   last=stage == cand.n_stages - 1)
        for p in (p for g in groups for p in g):
            n = p.local_numel(tp)
            if p.name.startswith("expert"):
                experts += n / ep
            else:
                dense += n
    return dense / (cand.dp_shards if cand.zero_stage >= 1 else 1) + experts


def contention(cand: Candidate, rates: Rates) -> float:
    """κ: how many times slower a rank computes because busy ranks outnumber devices."""
    if not rates.devices:
        return 1.0
    busy = cand.layout.world_size * (1.0 - theory_fraction(cand.schedule, cand.pp,
                                                            cand.microbatches, cand.v))
    return max(1.0, busy / rates.devices)


def _time(comm: CommModel, t: Transfer) -> float:
    return t.count * comm.time_us(t.op, t.group_size, t.msg_bytes)


def dim_transfer_us(trs: list[Transfer], comm: CommModel, pp_rank: int) -> dict[str, float]:
    """Modelled transfer time per step of each dimension on a rank (a p2p transfer counted
    once: half of its send and receive rows)."""
    out: dict[str, float] = {}
    for t in trs:
        if t.pp_rank != pp_rank:
            continue
        share = 0.5 if t.dim == "pp" else 1.0
        out[t.dim] = out.get(t.dim, 0.0) + share * _time(comm, t)
    return out


@dataclasses.dataclass(frozen=True)
class _RankTime:
    """One pipeline rank's share of a step, as ``predict`` combines the ranks (µs)."""
    rank: int
    compute_us: float                  # forward and backward of all its microbatches
    exposed_us: dict[str, float]       # blocking communication per dimension, per step
    dp_us: float                       # exposed data-parallel communication
    optimizer_us: float
    opt_comm_us: float                 # tensor parallelism's optimizer all-reduces
    per_mb_us: float                   # compute and blocking communication per microbatch


def _blocking_comm_us(spec: ModelSpec, cand: Candidate, rates: Rates, comm: CommModel,
                      mine: list[Transfer], kappa: float, n_lm: int) -> dict[str, float]:
    """The exposed time per step of each dimension whose operations sit inside the
    microbatches (tp, ep, pp, cp) on one rank, whose transfers are ``mine``: all of it but
    what a calibrated exposure or the context-parallel ring's overlap with attention hides;
    a dimension without such operations is absent."""
    tp = cand.layout.size("tp")
    exposed: dict[str, float] = {}
    for dim in ("tp", "ep", "pp", "cp"):
        rows = [t for t in mine if t.dim == dim and t.phase == "microbatch"]
        if not rows:
            continue
        total = sum(_time(comm, t) for t in rows) * (0.5 if dim == "pp" else 1.0)
        share = rates.exposure_of(dim)
        if share is not None:
            exposed[dim] = share * total
        elif dim == "cp":
            cp = cand.layout.size("cp")
            fwd = total * 3 * (cp - 1) / (3 * (cp - 1) + 5 * cp)
            attn = kappa * 4 * spec.dim * spec.seq_len * shape_of(spec, cand).tokens \
                * n_lm / tp / rates.flops_per_s * 1e6
            exposed[dim] = (total - fwd) + max(0.0, fwd - attn)
        else:
            exposed[dim] = total
    return exposed


def _dp_exposed_us(rates: Rates, comm: CommModel, mine: list[Transfer], compute_us: float,
                   m: int) -> float:
    """The exposed time per step of data parallelism (and the experts' replicas) on one
    rank, whose transfers are ``mine``: a calibrated share of it, or else the bucketed
    reductions less what the last microbatch's backward hides (never the last bucket) plus
    FSDP's gathers less what the compute hides (never the first of each pass); 0 without
    data parallelism."""
    dp_rows = [t for t in mine if t.dim in ("dp", "ep_replica")]
    if not dp_rows:
        return 0.0
    share = rates.exposure_of("dp")
    step_rows = [t for t in dp_rows if t.phase == "step"]
    gathers = [t for t in dp_rows if t.phase == "microbatch"]
    total = sum(_time(comm, t) for t in dp_rows)
    if share is not None:
        return share * total
    dp_exposed = 0.0
    last_bwd = BACKWARD_SHARE * compute_us / m
    times = [comm.time_us(t.op, t.group_size, t.msg_bytes)
             for t in step_rows for _ in range(t.count)]
    if times:
        dp_exposed += times[-1] + max(0.0, sum(times[:-1]) - last_bwd)
    if gathers:
        g_total = sum(_time(comm, t) for t in gathers)
        first = comm.time_us(gathers[0].op, gathers[0].group_size, gathers[0].msg_bytes)
        passes = gathers[0].count
        dp_exposed += first * passes + max(0.0, g_total - first * passes - compute_us)
    return dp_exposed


def _rank_time(spec: ModelSpec, cand: Candidate, rates: Rates, comm: CommModel,
               trs: list[Transfer], kappa: float, r: int) -> _RankTime:
    """Pipeline rank ``r``'s compute, exposed communication and optimizer time of one step
    (the module docstring's terms), under contention ``kappa``."""
    m = cand.microbatches
    tp = cand.layout.size("tp")
    flops = rank_flops(spec, cand, r)
    n_lm = layer_microbatches(spec, cand, r)
    compute = kappa * (flops / rates.flops_per_s * 1e6 + n_lm * (
        rates.layer_overhead_us + (rates.tp_layer_overhead_us if tp > 1 else 0.0)))
    mine = [t for t in trs if t.pp_rank == r]
    exposed = _blocking_comm_us(spec, cand, rates, comm, mine, kappa, n_lm)
    opt_comm = sum(_time(comm, t) for t in mine if t.phase == "optimizer")
    optimizer = kappa * local_params(spec, cand, r) * rates.optimizer_ns_per_param / 1e3
    return _RankTime(rank=r, compute_us=compute, exposed_us=exposed,
                     dp_us=_dp_exposed_us(rates, comm, mine, compute, m),
                     optimizer_us=optimizer, opt_comm_us=opt_comm,
                     per_mb_us=(compute + sum(exposed.values())) / m)


def _pipeline_us(per_mb_us: float, cand: Candidate, rates: Rates) -> float:
    """The microbatches' time on the slowest rank through the schedule: ``per_mb_us`` × (m +
    the schedule's idle microbatches × the calibrated excess)."""
    m, p, v = cand.microbatches, cand.pp, cand.v
    return per_mb_us * (m + idle_microbatches(cand.schedule, p, m, v) * rates.bubble_excess)


def exposed_comm_by_dim(blocking_us: dict[str, float], dp_us: float, opt_comm_us: float
                        ) -> dict[str, float]:
    """The step's exposed communication per dimension, for both step models (this one and a
    GPU job's, ``job_step.py``): the slowest rank's blocking dimensions per step
    (``blocking_us``), data parallelism's worst rank (``dp_us``, absent when 0), and the
    optimizer phase's communication under tp (``opt_comm_us``)."""
    exposed = dict(blocking_us)
    if dp_us:
        exposed["dp"] = dp_us
    if opt_comm_us:
        exposed["tp"] = exposed.get("tp", 0.0) + opt_comm_us
    return exposed


def predict(spec: ModelSpec, cand: Candidate, rates: Rates, comm: CommModel,
            precision: Precision | str = "fp32") -> StepEstimate:
    """The step of ``cand`` (the module docstring's terms), its slowest pipeline rank's."""
    prec = precision_of(precision)
    trs = transfers(spec, cand, prec)
    kappa = contention(cand, rates)
    per_rank = [_rank_time(spec, cand, rates, comm, trs, kappa, r) for r in range(cand.pp)]
    crit = max(per_rank, key=lambda x: x.per_mb_us)
    pipe = _pipeline_us(crit.per_mb_us, cand, rates)
    bubble = pipe - crit.per_mb_us * cand.microbatches
    tail = max(x.dp_us + x.optimizer_us + x.opt_comm_us for x in per_rank)
    step = pipe + tail + rates.step_overhead_us
    exposed = exposed_comm_by_dim(crit.exposed_us, max(x.dp_us for x in per_rank),
                                  crit.opt_comm_us)
    tokens_per_s = cand.global_batch * spec.seq_len / (step / 1e6)
    mfu = (spec.flops_per_token() * tokens_per_s / (cand.layout.world_size * rates.peak_flops)
           * 100) if rates.peak_flops else None
    return StepEstimate(step_time_us=step, compute_us=crit.compute_us + crit.optimizer_us,
                        optimizer_us=crit.optimizer_us, exposed_comm_us=exposed,
                        bubble_us=bubble, bubble_fraction=bubble / pipe if pipe else 0.0,
                        overhead_us=rates.step_overhead_us, tokens_per_s=tokens_per_s,
                        mfu_pct=mfu, critical_pp_rank=crit.rank)
