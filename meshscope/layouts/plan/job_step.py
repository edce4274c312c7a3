"""Step time of a GPU job, from a model a reviewer can follow term by term.

For the slowest pipeline rank, with m microbatches, p pipeline ranks and v stages per rank:

1. **compute** of one microbatch = its GEMM FLOPs / (peak × η(w)) + the bytes its
   memory-bound kernels move / memory bandwidth (``elementwise_bytes_per_token``). The
   FLOPs: per token and layer 2 × the weights a token passes through (attention with
   grouped-query K/V, the MLP — SwiGLU's three matrices — or a MoE layer's router, top-k
   routed and shared experts) plus attention's 4·h·s; × 3 for forward and backward, + 1 forward more under full recomputation (+ the
   attention core's under selective); the head's 2·h·V on the last stage; ÷ tp. η(w) is the
   achieved fraction of peak of GEMMs of per-GPU width w = h / tp — a saturating curve
   η = η_max · w / (w + w_½) (``GemmCurve``: small GEMMs run further from peak), fitted on
   published rows or a measured run, never one fixed fraction.
2. **tensor / context / expert parallelism** per microbatch: each collective's time on its
   link level (``topology.py``: α + S·f/busbw) — tp exposed (Megatron without
   ``--tp-comm-overlap``; ``tp_overlap`` hides it), the cp ring overlapped with the attention
   core it feeds (only the excess shows), ep's all-to-alls exposed; **pp** sends on the
   critical path: one activation forward and one gradient back per microbatch.
3. **pipeline**: T_mb · (m + (p − 1)/v) for 1F1B, interleaved and GPipe (the bubble is the
   second term), T_mb · m for the zero-bubble schedules.
4. **data parallelism** after the last microbatch: DDP's all-reduce or ZeRO-1's reduce-scatter
   and all-gather (the distributed optimizer), ZeRO-2/3's reduce-scatter; with ``dp_overlap``
   (Megatron's ``--overlap-grad-reduce`` / ``--overlap-param-gather``, torch DDP's buckets)
   hidden behind the last microbatch's backward (and the next forward for the weights'
   all-gather) except one bucket; without it all exposed. FSDP's per-microbatch all-gathers
   are prefetched behind compute except the first of each pass.
5. **optimizer**: the bytes the update reads and writes per local parameter (Adam in mixed
   precision: the fp32 gradient, master weight and two moments read and written, the 16-bit
   weight written — 30 bytes) over the device's memory bandwidth; on the host's with
   ``offload`` (plus the gradients down and weights up over PCIe).

MFU = model FLOPs (6 × active parameters + attention's 12·L·h·s a token; no recomputation) ×
tokens/s ÷ (GPUs × peak); ``hw_tflops_per_gpu`` counts recomputation as Megatron-LM's
throughput table does (Narayanan et al. 2021, eq. 3).
"""
from __future__ import annotations

import dataclasses

from meshscope.collectors.devices import lookup
from meshscope.theory.flops import (gpt_layer_forward_flops_per_token,
                                    head_training_flops_per_token,
                                    layer_forward_flops_per_token)
from meshscope.theory.schedules import bubble_fraction as theory_fraction

from .candidate import Candidate
from .job_memory import local_weights
from .spec import ModelSpec
from .topology import Topology
from .traffic import Transfer, shape_of, transfers
from .training import Training

HOST_MEMORY_BYTES_S = 100e9     # a two-socket host's DRAM (offloaded optimizer step), assumed
PCIE_BYTES_S = 25e9             # PCIe 4 x16 per GPU, achieved, assumed


@dataclasses.dataclass(frozen=True)
class GemmCurve:
    """η(w) = η_max · w / (w + w_½): the achieved fraction of a device's peak for GEMMs of
    per-GPU width w (h / tp)."""
    eta_max: float
    half_width: float
    source: str

    def efficiency(self, width: float) -> float:
        return self.eta_max * width / (width + self.half_width)

    @classmethod
    def through(cls, w1: float, e1: float, w2: float, e2: float, source: str) -> "GemmCurve":
        """The curve through two (width, efficiency) points (closed form)."""
        denom = e2 / w2 - e1 / w1
        half = (e1 - e2) / denom if denom else 0.0
        half = max(0.0, half)
        return cls(eta_max=e1 * (w1 + half) / w1, half_width=half, source=source)


# Fitted by ``bench/plan_accuracy.py --fit`` on two rows of Megatron-LM's README throughput
# table (Narayanan et al. 2021, Table 1; A100 80GB, Selene): the 39.1B row (h/t = 1024) and the
# 1008B row (h/t = 3200); the other eight rows are the check (docs/layouts.md).
A100_CURVE = GemmCurve(eta_max=0.6802, half_width=78.30,
                       source="fitted on Megatron-LM's README table rows 39.1B and 1008B")


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float           # dense bf16 FLOP/s
    memory_bytes_s: float
    curve: GemmCurve

    @classmethod
    def named(cls, name: str, curve: GemmCurve | None = None) -> "Device | None":
        """A device of ``collectors/devices.py``; its GEMM curve is the A100's fitted one
        unless given (the shape of the curve, not the peak, carries across devices — an
        assumption the plan's notes state)."""
        known = lookup(name)
        if not known:
            return None
        return cls(name, known[0], known[1], curve or A100_CURVE)


@dataclasses.dataclass(frozen=True)
class JobOptions:
    dp_overlap: bool = True
    tp_overlap: bool = False
    step_overhead_us: float = 0.0


def layer_fwd_flops_per_token(spec: ModelSpec, i: int) -> float:
    """Forward FLOPs a token costs in layer ``i``
    (``meshscope.theory.flops.layer_forward_flops_per_token``)."""
    return layer_forward_flops_per_token(spec.shape, i)


def gpt_fwd_flops_per_token(spec: ModelSpec) -> float:
    """A GPT layer (4h MLP of two matrices, not SwiGLU): 24h² + 4hs
    (``meshscope.theory.flops.gpt_layer_forward_flops_per_token``)."""
    return gpt_layer_forward_flops_per_token(spec.shape)


def _fwd_per_token(spec: ModelSpec, t: Training, i: int) -> float:
    return gpt_fwd_flops_per_token(spec) if t.block == "gpt" else \
        layer_fwd_flops_per_token(spec, i)


def passes(t: Training) -> float:
    """Forward-equivalents per step: 3 (forward + backward), 4 with full recomputation."""
    return 4.0 if t.recompute == "full" else 3.0


def elementwise_bytes_per_token(spec: ModelSpec, t: Training, tp: int, sp: bool, i: int
                                ) -> float:
    """Bytes the memory-bound (non-GEMM) kernels of one layer's forward read and write per
    token on one GPU: norms, residual adds and dropouts on 10 h-vectors (replicated on every
    tp rank unless sequence-parallel), the MLP's activation function (GeLU: 2f elements,
    SwiGLU: 3f, ÷ tp) and, without flash attention, the softmax / mask / dropout over the
    a·s/tp scores (5 passes). Elements in the activation precision."""
    h, a = spec.dim, spec.n_heads
    f = spec.expert_hidden * spec.moe_top_k if spec.is_moe_layer(i) else spec.ffn_hidden
    rep = 10 * h / (tp if sp else 1)
    mlp = (2 if t.block == "gpt" else 3) * f / tp
    core = 0.0 if (t.flash_attention or t.recompute == "selective") else \
        5 * a * spec.seq_len / tp
    return (rep + mlp + core) * t.act_bytes


def rank_work_per_microbatch(spec: ModelSpec, cand: Candidate, t: Training, r: int
                             ) -> tuple[float, float, float]:
    """(hardware GEMM FLOPs, of which the attention core's, memory-bound bytes) of one
    microbatch on one GPU of pipeline rank ``r``."""
    sh = shape_of(spec, cand)
    tp = cand.layout.size("tp")
    sp = cand.sp and tp > 1
    layers_of = cand.stage_layers(spec.n_layers)
    total = core = elem = 0.0
    for stage in cand.stages_of(r):
        for i in layers_of[stage]:
            fwd = _fwd_per_token(spec, t, i)
            c = 4 * spec.dim * spec.seq_len / cand.layout.size("cp")
            total += fwd * passes(t) + (c if t.recompute == "selective" else 0.0)
            core += c * passes(t)
            elem += elementwise_bytes_per_token(spec, t, tp, sp, i) * passes(t)
        if stage == cand.n_stages - 1:
            total += head_training_flops_per_token(spec.shape)
    return total * sh.tokens / tp, core * sh.tokens / tp, elem * sh.tokens


def model_flops_per_token(spec: ModelSpec, t: Training) -> float:
    """6 × active parameters (no embedding) + 12·L·h·s: what MFU counts."""
    if t.block == "gpt":
        return 3 * (spec.n_layers * gpt_fwd_flops_per_token(spec)
                    + 2 * spec.dim * spec.vocab_size)
    return spec.flops_per_token()


def hardware_flops_per_token(spec: ModelSpec, t: Training) -> float:
    """Model FLOPs plus recomputation's (Megatron-LM's throughput definition)."""
    extra = 0.0
    for i in range(spec.n_layers):
        fwd = _fwd_per_token(spec, t, i)
        if t.recompute == "full":
            extra += fwd
        elif t.recompute == "selective":
            extra += 4 * spec.dim * spec.seq_len
    return model_flops_per_token(spec, t) + extra


def optimizer_bytes_per_param(t: Training) -> float:
    """Bytes the update reads and writes per parameter it owns."""
    grad = 4 if (t.precision == "fp32" or t.main_grads_fp32) else 2
    moments = {"adam": 8, "sgd": 4, "adafactor": 0}[t.optimizer]
    master = 4 if t.precision in ("mixed", "fp8") else 0
    weight = t.weight_bytes
    return grad + 2 * (moments + master) + (weight if master else 2 * weight)


def _t(comm, tr: Transfer) -> float:
    return tr.count * comm.time_us(tr.op, tr.group_size, tr.msg_bytes)


def predict_job(spec: ModelSpec, cand: Candidate, t: Training, device: Device,
                topo: Topology, opts: JobOptions = JobOptions()):
    from .cost import StepEstimate

    trs = transfers(spec, cand, training=t)
    m, p, v = cand.microbatches, cand.pp, cand.v
    tp = cand.layout.size("tp")
    peak = device.peak_flops * (2 if t.precision == "fp8" else 1)
    eta = device.curve.efficiency(spec.dim / tp)
    rate = peak * eta
    per_rank = []
    for r in range(p):
        flops, core, elem = rank_work_per_microbatch(spec, cand, t, r)
        memory_bound_mb = elem / device.memory_bytes_s * 1e6
        compute_mb = flops / rate * 1e6 + memory_bound_mb
        mine = [x for x in trs if x.pp_rank == r]
        exposed = {}
        for dim in ("tp", "cp", "ep", "pp"):
            rows = [x for x in mine if x.dim == dim and x.phase == "microbatch"]
            if not rows:
                continue
            comm = topo.comm_for(cand, dim)
            per_mb = sum(_t(comm, x) for x in rows) / m * (0.5 if dim == "pp" else 1.0)
            if dim == "tp" and opts.tp_overlap:
                per_mb = 0.0
            if dim == "cp":
                per_mb = max(0.0, per_mb - core / rate * 1e6)
            exposed[dim] = per_mb
        opt_comm = sum(_t(topo.comm_for(cand, x.dim), x) for x in mine
                       if x.phase == "optimizer")
        # data parallelism (and the experts' replicas)
        dp_rows = [x for x in mine if x.dim in ("dp", "ep_replica")]
        dp_total = sum(_t(topo.comm_for(cand, x.dim), x) for x in dp_rows)
        if not dp_rows:
            dp_exposed = 0.0
        elif not opts.dp_overlap:
            dp_exposed = dp_total
        else:
            step_rows = [x for x in dp_rows if x.phase == "step"]
            gathers = [x for x in dp_rows if x.phase == "microbatch"]
            backward = compute_mb * 2 / 3
            step_t = sum(_t(topo.comm_for(cand, x.dim), x) for x in step_rows)
            bucket = min(step_t, 25e6 / max(1.0, topo.comm_for(cand, "dp").busbw_gbps * 1e3))
            dp_exposed = max(bucket, step_t - backward) if step_t else 0.0
            if gathers:
                g = gathers[0]
                comm = topo.comm_for(cand, g.dim)
                first = comm.time_us(g.op, g.group_size, g.msg_bytes)
                g_total = sum(_t(comm, x) for x in gathers)
                dp_exposed += first * g.count + max(0.0, g_total - first * g.count
                                                    - compute_mb * m)
        # optimizer
        dense, experts, _ = local_weights(spec, cand, r)
        owned = dense / (cand.dp_shards if cand.zero_stage >= 1 else 1) \
            + experts / (max(1, cand.dp_shards // cand.layout.size("ep"))
                         if cand.zero_stage >= 1 else 1)
        if t.offload == "none":
            optimizer = owned * optimizer_bytes_per_param(t) / device.memory_bytes_s * 1e6
        else:
            optimizer = (owned * optimizer_bytes_per_param(t) / HOST_MEMORY_BYTES_S
                         + owned * (4 + t.weight_bytes) / PCIE_BYTES_S) * 1e6
        per_rank.append({"rank": r, "compute_mb": compute_mb, "exposed": exposed,
                         "memory_bound_mb": memory_bound_mb,
                         "dp": dp_exposed, "optimizer": optimizer, "opt_comm": opt_comm,
                         "t_mb": compute_mb + sum(exposed.values())})
    crit = max(per_rank, key=lambda x: x["t_mb"])
    t_mb = crit["t_mb"]
    fill = theory_fraction(cand.schedule, p, m, v) > 0 if p > 1 else False
    pipe = t_mb * (m + ((p - 1) / v if fill else 0.0))
    bubble = pipe - t_mb * m
    tail = max(x["dp"] + x["optimizer"] + x["opt_comm"] for x in per_rank)
    step = pipe + tail + opts.step_overhead_us
    tokens = cand.global_batch * spec.seq_len
    tokens_per_s = tokens / (step / 1e6)
    world = cand.layout.world_size
    mfu = model_flops_per_token(spec, t) * tokens_per_s / (world * device.peak_flops) * 100
    hw = hardware_flops_per_token(spec, t) * tokens_per_s / world / 1e12
    exposed = {d: v_ * m for d, v_ in crit["exposed"].items()}
    dp_worst = max(x["dp"] for x in per_rank)
    if dp_worst:
        exposed["dp"] = dp_worst
    if crit["opt_comm"]:
        exposed["tp"] = exposed.get("tp", 0.0) + crit["opt_comm"]
    terms = {"compute_us": crit["compute_mb"] * m,
             "gemm_us": (crit["compute_mb"] - crit["memory_bound_mb"]) * m,
             "memory_bound_us": crit["memory_bound_mb"] * m,
             "gemm_efficiency": eta,
             **{f"exposed_{d}_us": x for d, x in exposed.items()},
             "bubble_us": bubble, "optimizer_us": max(x["optimizer"] for x in per_rank),
             "overhead_us": opts.step_overhead_us}
    return StepEstimate(step_time_us=step,
                        compute_us=crit["compute_mb"] * m + crit["optimizer"],
                        optimizer_us=crit["optimizer"], exposed_comm_us=exposed,
                        bubble_us=bubble, bubble_fraction=bubble / pipe if pipe else 0.0,
                        overhead_us=opts.step_overhead_us, tokens_per_s=tokens_per_s,
                        mfu_pct=mfu, critical_pp_rank=crit["rank"], terms=terms,
                        hw_tflops_per_gpu=hw)


def required_efficiency(spec: ModelSpec, cand: Candidate, t: Training, device: Device,
                        topo: Topology, opts: JobOptions, hw_tflops_per_gpu: float) -> float:
    """The GEMM efficiency η at which this model predicts a measured throughput (TFLOP/s a
    GPU, recomputation counted): what a measured row says about the device's curve."""
    lo, hi = 1e-3, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        dev = dataclasses.replace(device, curve=GemmCurve(mid, 0.0, "probe"))
        if predict_job(spec, cand, t, dev, topo, opts).hw_tflops_per_gpu < hw_tflops_per_gpu:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_curve(points: list[tuple[float, float]], source: str) -> GemmCurve:
    """The curve through two measured (width, η) points, or a flat one through one."""
    if len(points) == 1:
        return GemmCurve(points[0][1], 0.0, source)
    (w1, e1), (w2, e2) = points[:2]
    return GemmCurve.through(w1, e1, w2, e2, source)
