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

With PyTorch's DTensor tensor parallelism (``framework`` torch: torchtitan, FSDP2 + TP) the
QKV and MLP inputs are kept whole: autograd saves what the column-parallel linear received,
the all-gathered sequence, where Megatron keeps the shard and gathers it again in backward.

``op`` recomputation (torchtitan's op-level selective checkpointing) keeps about half of the
layer's activations plus its input. Heads of width d ≠ h/a (Qwen3), multi-head latent
attention (the per-head Q, K, V and the two latent inputs) and a plain two-matrix MLP (the
activation's input and output, 4sbf) are counted as they are. Context parallelism divides s by
cp. All functions return bytes for one microbatch; the loss's fp32 logits are their own term
(``logits_loss_bytes``).
"""
from __future__ import annotations

from .spec import ModelSpec
from .training import Training


def layer_activation_bytes(spec: ModelSpec, i: int, *, tokens: float, tp: int, sp: bool,
                           t: Training, s_local: int | None = None, b: float = 1.0,
                           capacity_factor: float = 1.0) -> float:
    """Bytes layer ``i`` keeps for backward on one rank, for ``tokens`` = s·b of its
    microbatch (s already divided by cp). ``s_local``·``b`` = tokens: the sequence length the
    attention core sees (for the s² term). ``capacity_factor`` scales what the experts keep
    (tokens an expert takes over its balanced share)."""
    h, a = spec.dim, spec.n_heads
    s = s_local if s_local is not None else tokens
    sbh = tokens * h
    e = t.act_bytes / 2            # the paper's counts are for 2-byte activations
    lin = 0.5 if t.precision == "fp8" else 1.0     # fp8: GEMM inputs saved in one byte
    if t.recompute == "full":
        return 2 * sbh * e / (tp if sp else 1)
    moe = spec.is_moe_layer(i)
    # the QKV and first MLP linears' inputs: with sequence parallelism Megatron saves them
    # sharded and all-gathers them again in backward (Korthikanti §4.2.2); PyTorch's DTensor
    # tensor parallelism (torchtitan, FSDP2 + TP) saves what the linear received — the
    # all-gathered, whole-sequence input
    gathered = 2 * sbh * lin * 2
    gathered_whole = sp and tp > 1 and t.framework == "torch"
    if t.block == "gpt":
        outside = 4 * sbh + 2 * sbh                       # norms' inputs, dropout masks
        inside = 4 * sbh + 2 * sbh + 2 * sbh * lin + 16 * sbh * (spec.ffn_hidden / (4 * h))
        core = 5 * a * s * tokens
    else:
        outside = 4 * sbh
        if spec.mla:
            qk, v = spec.head_width, spec.v_head_dim
            attn = 2 * tokens * a * (2 * qk + v) \
                + 2 * tokens * (spec.q_lora_rank + spec.kv_lora_rank) * lin * tp
            out_in = 2 * tokens * a * v * lin
        else:
            attn = 2 * tokens * spec.q_dim + 4 * tokens * spec.kv_dim
            out_in = 2 * tokens * spec.q_dim * lin

        def mlp_bytes(f):
            # gated: the fused gate/up output (2f) and the down projection's input (f);
            # plain: the activation's input and output (f each)
            return (4 * tokens * f + 2 * tokens * f * lin) if spec.gated_mlp else \
                (2 * tokens * f + 2 * tokens * f * lin)

        if moe:
            k = spec.moe_top_k
            mlp = k * capacity_factor * mlp_bytes(spec.expert_hidden) \
                + 2 * tokens * spec.moe_experts * 2            # routed copies, router logits
            if spec.moe_shared_hidden:
                mlp += mlp_bytes(spec.moe_shared_hidden)
        else:
            mlp = mlp_bytes(spec.ffn_hidden)
        inside = attn + out_in + mlp
        core = 2 * a * s * tokens
    if t.flash_attention or t.recompute == "selective":
        core = 0.0
    lse = 4 * a * tokens if t.flash_attention and t.recompute != "selective" else 0.0
    kept = (outside + (0 if gathered_whole else gathered)) * e / (tp if sp else 1) \
        + (gathered * e if gathered_whole else 0.0) + (inside * e + core * e) / tp + lse / tp
    if t.recompute == "op":
        # torchtitan's op-level policy keeps every other matmul's output and the attention's,
        # recomputing the rest: about half of what the layer keeps, plus its input
        return 0.5 * kept + 2 * sbh * e / (tp if sp else 1)
    return kept


def first_stage_extra_bytes(spec: ModelSpec, *, tokens: float, tp: int, sp: bool,
                            t: Training) -> float:
    """The embedding's: token ids (8 bytes each) and, for GPT, the embedding dropout's mask."""
    mask = tokens * spec.dim / (tp if sp else 1) if t.block == "gpt" else 0.0
    return 8 * tokens / tp + mask


def last_stage_extra_bytes(spec: ModelSpec, *, tokens: float, tp: int, sp: bool,
                           t: Training) -> float:
    """The final norm's input and the output layer's input (2 bytes × h each, ÷ t with
    sequence parallelism). The logits and the loss are their own term
    (``logits_loss_bytes``)."""
    return (2 * tokens * spec.dim * t.act_bytes / 2) / (tp if sp else 1) * 2


# Bytes per logit element at the loss's peak: the fp32 softmax (or log-softmax) kept for the
# backward (4), its fp32 gradient (4) and the 16-bit logits or their gradient (2) — as
# Megatron's vocabulary-parallel cross-entropy and PyTorch's upcast-then-cross-entropy both
# hold them for one microbatch on the last stage.
LOGIT_BYTES = 10


def logits_loss_bytes(spec: ModelSpec, *, tokens: float, tp: int) -> float:
    """The loss's transient buffers on the last stage: ``LOGIT_BYTES`` per logit element,
    tokens × V/t of them (the vocabulary split over tensor parallelism)."""
    return LOGIT_BYTES * tokens * spec.vocab_size / tp
