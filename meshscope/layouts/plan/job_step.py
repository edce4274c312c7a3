"""Step time of a GPU job, from a model a reviewer can follow term by term.

For the slowest pipeline rank, with m microbatches, p pipeline ranks and v stages per rank:

1. **compute** of one microbatch, operation by operation (``job_compute.microbatch_work``:
   every GEMM on the device's curve for its precision, the attention core at the device's
   flash-attention efficiency, memory-bound kernels over its memory bandwidth, recomputation),
   derated by ``TRAINING_DERATE`` (a training step runs below a lone kernel's rate).
2. **communication** per microbatch, each collective on its link level (``topology.py``):
   of each dimension the fraction ``Training.overlap_of(dim)`` is hidden behind compute
   (per style: Megatron, FSDP, DeepSpeed; ``--overlap dim=f`` sets one) — cp's ring behind
   the attention it feeds, dp's reduce-scatter / all-reduce behind the last microbatch's
   backward, the distributed optimizer's and FSDP's weight gathers behind the forward they
   precede (all but the first) — and the rest is exposed (torch's own ring attention, whose
   K, V all-gather hides behind one ring step only: ``_torch_ring_hidden_us``). An MoE
   layer's token dispatch and
   combine split between the network and NVLink as its dispatcher sends them
   (``moe_dispatch.py``: an NCCL all-to-all sends every routed copy, DeepEP one copy a remote
   node), the two links at once. Hidden communication still slows
   the compute beside it by ``CONTENTION`` of its time (NCCL's kernels take SMs and memory
   bandwidth).
3. **pipeline**: T_mb · (m + i), i the schedule's idle microbatches
   (``theory/schedules.idle_microbatches``: p − 1 for GPipe and 1F1B, (p − 1)/v interleaved,
   (p − 1)/(3v) for the zero-bubble schedules, whose weight gradients fill all but p − 1
   chunk-forward slots; the bubble is the second term).
4. **optimizer**: the bytes the update reads and writes per local parameter (Adam in mixed
   precision: the fp32 gradient, master weight and two moments read and written, the 16-bit
   weight written) over the achieved memory bandwidth; on the host's with ``offload``.

MFU = model FLOPs (6 × active parameters + attention's products; no recomputation) ×
tokens/s ÷ (GPUs × the **bf16** peak), whatever the GEMMs' precision; the FLOP/s run in fp8
are stated beside it (``fp8_tflops_per_gpu``). ``hw_tflops_per_gpu`` counts recomputation as
Megatron-LM's throughput table does (Narayanan et al. 2021, eq. 3).
"""
from __future__ import annotations

import dataclasses

from meshscope.theory.schedules import idle_microbatches

from .candidate import Candidate
from .cost import StepEstimate, exposed_comm_by_dim
from .devices import DeviceSpec, GemmCurve
from .job_compute import (TRAINING_DERATE, MicrobatchWork, hardware_flops_per_token,
                          microbatch_work, model_flops_per_token)
from .job_memory import local_weights
from .moe_dispatch import Dispatch
from .spec import ModelSpec
from .topology import Topology
from .traffic import Transfer, transfers
from .training import Training

HOST_MEMORY_BYTES_S = 100e9     # a two-socket host's DRAM (offloaded optimizer step), assumed
PCIE_BYTES_S = 25e9             # PCIe 4 x16 per GPU, achieved, assumed
# The slowdown of compute while communication it hides runs beside it, as a fraction of the
# hidden communication's time (NCCL's kernels occupy SMs and memory bandwidth). Assumed.
CONTENTION = 0.1


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """Options that change time, not memory. ``dp_overlap`` False / ``tp_overlap`` True are
    the older switches for ``Training.overlap`` dp = 0 / tp = 1."""
    dp_overlap: bool = True
    tp_overlap: bool = False
    step_overhead_us: float = 0.0
    derate: float | None = None          # None: TRAINING_DERATE


def optimizer_bytes_per_param(t: Training) -> float:
    """Bytes the update reads and writes per parameter it owns."""
    grad = 4 if (t.precision == "fp32" or t.main_grads_fp32) else 2
    moments = {"adam": 2, "sgd": 1, "adafactor": 0}[t.optimizer] * t.state_bytes
    master = 4 if t.precision in ("mixed", "fp8") else 0
    weight = t.weight_bytes
    return grad + 2 * (moments + master) + (weight if master else 2 * weight)


def _t(topo: Topology, cand: Candidate, tr: Transfer, dispatch: Dispatch | None = None
       ) -> float:
    if dispatch is not None and tr.dim == "ep" and tr.op == "all_to_all" \
            and "dispatch" in tr.what:
        return tr.count * dispatch.time_us(tr.msg_bytes, topo.intra, topo.inter)
    comm = topo.comm_for(cand, tr.dim, tr.op)
    return tr.count * comm.time_us(tr.op, tr.group_size, tr.msg_bytes)


def dispatch_of(spec: ModelSpec, cand: Candidate, t: Training, topo: Topology
                ) -> Dispatch | None:
    """How this job's MoE dispatch splits between the network and NVLink
    (``moe_dispatch.py``); None without expert parallelism."""
    ep = cand.layout.size("ep")
    if ep == 1 or not spec.moe_experts:
        return None
    return Dispatch.of(spec, ep, topo.ranks_per_node(cand, "ep"), t.ep_dispatcher,
                       t.moe_routing, t.capacity_factor or 1.0)


def _overlap(t: Training, opts: JobOptions, dim: str) -> float:
    if dim == "tp" and opts.tp_overlap:
        return 1.0
    if dim == "dp" and not opts.dp_overlap:
        return 0.0
    return t.overlap_of(dim)


@dataclasses.dataclass(frozen=True)
class _RankStep:
    """One pipeline rank's share of a GPU job's step, as ``predict_job`` combines the ranks
    (µs)."""
    rank: int
    work: MicrobatchWork
    compute_mb_us: float                # a microbatch's compute, contention included
    exposed_mb_us: dict[str, float]     # tp, cp, ep, pp: exposed a microbatch
    contention_mb_us: float
    dp_us: float                        # exposed dp and ep_replica communication a step
    dp_contention_us: float
    optimizer_us: float
    opt_comm_us: float                  # communication in the optimizer phase
    t_mb_us: float                      # a microbatch: compute, contention, exposed comm


def _fsdp_copy_us(mine: list[Transfer], m: int, device: DeviceSpec) -> float:
    """The memory-bound time a microbatch of FSDP's copies around its collectives on a rank
    whose transfers are ``mine``: the gathered weights copied out to the unsharded
    parameters and the gradients copied in (and cast) to the reduce buffer, twice the bytes
    of its microbatch-phase dp and ep_replica operations; 0 without them."""
    copies = sum(2 * x.count * x.msg_bytes for x in mine
                 if x.dim in ("dp", "ep_replica") and x.phase == "microbatch")
    return copies / m / device.memory_achieved_bytes_s * 1e6


def _async_dgrad_us(cand: Candidate, t: Training, topo: Topology, opts: JobOptions,
                    rows: list[Transfer]) -> float:
    """The time a step of Megatron's asynchronous tensor-parallel input-gradient collectives
    among tp's ``rows``: of each layer's four activation collectives of a kind (all-reduces
    without sequence parallelism, reduce-scatters with it), the two in the backward of the
    column-parallel linears (QKV, the MLP's first), which Megatron-Core launches
    asynchronously and runs beside the weight-gradient GEMM
    (``LinearWithGradAccumulationAndAsyncCommunication``; ``async_tensor_model_parallel_
    allreduce`` defaults to True, ``model_parallel_config.py``). 0 for other styles, with
    ``--overlap tp=…`` given (the user's fraction then covers all of tp) or a whole
    overlap already."""
    if t.job_style != "megatron" or "tp" in dict(t.overlap) or _overlap(t, opts, "tp") >= 1:
        return 0.0
    op = "reduce_scatter" if cand.sp else "all_reduce"
    m = cand.microbatches
    total = 0.0
    for x in rows:
        if x.op != op or "activations" not in x.what or "recomputed" in x.what:
            continue
        per_mb = x.count // m       # 4 a layer, one more on the first and the last stage
        total += _t(topo, cand, x) * (per_mb // 4 * 2) / per_mb if per_mb else 0.0
    return total


def _microbatch_comm_us(cand: Candidate, t: Training, topo: Topology, opts: JobOptions,
                        mine: list[Transfer], dispatch: Dispatch | None,
                        attention_forward_us: float, compute_mb_us: float,
                        column_wgrad_us: float = 0.0) -> tuple[dict[str, float], float]:
    """(the exposed time a microbatch of each dimension that communicates inside the
    microbatches — tp, cp, ep, pp; one without such operations is absent —, the time hidden
    behind compute) on a rank whose transfers are ``mine``: each dimension's overlap
    fraction of its time is hidden, at most its window (cp: the attention it feeds; the
    others: the microbatch's compute). Megatron's asynchronous input-gradient collectives
    of tp (``_async_dgrad_us``) hide behind the column-parallel weight-gradient GEMMs
    (``column_wgrad_us`` a microbatch) first."""
    m, v = cand.microbatches, cand.v
    exposed: dict[str, float] = {}
    hidden = 0.0
    for dim in ("tp", "cp", "ep", "pp"):
        rows = [x for x in mine if x.dim == dim and x.phase == "microbatch"]
        if not rows:
            continue
        per_mb = sum(_t(topo, cand, x, dispatch) for x in rows) / m \
            * (0.5 if dim == "pp" else 1.0)
        frac = _overlap(t, opts, dim)
        if dim == "pp" and v > 1 and t.job_style == "megatron" and "pp" not in dict(t.overlap):
            frac = 1.0      # Megatron overlaps the interleaved schedule's sends
        if dim == "cp" and any(x.op == "all_gather" for x in rows):
            hide = _torch_ring_hidden_us(cand, topo, rows, attention_forward_us, frac)
            exposed[dim] = per_mb - hide
            hidden += hide
            continue
        window = attention_forward_us * 3.5 if dim == "cp" else compute_mb_us
        behind_wgrad = 0.0
        if dim == "tp":
            behind_wgrad = min(_async_dgrad_us(cand, t, topo, opts, rows) / m,
                               column_wgrad_us)
        hide = behind_wgrad + min((per_mb - behind_wgrad) * frac, window - behind_wgrad)
        exposed[dim] = per_mb - hide
        hidden += hide
    return exposed, hidden


def _torch_ring_hidden_us(cand: Candidate, topo: Topology, rows: list[Transfer],
                          attention_forward_us: float, frac: float) -> float:
    """The time a microbatch of torch's ring attention (``traffic._torch_cp_transfers``)
    hides behind its own steps, at most ``frac`` of each operation. The code's order
    (``_templated_ring_attention`` and its backward): the all-gather of K, V is issued before
    the first ring step's attention and waited for before the second, so it hides behind one
    step, 1/cp of the layer's forward attention (its backward: 2.5 times that); each step's
    dK, dV exchange is waited for after the next step's attention backward, so cp − 1 of the
    cp hide behind one step each, and the last one (waited for after the loop) behind none.
    The layers of a rank are alike, so the sums over them stand for each layer's."""
    m, cp = cand.microbatches, cand.layout.size("cp")
    step_fwd = attention_forward_us / cp        # one ring step, every layer of the rank
    # layer-microbatches of the step: the dK, dV sends are cp of each
    layer_mbs = sum(x.count for x in rows if x.op == "send") / cp
    hidden = 0.0
    for x in rows:
        total = _t(topo, cand, x) / m
        if x.op == "all_gather":
            passes = x.count / layer_mbs     # the forwards (with the recomputed ones)
            window = passes * step_fwd * (2.5 if "backward" in x.what else 1.0)
            hidden += min(total * frac, window)
        else:       # dK, dV: cp a layer, the last one exposed
            hidden += min(total * (cp - 1) / cp * frac, (cp - 1) * 2.5 * step_fwd)
    return hidden


def _chunked_hidden_us(total_us: float, bucket_us: float, frac: float, pass_us: float,
                       p: int, v: int) -> float:
    """The time hidden of a data-parallel operation that Megatron's interleaved schedule
    runs one model chunk at a time (``_dp_comm_us``): ``total_us`` over ``v`` chunks; the
    last chunk's share behind its own microbatch's pass (``pass_us`` / v: the backward for
    a reduction, the forward for a gather) but for ``bucket_us``, the other chunks' behind
    the pass of the p microbatches of each chunk that follow, at most ``frac`` of each."""
    chunk_pass = pass_us / v
    last = total_us / v
    hide_last = min(max(0.0, last - bucket_us) * frac, chunk_pass)
    hide_rest = min((total_us - last) * frac, (v - 1) * p * chunk_pass)
    return hide_last + hide_rest


def _dp_comm_us(cand: Candidate, t: Training, topo: Topology, opts: JobOptions,
                mine: list[Transfer], compute_mb_us: float) -> tuple[float, float]:
    """(exposed, hidden) time a step of data parallelism and the experts' replicas on a rank
    whose transfers are ``mine``, each hidden up to the dp overlap fraction: the gradient
    reductions behind the last microbatch's backward but for the last bucket, the
    distributed optimizer's weight gather behind the forward, FSDP's gathers and reductions
    behind the compute but for the first gather of the forward and of the backward."""
    dp_rows = [x for x in mine if x.dim in ("dp", "ep_replica")]
    frac = _overlap(t, opts, "dp")
    dp_exposed = dp_hidden = 0.0
    if not dp_rows:
        return dp_exposed, dp_hidden
    backward = compute_mb_us * 2 / 3
    forward = compute_mb_us / 3
    reduce = [x for x in dp_rows if x.phase == "step" and x.op != "all_gather"]
    gathers = [x for x in dp_rows if x.phase == "step" and x.op == "all_gather"]
    fsdp = [x for x in dp_rows if x.phase == "microbatch"]
    red_t = sum(_t(topo, cand, x) for x in reduce)
    # Megatron's interleaved schedule syncs each model chunk apart (schedules.py,
    # forward_backward_pipelining_with_interleaving: grad_sync_func[chunk] once the chunk's
    # last microbatch is back, param_sync_func[chunk] before its first forward): all but
    # one chunk's reduction (gather) run behind the other chunks' backwards (forwards), p
    # microbatches of a chunk apart; the last (first) chunk's behind its own microbatch
    chunked = t.job_style == "megatron" and cand.pp > 1 and cand.v > 1
    # FSDP under torch's pipelining reduces a stage's gradients after its last backward has
    # run whole (``_PipelineStageBase.backward_maybe_with_nosync``: no gradient sync until
    # ``last_backward``, then ``run_post_backward`` and FSDP's final callback, which syncs the
    # reduction back to the default stream): nothing of the stage's own backward hides it
    after_backward = t.framework == "torch" and cand.pp > 1 and cand.zero_stage == 3
    if red_t:
        bw = max(1.0, topo.comm_for(cand, "dp").busbw_gbps * 1e3)
        bucket = min(red_t, 25e6 / bw)      # the last bucket waits for the backward
        if after_backward:
            hide = 0.0
        elif chunked:
            hide = _chunked_hidden_us(red_t, bucket, frac, backward, cand.pp, cand.v)
        else:
            hide = min(max(0.0, red_t - bucket) * frac, backward)
        dp_exposed += red_t - hide
        dp_hidden += hide
    gat_t = sum(_t(topo, cand, x) for x in gathers)
    if gat_t:       # the distributed optimizer's weight gather: behind the forward
        if chunked:
            hide = _chunked_hidden_us(gat_t, 0.0, frac, forward, cand.pp, cand.v)
        else:
            hide = min(gat_t * frac, forward)
        dp_exposed += gat_t - hide
        dp_hidden += hide
    if fsdp:
        g = fsdp[0]
        comm = topo.comm_for(cand, g.dim, g.op)
        # the first unit's gather before the forward and (resharded) the backward
        first = comm.time_us(g.op, g.group_size, g.msg_bytes) * \
            (1 if cand.dp_mode == "fsdp_noreshard" else 2)
        g_total = sum(_t(topo, cand, x) for x in fsdp)
        hide = min(max(0.0, g_total - first) * frac, compute_mb_us * cand.microbatches)
        dp_exposed += g_total - hide
        dp_hidden += hide
    return dp_exposed, dp_hidden


def _optimizer_us(spec: ModelSpec, cand: Candidate, t: Training, device: DeviceSpec,
                  r: int) -> float:
    """The optimizer update's time on pipeline rank ``r``: the bytes it reads and writes for
    each parameter the rank owns (ZeRO-1 and above: its dp shard; experts: their replicas'
    shard) over the device's memory bandwidth, or with ``offload`` over the host's, plus
    the gradients and weights crossing PCIe."""
    dense, experts, _ = local_weights(spec, cand, r)
    owned = dense / (cand.dp_shards if cand.zero_stage >= 1 else 1) \
        + experts / (max(1, cand.dp_shards // cand.layout.size("ep"))
                     if cand.zero_stage >= 1 else 1)
    if t.offload == "none":
        return owned * optimizer_bytes_per_param(t) / device.memory_achieved_bytes_s * 1e6
    return (owned * optimizer_bytes_per_param(t) / HOST_MEMORY_BYTES_S
            + owned * (4 + t.weight_bytes) / PCIE_BYTES_S) * 1e6


def _rank_step(spec: ModelSpec, cand: Candidate, t: Training, device: DeviceSpec,
               topo: Topology, opts: JobOptions, trs: list[Transfer],
               dispatch: Dispatch | None, derate: float, r: int) -> _RankStep:
    """Pipeline rank ``r``'s terms (the module docstring's compute, communication and
    optimizer) as a ``_RankStep``: a microbatch's compute with FSDP's copies, its exposed
    and hidden communication and their contention, and the step's data-parallel and
    optimizer times."""
    w = microbatch_work(spec, cand, t, device, r, derate)
    mine = [x for x in trs if x.pp_rank == r]
    w.memory_bound_us += _fsdp_copy_us(mine, cand.microbatches, device)
    compute_mb = w.compute_us
    exposed, hidden = _microbatch_comm_us(cand, t, topo, opts, mine, dispatch,
                                          w.attention_forward_us, compute_mb,
                                          w.column_wgrad_us)
    opt_comm = sum(_t(topo, cand, x) for x in mine if x.phase == "optimizer")
    dp_exposed, dp_hidden = _dp_comm_us(cand, t, topo, opts, mine, compute_mb)
    contention = CONTENTION * hidden
    return _RankStep(rank=r, work=w, compute_mb_us=compute_mb + contention,
                     exposed_mb_us=exposed, contention_mb_us=contention, dp_us=dp_exposed,
                     dp_contention_us=CONTENTION * dp_hidden,
                     optimizer_us=_optimizer_us(spec, cand, t, device, r),
                     opt_comm_us=opt_comm,
                     t_mb_us=compute_mb + contention + sum(exposed.values()))


def _terms(spec: ModelSpec, device: DeviceSpec, opts: JobOptions, dispatch: Dispatch | None,
           crit: _RankStep, per_rank: list[_RankStep], exposed: dict[str, float],
           bubble_us: float, m: int) -> dict:
    """Every term of the step (``StepEstimate.terms``): the slowest rank's compute and its
    parts over ``m`` microbatches, contention, the GEMMs' efficiency, the exposed
    communication per dimension, the bubble, optimizer and overhead, and for a MoE its
    experts', router's and permutation's shares and the dispatch's copies."""
    cw = crit.work
    terms = {"compute_us": crit.compute_mb_us * m,
             "gemm_us": cw.gemm_us * m, "attention_us": cw.attention_us * m,
             "memory_bound_us": cw.memory_bound_us * m,
             "contention_us": crit.contention_mb_us * m
             + max(x.dp_contention_us for x in per_rank),
             "gemm_efficiency": (cw.gemm_flops / (cw.gemm_us * 1e-6) / device.peak_bf16
                                 if cw.gemm_us else 0.0),
             **{f"exposed_{d}_us": x for d, x in exposed.items()},
             "bubble_us": bubble_us, "optimizer_us": max(x.optimizer_us for x in per_rank),
             "overhead_us": opts.step_overhead_us}
    if spec.moe_experts:
        terms.update(expert_gemm_us=cw.expert_gemm_us * m, router_gemm_us=cw.router_gemm_us * m,
                     moe_permute_us=cw.moe_permute_us * m)
    if dispatch is not None:
        terms["ep_network_copies"] = dispatch.network_copies
        terms["ep_nvlink_copies"] = dispatch.nvlink_copies
    return terms


def predict_job(spec: ModelSpec, cand: Candidate, t: Training, device: DeviceSpec,
                topo: Topology, opts: JobOptions = JobOptions(),
                trs: list[Transfer] | None = None):
    """The step of a GPU job's layout (the module docstring), its slowest pipeline rank's,
    with every term (``trs``: its transfers, when the caller has them already)."""
    derate = opts.derate if opts.derate is not None else TRAINING_DERATE
    if trs is None:
        trs = transfers(spec, cand, training=t)
    dispatch = dispatch_of(spec, cand, t, topo)
    m, p, v = cand.microbatches, cand.pp, cand.v
    per_rank = [_rank_step(spec, cand, t, device, topo, opts, trs, dispatch, derate, r)
                for r in range(p)]
    crit = max(per_rank, key=lambda x: x.t_mb_us)
    t_mb = crit.t_mb_us
    pipe = t_mb * (m + idle_microbatches(cand.schedule, p, m, v))
    bubble = pipe - t_mb * m
    tail = max(x.dp_us + x.dp_contention_us + x.optimizer_us + x.opt_comm_us
               for x in per_rank)
    step = pipe + tail + opts.step_overhead_us
    tokens = cand.global_batch * spec.seq_len
    tokens_per_s = tokens / (step / 1e6)
    world = cand.layout.world_size
    mfu = model_flops_per_token(spec, t) * tokens_per_s / (world * device.peak_bf16) * 100
    hw = hardware_flops_per_token(spec, t) * tokens_per_s / world / 1e12
    fp8_tflops = crit.work.fp8_flops * m / (step / 1e6) / 1e12
    exposed = exposed_comm_by_dim({d: us * m for d, us in crit.exposed_mb_us.items()},
                                  max(x.dp_us for x in per_rank), crit.opt_comm_us)
    return StepEstimate(step_time_us=step,
                        compute_us=crit.compute_mb_us * m + crit.optimizer_us,
                        optimizer_us=crit.optimizer_us, exposed_comm_us=exposed,
                        bubble_us=bubble, bubble_fraction=bubble / pipe if pipe else 0.0,
                        overhead_us=opts.step_overhead_us, tokens_per_s=tokens_per_s,
                        mfu_pct=mfu, critical_pp_rank=crit.rank,
                        terms=_terms(spec, device, opts, dispatch, crit, per_rank, exposed,
                                     bubble, m),
                        hw_tflops_per_gpu=hw, fp8_tflops_per_gpu=fp8_tflops)


def required_derate(spec: ModelSpec, cand: Candidate, t: Training, device: DeviceSpec,
                    topo: Topology, opts: JobOptions, tokens_per_s: float) -> float:
    """The training derate at which this model predicts a measured throughput (tokens/s of
    the job): what a measured row says about the device's sustained rate."""
    lo, hi = 0.05, 2.0
    for _ in range(32):      # bisection: (hi - lo) / 2^32, well below 1e-6
        mid = (lo + hi) / 2
        est = predict_job(spec, cand, t, device, topo, dataclasses.replace(opts, derate=mid))
        if est.tokens_per_s < tokens_per_s:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def scale_device(device: DeviceSpec, factor: float, source: str) -> DeviceSpec:
    """``device`` with every GEMM curve and the attention efficiency scaled by ``factor``
    (a calibration through a measured rate)."""
    curves = {p: GemmCurve(c.eta_max * factor, c.half_intensity, c.t0_us,
                           f"{c.source}; {source}") for p, c in device.curves.items()}
    sources = dict(device.sources, attention=f"{device.source('attention')}; {source}")
    return dataclasses.replace(device, curves=curves, sources=sources,
                               attention_efficiency=device.attention_efficiency * factor)


# The relative uncertainty of a predicted step: the median |error| of the plan's family on
# the published reference set's rows that no constant was fitted on
# (``python bench/plan_accuracy.py --references``; docs/layouts.md has the table). Layouts
# predicted within it of the fastest are ties.
UNCERTAINTY = {"dense": 0.08, "fp8": 0.09, "moe": 0.23, "fsdp": 0.09}


# The spread of the planner's error on the published reference set's MoE jobs, fitted rows
# apart: the 10th and 90th percentile of predicted / published − 1
# (``python bench/plan_accuracy.py --references`` prints them under the family table).
MOE_ERROR_PERCENTILES = (-0.147, 1.707)
MOE_RANGE_REASON = (
    "a dropless MoE layer waits on the host — a sync for its token counts each forward, "
    "then a few hundred small kernel launches — which the planner does not time (no public "
    "per-launch host time); the range holds the measured throughput of 8 in 10 of the "
    "published MoE jobs (bench/plan_references), the planner being faster than measured "
    "up to {hi:.1f}× and slower up to {lo:.2f}×")


@dataclasses.dataclass(frozen=True)
class ThroughputRange:
    """Where a job's measured throughput is expected instead of the predicted point: from
    ``low_factor`` to ``high_factor`` times it, and why."""
    low_factor: float
    high_factor: float
    reason: str

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def throughput_range_of(spec: ModelSpec, t: Training | None) -> ThroughputRange | None:
    """A MoE GPU job's throughput range (``MOE_ERROR_PERCENTILES``); None for other jobs."""
    if t is None or t.framework == "runner" or not spec.moe_experts:
        return None
    lo_err, hi_err = MOE_ERROR_PERCENTILES
    return ThroughputRange(low_factor=1 / (1 + hi_err), high_factor=1 / (1 + lo_err),
                           reason=MOE_RANGE_REASON.format(hi=1 + hi_err, lo=1 + lo_err))


def family_of(spec: ModelSpec, t: Training) -> str:
    if spec.moe_experts:
        return "moe"
    if t.precision == "fp8":
        return "fp8"
    if t.job_style == "fsdp":
        return "fsdp"
    return "dense"


def uncertainty_of(spec: ModelSpec, t: Training) -> tuple[float, str]:
    """(the relative uncertainty of this plan's steps, where it comes from)."""
    fam = family_of(spec, t)
    return UNCERTAINTY[fam], (f"the median error of {fam} jobs on the published reference "
                              f"set (bench/plan_references)")
