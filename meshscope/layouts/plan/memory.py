"""Memory per rank: parameters, gradients, optimizer state, runtime buffers and activations.

**Model states** (Rajbhandari et al., 2020, "ZeRO", §3.1 and §5): with Ψ parameters on a rank
(after tensor and pipeline parallelism have split the model), K bytes of optimizer state per
parameter and N_d data-parallel ranks sharing the state, a rank holds

============  ==================  ==================  ====================
ZeRO stage    parameters          gradients           optimizer state
============  ==================  ==================  ====================
0 (``ddp``)   Ψ·p                 Ψ·g                 Ψ·K
1             Ψ·p                 Ψ·g                 Ψ·K / N_d
2 (``zero2``) Ψ·p                 Ψ·g / N_d           Ψ·K / N_d
3 (``fsdp``)  Ψ·p / N_d           Ψ·g / N_d           Ψ·K / N_d
============  ==================  ==================  ====================

The runner's ``zero2`` is FSDP2 with ``reshard_after_forward=False``: it stores its parameters
sharded (Ψ·p / N_d, as stage 3) and holds the gathered Ψ·p from forward to backward as a runtime
buffer (below) — classic ZeRO-2 keeps them whole instead.

with p, g the bytes of a weight and a gradient (``precision.py``: 4, 4, K = 8 for the runner's
fp32 AdamW; 2, 2, K = 12 for mixed precision, the paper's setting: Ψ = 7.5B, N_d = 64 gives
120 GB, 31.4 GB, 16.6 GB and 1.9 GB, its Fig. 1). N_d is dp × cp (context-parallel ranks
replicate the weights too); experts of an expert-parallel MoE are split over ep instead and
not sharded by ZeRO (the runner leaves them out of data parallelism).

**Runtime buffers** — what the runner's data parallelism holds beyond the model states, from
torch's implementation: DDP copies every gradient into its bucket buffers
(``gradient_as_bucket_view=False``, the default; FSDP2's ``replicate`` likewise into its
reduce buffer); FSDP2 keeps every unit gathered from forward to backward under ``zero2``
(``reshard_after_forward=False``: Ψ·p on top of the shards) and about two units (the current
and the prefetched next) under ``fsdp``; and with gradient accumulation (more than one
microbatch) FSDP2 accumulates *unsharded* gradients until the last microbatch's
reduce-scatter (``set_requires_gradient_sync(False)``), Ψ·g — ZeRO-2/3's gradient saving
needs one microbatch per step.

**Activations** — what autograd saves for backward, counted tensor by tensor for the runner's
Llama block (RMSNorm, RoPE, SDPA, SwiGLU; no dropout), per token and layer, in elements (h
hidden, f FFN width, a heads, kv = key/value width, t = tp):

- each RMSNorm: its input, x·rsqrt(mean x²) and the rsqrt (≈ 2h + 1), plus its output as the
  next linear's input (h) — with sequence parallelism the norm works on 1/t of the tokens
  and the linears save the all-gathered input, so 2h/t + 1 + h;
- attention: q and k after RoPE and v (what SDPA saves; RoPE multiplies by constant tables, so
  autograd keeps the tables, not the unrotated q and k), the attention output and its
  logsumexp (CPU and flash SDPA keep no s × s matrix), the re-laid-out output saved by wo:
  (3h + 2kv + a)/t;
- SwiGLU: w1·x, silu(w1·x), w3·x and their product: 4f/t; an MoE layer instead keeps each
  token's k copies through its experts (k·(4·f_e + 3h), and 2k·h for the all-to-all buffers
  with ep > 1) and the router's probabilities (2E);
- the last stage adds the final norm and 2V (logits and log-softmax; with tp the local V/t
  before the all-gather as well); the first stage the token ids (8 bytes a token). Autograd
  saves only the log-softmax of the two, but the logits are alive beside it while the loss
  is computed — the end of forward, where a rank's activations peak.

A dense layer's count is exactly the elements autograd saves for the runner's block
(``tests/test_plan_memory_terms.py`` counts them with ``torch.autograd.graph.
saved_tensors_hooks``); until 2026-12-07 it also counted the unrotated q and k (h + kv too
many a token and layer).

Korthikanti et al. (2022, Table 2) count 34·s·b·h + 5·a·s²·b bytes per layer for a GPT block
with dropout in 16-bit; ours is that bookkeeping for this block. A pipeline rank holds
``bubble.in_flight`` microbatches' activations at its peak; without a pipeline one microbatch
(gradient accumulation runs forward and backward per microbatch). Context parallelism divides
the tokens by cp. The runner has no activation recomputation, so none is modelled.
Transient tensors (the s/cp × s/cp score blocks of ring attention, autograd's temporaries)
are not counted.
"""
from __future__ import annotations

import dataclasses

from meshscope.theory.schedules import in_flight

from .candidate import Candidate
from .estimate import MemoryEstimate
from .job_memory import job_memory
from .precision import Precision, precision_of
from .spec import ModelSpec
from .traffic import shape_of
from .training import Training

TOKEN_ID_BYTES = 8


@dataclasses.dataclass(frozen=True)
class ModelStates:
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def model_states(n_params: float, zero_stage: int, n_d: int, precision: Precision | str
                 ) -> ModelStates:
    """The ZeRO paper's per-rank model states for ``n_params`` (Ψ) parameters (see above)."""
    prec = precision_of(precision)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0-3, got {zero_stage}")
    return ModelStates(
        params_bytes=n_params * prec.param_bytes / (n_d if zero_stage >= 3 else 1),
        grads_bytes=n_params * prec.grad_bytes / (n_d if zero_stage >= 2 else 1),
        optimizer_bytes=n_params * prec.optimizer_bytes / (n_d if zero_stage >= 1 else 1))


def layer_activation_elements(spec: ModelSpec, i: int, tp: int, sp: bool, ep: int) -> float:
    """Elements autograd keeps per token for layer ``i`` on one rank (see the docstring)."""
    h, kv, a = spec.dim, spec.kv_dim, spec.n_heads
    norm = (2 * h / tp + 1 + h) if (sp and tp > 1) else (3 * h + 1)
    attention = (3 * h + 2 * kv + a) / tp
    if spec.is_moe_layer(i):
        k = spec.moe_top_k
        ffn = k * (4 * spec.expert_hidden + 3 * h) + (2 * k * h if ep > 1 else 0) \
            + 2 * spec.moe_experts
    else:
        ffn = 4 * spec.ffn_hidden / tp
    return 2 * norm + attention + ffn


def head_activation_elements(spec: ModelSpec, tp: int, sp: bool) -> float:
    """The last stage's final norm, logits and log-softmax per token."""
    h, v = spec.dim, spec.vocab_size
    norm = (2 * h / tp + 1 + h) if (sp and tp > 1) else (3 * h + 1)
    return norm + 2 * v + (v / tp if tp > 1 else 0)


def memory(spec: ModelSpec, cand: Candidate, precision: Precision | str = "fp32",
           training: Training | None = None) -> list[MemoryEstimate]:
    """One estimate per pipeline rank: the runner's own bookkeeping (below), or with a
    ``training`` of another framework the published one (``job_memory.py``)."""
    if training is not None and training.framework != "runner":
        return job_memory(spec, cand, training)
    prec = precision_of(precision)
    tp, ep = cand.layout.size("tp"), cand.layout.size("ep")
    n_d, zero = cand.dp_shards, cand.zero_stage
    sh = shape_of(spec, cand)
    layers_of = cand.stage_layers(spec.n_layers)
    out = []
    for r in range(cand.pp):
        dense = experts = 0.0
        units, acts = [], 0.0
        for stage in cand.stages_of(r):
            first, last = stage == 0, stage == cand.n_stages - 1
            groups = spec.stage_params(layers_of[stage], first=first, last=last)
            for g in groups:
                units.append(sum(p.local_numel(tp) for p in g if not p.name.startswith("expert")))
                for p in g:
                    if p.name.startswith("expert"):
                        experts += p.local_numel(tp) / ep
                    else:
                        dense += p.local_numel(tp)
            per_token = sum(layer_activation_elements(spec, i, tp, cand.sp, ep)
                            for i in layers_of[stage])
            if last:
                per_token += head_activation_elements(spec, tp, cand.sp)
            acts += per_token * sh.tokens * prec.act_bytes \
                + (sh.tokens * TOKEN_ID_BYTES if first else 0)
        # The runner's zero2 is FSDP2 without re-sharding after forward: its parameters are
        # stored sharded as under fsdp (the gathered copy is a runtime buffer, below), not
        # whole as classic ZeRO-2 keeps them.
        states = model_states(dense, 3 if cand.dp_mode == "zero2" else zero, n_d, prec)
        # (fsdp_noreshard, which the runner does not launch, is its zero2 by another name)
        expert_states = model_states(experts, 0, 1, prec)
        buffers = 0.0
        if n_d > 1:
            if cand.dp_mode == "ddp":
                buffers += dense * prec.grad_bytes
            elif cand.dp_mode in ("zero2", "fsdp", "fsdp_noreshard"):
                gathered = dense if cand.dp_mode != "fsdp" else sum(sorted(units)[-2:])
                buffers += gathered * prec.param_bytes
                if cand.microbatches > 1:
                    buffers += dense * prec.grad_bytes
        flight = in_flight(cand.schedule, cand.pp, cand.microbatches, cand.v, r)
        out.append(MemoryEstimate(
            pp_rank=r,
            params_bytes=states.params_bytes + expert_states.params_bytes,
            grads_bytes=states.grads_bytes + expert_states.grads_bytes,
            optimizer_bytes=states.optimizer_bytes + expert_states.optimizer_bytes,
            buffers_bytes=buffers, activations_bytes=acts * flight,
            microbatches_in_flight=flight,
            terms={"weights": states.params_bytes + expert_states.params_bytes,
                   "grads": states.grads_bytes + expert_states.grads_bytes,
                   "optimizer_state": states.optimizer_bytes + expert_states.optimizer_bytes,
                   "runtime_buffers": buffers, "activations": acts * flight}))
    return out
