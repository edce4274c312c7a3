"""Activation memory per transformer layer, as Korthikanti et al. (2022) count it.

"Reducing Activation Recomputation in Large Transformer Models", §4 and Table 2: with s the
sequence, b the microbatch, h the hidden size, a the heads and t the tensor-parallel size, a
GPT layer in 16-bit keeps, in bytes,

- outside the tensor-parallel regions (split over t only with sequence parallelism): the two
  LayerNorms' inputs 4sbh, the QKV and first MLP linears' inputs 2sbh each, and the two
  dropout masks sbh each — **10sbh**;
- inside them (÷ t): Q and K 4sbh, V 2sbh, the output projection's input 2sbh, the MLP's
  GeLU input and output 8sbh each — **24sbh** — and the attention core's softmax output
  2as²b, its dropout mask as²b and dropout output 2as²b — **5as²b**.

So sbh(34 + 5as/h) per layer without parallelism; sbh(10 + 24/t + 5as/(ht)) with tensor
parallelism; sbh/t·(34 + 5as/h) with sequence parallelism too. Selective recomputation drops
the 5as²b (recomputed in backward), full recomputation keeps only the layer's input, 2sbh
(÷ t under sequence parallelism). Flash attention keeps no s × s tensor either, only the
softmax's log-sum-exp (4 bytes × a·s·b).

The Llama block (RMSNorm, no dropout, grouped-query attention with kv key/value width, a
SwiGLU MLP of width f) by the same bookkeeping: outside 8sbh (two norm inputs, QKV and MLP
inputs); inside 2sbh (Q) + 4sb·kv (K, V) + 2sbh (output projection input) + 6sbf (the fused
gate/up output 4sbf and the down projection's input 2sbf, as Megatron's fused SwiGLU saves
them) and the attention core 2as²b (softmax output; no dropout) or flash's log-sum-exp. With
``fp8`` the linears' saved inputs (QKV, output projection, MLP in and down-projection input)
take one byte. A MoE layer keeps each token's k routed copies through its expert MLP and the
shared expert's MLP, plus the router's logits.

Context parallelism divides s by cp. All functions return bytes for one microbatch.
"""
from __future__ import annotations

from .spec import ModelSpec
from .training import Training


def layer_activation_bytes(spec: ModelSpec, i: int, *, tokens: float, tp: int, sp: bool,
                           t: Training, s_local: int | None = None, b: float = 1.0) -> float:
    """Bytes layer ``i`` keeps for backward on one rank, for ``tokens`` = s·b of its
    microbatch (s already divided by cp). ``s_local``·``b`` = tokens: the sequence length the
    attention core sees (for the s² term)."""
    h, a = spec.dim, spec.n_heads
    s = s_local if s_local is not None else tokens
    sbh = tokens * h
    e = t.act_bytes / 2            # the paper's counts are for 2-byte activations
    lin = 0.5 if t.precision == "fp8" else 1.0     # fp8: GEMM inputs saved in one byte
    if t.recompute == "full":
        return 2 * sbh * e / (tp if sp else 1)
    moe = spec.is_moe_layer(i)
    if t.block == "gpt":
        outside = 4 * sbh + 2 * sbh * lin * 2 + 2 * sbh     # norms, 2 linear inputs, masks
        inside = 4 * sbh + 2 * sbh + 2 * sbh * lin + 16 * sbh * (spec.ffn_hidden / (4 * h))
        core = 5 * a * s * tokens
    else:
        kv = spec.kv_dim
        f = spec.expert_hidden if moe else spec.ffn_hidden
        outside = 4 * sbh + 2 * sbh * lin * 2
        mlp = 4 * tokens * f + 2 * tokens * f * lin
        if moe:
            k = spec.moe_top_k
            mlp = k * mlp + 2 * tokens * spec.moe_experts * 2   # routed copies, router logits
            if spec.moe_shared_hidden:
                fs = spec.moe_shared_hidden
                mlp += 4 * tokens * fs + 2 * tokens * fs * lin
        inside = 2 * sbh + 4 * tokens * kv + 2 * sbh * lin + mlp
        core = 2 * a * s * tokens
    if t.flash_attention or t.recompute == "selective":
        core = 0.0
    lse = 4 * a * tokens if t.flash_attention and t.recompute != "selective" else 0.0
    return (outside * e / (tp if sp else 1) + (inside * e + core * e) / tp + lse / tp)


def first_stage_extra_bytes(spec: ModelSpec, *, tokens: float, tp: int, sp: bool,
                            t: Training) -> float:
    """The embedding's: token ids (8 bytes each) and, for GPT, the embedding dropout's mask."""
    mask = tokens * spec.dim / (tp if sp else 1) if t.block == "gpt" else 0.0
    return 8 * tokens / tp + mask


def last_stage_extra_bytes(spec: ModelSpec, *, tokens: float, tp: int, sp: bool,
                           t: Training) -> float:
    """The final norm's input and the output layer's: its input (2 bytes × h) and fp32
    logits for the cross-entropy (4 bytes × V/t), as Megatron keeps them."""
    return (2 * tokens * spec.dim * t.act_bytes / 2) / (tp if sp else 1) * 2 \
        + 4 * tokens * spec.vocab_size / tp
