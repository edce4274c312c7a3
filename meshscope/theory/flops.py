"""Training FLOPs per token — one definition, for dense, GQA, MLA and MoE models alike.

**The 6N rule** (Kaplan et al., 2020, §2.1): a token costs 2 FLOPs per weight it meets in the
forward pass (a multiply and an add) and twice that in the backward pass (gradients of the
input and of the weight): 6N for training, with N the weights a token passes through — for an
MoE model its top-k experts, not all of them (``params.n_params(shape, active=True)``); GQA
and MLA enter through their narrower projections (``params.attention_params``), a plain
(GeLU) MLP through its two matrices instead of SwiGLU's three. The embedding and learned
positions are lookups, not products: they are left out unless the embedding is also the
(tied) output head.

**Attention's own products**, which have no weights: the scores Q·Kᵀ and their product with V
cost 2·s·a·(d_qk + d_v) FLOPs per token and layer forward (s the tokens attended to — the
sequence, or a sliding window —, a heads, d_qk and d_v the query/key and value head widths):
4·h·s when a·d = h, 12·h·s for training — the PaLM paper's MFU definition (Chowdhery et al.,
2022, App. B) and Megatron-LM's (Narayanan et al., 2021, eq. 3). The causal mask's skipped
half is counted, as both definitions do.

So ``training_flops_per_token`` = 6 · (active parameters − lookups) + Σ_layers 3 · attention,
what run.json's ``flops_per_token`` holds and MFU divides by.

``layer_forward_flops_per_token`` is one layer's share of the forward pass (2 × its matmul
weights + its attention products, norms left out: they are elementwise), and
``head_training_flops_per_token`` the output head's 6·h·V — what a pipeline stage's work is
summed from.
"""
from __future__ import annotations

from .params import (DecoderShape, attention_params, embedding_params, ffn_params,
                     lookup_params, n_params)


def attention_core_forward_flops_per_token(shape: DecoderShape, i: int) -> int:
    """Q·Kᵀ and the product with V of layer ``i``, per token, forward: 2·s·a·(d_qk + d_v)."""
    return 2 * shape.attention_span(i) * shape.n_heads * (shape.head_width
                                                         + shape.value_head_width)


def training_flops_per_token(shape: DecoderShape) -> int:
    """6 × (active parameters − lookups) + 3 × every layer's attention products."""
    matmul = n_params(shape, active=True) - lookup_params(shape)
    return 6 * matmul + 3 * sum(attention_core_forward_flops_per_token(shape, i)
                                for i in range(shape.n_layers))


def layer_forward_flops_per_token(shape: DecoderShape, i: int) -> int:
    """Forward FLOPs a token costs in layer ``i``: 2 × (attention + active FFN weights) +
    the attention products."""
    weights = attention_params(shape) + ffn_params(shape, i, active=True)
    return 2 * weights + attention_core_forward_flops_per_token(shape, i)


def layer_training_flops_per_token(shape: DecoderShape, i: int) -> int:
    """Forward and backward: 3 × the forward."""
    return 3 * layer_forward_flops_per_token(shape, i)


def head_training_flops_per_token(shape: DecoderShape) -> int:
    """The output head (V × h) forward and backward: 6·h·V."""
    return 6 * embedding_params(shape)
