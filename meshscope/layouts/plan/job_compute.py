"""The compute of one microbatch of a GPU job, operation by operation (``job_step.py``'s
first term).

``microbatch_work`` times, for the layers of one pipeline rank:

- every **GEMM** of every layer (``layer_gemms``) — q/k/v (or MLA's down and up projections),
  the output projection, the MLP's (SwiGLU: the fused gate/up and the down projection; plain:
  two), each MoE layer's router and its local experts' grouped products on the tokens routed
  to them (T · k · capacity factor · ep / E rows an expert), the shared expert, the output head
  — with its own shape on this rank (tensor parallelism splits N or K), on the device's GEMM
  curve for its precision (``gemm_time_us``; ``devices.GemmCurve``: η(I) of the peak at the
  product's intensity, plus t₀), forward once and backward twice. A GEMM named in ``fp8_ops``
  runs on the fp8 peak and curve; everything else in bf16;
- the **attention core** (Q·Kᵀ and its product with V; ``CAUSAL`` of the s × s blocks under
  the causal mask, a sliding window's span otherwise) at the device's flash-attention
  efficiency of the bf16 peak, its backward 2.5 × its forward;
- **memory-bound kernels** (norms, residual adds, the MLP's activation, RoPE, MoE token
  permutation, fp8 casts — ``CAST_BYTES`` a converted element —, the loss, ``LOSS_BYTES`` a
  logit) as bytes over the device's achieved memory bandwidth, ``EAGER_ELEMENTWISE`` times
  more without fused kernels;
- recomputation: full adds one forward, selective the attention core's, op-level half the
  forward GEMMs (``passes``).

The GEMM and attention rates are derated by ``TRAINING_DERATE`` (a training step runs below a
lone kernel's rate), fitted on the ten rows of Megatron-LM's Table 1 (docs/layouts.md).
``model_flops_per_token`` and ``hardware_flops_per_token`` are what MFU and the hardware
FLOP/s count.
"""
from __future__ import annotations

import dataclasses
import functools

from meshscope.theory.flops import (attention_core_forward_flops_per_token,
                                    layer_forward_flops_per_token)

from .candidate import Candidate
from .devices import DeviceSpec
from .job_memory import layer_kinds
from .spec import ModelSpec
from .traffic import shape_of
from .training import Training

# A training step's GEMM and attention rates over a lone kernel's (clocks under sustained
# power, the kernels of other streams, launch gaps): fitted by
# ``bench/plan_accuracy.py --fit`` on the catalogue-device rows ``jobs.csv`` marks ``fit``:
# the geometric mean over the ten rows of Megatron-LM's Table 1, each described as the
# paper's own script runs it (examples/sc21/run_table_1.sh); they need 0.815-0.911 each
# (docs/layouts.md).
TRAINING_DERATE = 0.858

# Bytes moved per element an fp8 GEMM converts: read 16-bit, write fp8 and its transpose
# (delayed scaling); current and block scaling read it once more for the amax.
CAST_BYTES = {"delayed": 4, "current": 6, "mx": 6}
# The loss's memory traffic per logit element, forward and backward (the fp32 upcast,
# softmax, its gradient and the cast back).
LOSS_BYTES = 24
CAUSAL = 0.5                    # the share of Q·Kᵀ blocks a causal flash kernel computes
# PyTorch's eager norms, activations and residual adds move this many times the bytes of the
# fused kernels (an eager RMSNorm is five to seven passes over h where a fused one reads and
# writes once; SwiGLU three ops instead of one): assumed.
EAGER_ELEMENTWISE = 2.5



@dataclasses.dataclass(frozen=True)
class Gemm:
    op: str          # qkv, proj, fc1, fc2, experts, router, head, shared
    m: float
    n: float
    k: float
    count: int = 1   # products of this shape (a grouped GEMM: one t0)
    grouped: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count



def _attention_gemms(spec: ModelSpec, T: float, tp: int) -> list[Gemm]:
    h, a = spec.dim, spec.n_heads
    if spec.mla:
        qk, v = spec.head_width, spec.v_head_dim
        out = []
        if spec.q_lora_rank:
            out += [Gemm("qkv", T, spec.q_lora_rank, h),
                    Gemm("qkv", T, a * qk / tp, spec.q_lora_rank)]
        else:
            out.append(Gemm("qkv", T, a * qk / tp, h))
        out += [Gemm("qkv", T, spec.kv_lora_rank + spec.qk_rope_head_dim, h),
                Gemm("qkv", T, a * (spec.qk_nope_head_dim + v) / tp, spec.kv_lora_rank),
                Gemm("proj", T, h, a * v / tp)]
        return out
    return [Gemm("qkv", T, (spec.q_dim + 2 * spec.kv_dim) / tp, h),
            Gemm("proj", T, h, spec.q_dim / tp)]


def _mlp_gemms(spec: ModelSpec, op_prefix: str, T: float, width: float, tp: int,
               count: int = 1, grouped: bool = False) -> list[Gemm]:
    up = (2 if spec.gated_mlp else 1) * width / tp
    fc1 = "experts" if op_prefix == "experts" else "fc1"
    fc2 = "experts" if op_prefix == "experts" else "fc2"
    return [Gemm(fc1, T, up, spec.dim, count, grouped),
            Gemm(fc2, T, spec.dim, width / tp, count, grouped)]


def layer_gemms(spec: ModelSpec, i: int, T: float, tp: int, ep: int,
                capacity_factor: float = 1.0) -> list[Gemm]:
    """Layer ``i``'s forward GEMMs on one rank for T tokens of its microbatch."""
    out = _attention_gemms(spec, T, tp)
    if spec.is_moe_layer(i):
        E, k = spec.moe_experts, spec.moe_top_k
        out.append(Gemm("router", T, E, spec.dim))
        local = max(1, E // ep)
        rows = T * k * capacity_factor * ep / E          # tokens an expert takes here
        out += _mlp_gemms(spec, "experts", rows, spec.expert_hidden, tp, local, True)
        if spec.moe_shared_hidden:
            out += _mlp_gemms(spec, "shared", T, spec.moe_shared_hidden, tp)
    else:
        out += _mlp_gemms(spec, "dense", T, spec.ffn_hidden, tp)
    return out


def _fp8_op(op: str) -> str:
    return "fc1" if op == "shared" else op


def gemm_time_us(g: Gemm, t: Training, dev: DeviceSpec, derate: float) -> tuple[float, bool]:
    """(µs, in fp8?) of one forward GEMM row (all its ``count`` products)."""
    fp8 = t.uses_fp8(_fp8_op(g.op)) and dev.supports("fp8")
    prec = "fp8" if fp8 else ("fp32" if t.precision == "fp32" and dev.supports("fp32")
                              else "bf16")
    curve = dev.curve(prec)
    one = curve.time_us(g.m, g.n, g.k, dev.peak_flops[prec], derate) - curve.t0_us
    launches = 1 if g.grouped else g.count
    return one * g.count + curve.t0_us * launches, fp8


def elementwise_bytes_per_token(spec: ModelSpec, t: Training, tp: int, sp: bool, i: int,
                                capacity_factor: float = 1.0) -> float:
    """Bytes the memory-bound (non-GEMM) kernels of one layer's forward read and write per
    token on one GPU: norms, residual adds and dropouts on 10 h-vectors (replicated on every
    tp rank unless sequence-parallel), RoPE on q and k, the MLP's activation function (GeLU:
    2f elements, SwiGLU: 3f, ÷ tp; a MoE layer: k routed copies and the shared expert, plus
    the tokens' permutation to the experts and back, 4 · k · h) and, without flash attention,
    the softmax / mask / dropout over the a·s/tp scores (5 passes). Elements in the
    activation precision."""
    h, a = spec.dim, spec.n_heads
    per_mlp = 3 if spec.gated_mlp else 2
    if spec.is_moe_layer(i):
        k = spec.moe_top_k * capacity_factor
        mlp = per_mlp * (k * spec.expert_hidden + spec.moe_shared_hidden) / tp \
            + 4 * k * h / (tp if sp else 1)
    else:
        mlp = per_mlp * spec.ffn_hidden / tp
    rep = 10 * h / (tp if sp else 1)
    rope = 2 * (spec.q_dim + spec.kv_dim) / tp
    core = 0.0 if (t.flash_attention or t.recompute == "selective") else \
        5 * a * spec.seq_len / tp
    return (rep + rope + mlp + core) * t.act_bytes


def permute_bytes_per_token(spec: ModelSpec, t: Training, tp: int, sp: bool,
                            capacity_factor: float = 1.0) -> float:
    """Of ``elementwise_bytes_per_token`` in a MoE layer: the tokens' permutation to their
    experts and back (k · capacity factor copies of h, read and written each way)."""
    return 4 * spec.moe_top_k * capacity_factor * spec.dim / (tp if sp else 1) * t.act_bytes


def passes(t: Training) -> float:
    """Forward-equivalents per step: 3 (forward + backward), 4 with full recomputation."""
    return 4.0 if t.recompute == "full" else 3.0


@dataclasses.dataclass
class MicrobatchWork:
    gemm_us: float = 0.0
    attention_us: float = 0.0
    memory_bound_us: float = 0.0
    gemm_flops: float = 0.0         # hardware FLOPs of the GEMMs (recomputation included)
    fp8_flops: float = 0.0
    attention_flops: float = 0.0
    attention_forward_us: float = 0.0   # what cp's ring can hide behind
    # of which, in MoE layers: the experts' grouped GEMMs, the router's GEMM (in gemm_us) and
    # the tokens' permutation to the experts and back (in memory_bound_us)
    expert_gemm_us: float = 0.0
    router_gemm_us: float = 0.0
    moe_permute_us: float = 0.0
    # the weight-gradient GEMMs of the column-parallel linears (QKV, the MLP's first), once:
    # what Megatron's asynchronous input-gradient collective hides behind
    column_wgrad_us: float = 0.0

    @property
    def compute_us(self) -> float:
        return self.gemm_us + self.attention_us + self.memory_bound_us

    def add(self, other: "MicrobatchWork", times: int = 1) -> None:
        """Add ``times`` × ``other``'s every term to this one."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + times * getattr(other, f.name))


def microbatch_work(spec: ModelSpec, cand: Candidate, t: Training, dev: DeviceSpec, r: int,
                    derate: float) -> MicrobatchWork:
    """The compute of one microbatch on a GPU of pipeline rank ``r`` (module docstring)."""
    sh = shape_of(spec, cand)
    tp, ep = cand.layout.size("tp"), cand.layout.size("ep")
    sp = cand.sp and tp > 1
    T = float(sh.tokens)
    cf = t.capacity_factor or 1.0
    bw = dev.memory_achieved_bytes_s
    layers_of = cand.stage_layers(spec.n_layers)
    w = MicrobatchWork()
    cast = CAST_BYTES[t.fp8_recipe]
    fwd_extra = {"full": 1.0, "op": 0.5}.get(t.recompute, 0.0)
    layers = []
    last = False
    for stage in cand.stages_of(r):
        layers += layers_of[stage]
        if stage == cand.n_stages - 1:
            last = True
    if last:
        layers += [spec.n_layers - 1] * spec.mtp_layers    # MTP modules: one layer each
    attn_rate = dev.peak_bf16 * dev.attention_efficiency * derate
    # layers of one kind (dense or MoE, the attention's span) cost the same: each kind is
    # timed once and counted as many times as the rank holds it
    kinds: dict[tuple[bool, int], list[int]] = {}
    kinds_of = layer_kinds(spec)
    for i in layers:
        kinds.setdefault(kinds_of[i], []).append(i)
    for same in kinds.values():
        one = _layer_work(spec, same[0], t, dev, derate, T, tp, ep, sp, cf, attn_rate, bw,
                          cast, fwd_extra)
        w.add(one, len(same))
    if last:
        head = Gemm("head", T, spec.vocab_size / tp, spec.dim)
        us, fp8 = gemm_time_us(head, t, dev, derate)
        heads = 1 + spec.mtp_layers
        w.gemm_us += 3 * us * heads
        w.gemm_flops += 3 * head.flops * heads
        if fp8:
            w.fp8_flops += 3 * head.flops * heads
        w.memory_bound_us += LOSS_BYTES * T * spec.vocab_size / tp * heads / bw * 1e6
    return w


def _layer_work(spec: ModelSpec, i: int, t: Training, dev: DeviceSpec, derate: float,
                T: float, tp: int, ep: int, sp: bool, cf: float, attn_rate: float,
                bw: float, cast: float, fwd_extra: float) -> MicrobatchWork:
    """Layer ``i``'s share of ``microbatch_work``."""
    w = MicrobatchWork()
    for g in layer_gemms(spec, i, T, tp, ep, cf):
        us, fp8 = gemm_time_us(g, t, dev, derate)
        w.gemm_us += us * (3.0 + fwd_extra)
        if g.op == "experts":
            w.expert_gemm_us += us * (3.0 + fwd_extra)
        elif g.op == "router":
            w.router_gemm_us += us * (3.0 + fwd_extra)
        if g.op in ("qkv", "fc1"):
            w.column_wgrad_us += us
        w.gemm_flops += g.flops * (3.0 + fwd_extra)
        if fp8:
            w.fp8_flops += g.flops * (3.0 + fwd_extra)
            # the input cast each forward, the output gradient each backward, the
            # weight once a microbatch
            elements = g.m * g.k * (1 + fwd_extra) + g.m * g.n + g.n * g.k
            w.memory_bound_us += elements * g.count * cast / bw * 1e6
    span_flops = attention_core_forward_flops_per_token(spec.shape, i) * T / tp
    if spec.shape.attention_span(i) >= spec.seq_len:
        span_flops *= CAUSAL
    attn_passes = 1.0 + 2.5 + (1.0 if t.recompute in ("full", "selective") else 0.0)
    w.attention_forward_us += span_flops / attn_rate * 1e6
    w.attention_us += span_flops * attn_passes / attn_rate * 1e6
    w.attention_flops += span_flops * attn_passes
    elem = elementwise_bytes_per_token(spec, t, tp, sp, i, cf) * T
    if not t.fused_kernels:
        elem *= EAGER_ELEMENTWISE
    elem_passes = passes(t) if t.recompute != "op" else 3.5
    w.memory_bound_us += elem * elem_passes / bw * 1e6
    if spec.is_moe_layer(i):
        w.moe_permute_us += permute_bytes_per_token(spec, t, tp, sp, cf) * T \
            * (1.0 if t.fused_kernels else EAGER_ELEMENTWISE) * elem_passes / bw * 1e6
    return w


def model_flops_per_token(spec: ModelSpec, t: Training) -> float:
    """6 × active parameters (no lookups) + attention's products: what MFU counts."""
    return spec.flops_per_token()


def hardware_flops_per_token(spec: ModelSpec, t: Training) -> float:
    """Model FLOPs plus recomputation's (Megatron-LM's throughput definition)."""
    return model_flops_per_token(spec, t) + _recomputed_flops_per_token(spec, t.recompute)


@functools.lru_cache(maxsize=64)
def _recomputed_flops_per_token(spec: ModelSpec, recompute: str) -> float:
    """The FLOPs a token's recomputation adds over every layer (a layout search asks for
    the same model's many times: kept)."""
    extra = 0.0
    for i in range(spec.n_layers):
        if recompute == "full":
            extra += layer_forward_flops_per_token(spec.shape, i)
        elif recompute == "selective":
            extra += attention_core_forward_flops_per_token(spec.shape, i)
        elif recompute == "op":
            extra += 0.5 * (layer_forward_flops_per_token(spec.shape, i)
                            - attention_core_forward_flops_per_token(spec.shape, i))
    return extra
