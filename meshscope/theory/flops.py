"""Training FLOPs per token — one definition, for dense, GQA and MoE models alike.

**The 6N rule** (Kaplan et al., 2020, §2.1): a token costs 2 FLOPs per weight it meets in the
forward pass (a multiply and an add) and twice that in the backward pass (gradients of the
input and of the weight): 6N for training, with N the weights a token passes through — for an
MoE model its top-k experts, not all of them (``params.n_params(shape, active=True)``); GQA
enters through the narrower wk and wv (``params.attention_params``). The embedding is a lookup,
not a product: it is left out unless it is also the (tied) output head.

**Attention's own products**, which have no weights: the scores Q·Kᵀ and their product with V
cost 2·2·h·s FLOPs per token and layer forward (s the sequence length), 12·h·s for training —
the PaLM paper's MFU definition (Chowdhery et al., 2022, App. B) and Megatron-LM's
(Narayanan et al., 2021, eq. 3).

So ``training_flops_per_token`` = 6 · (active parameters − untied embedding) + 12 · L · h · s,
what run.json's ``flops_per_token`` holds and MFU divides by.

``layer_forward_flops_per_token`` is one layer's share of the forward pass (2 × its matmul
weights + 4·h·s, norms left out: they are elementwise), and ``head_training_flops_per_token``
the output head's 6·h·V — what a pipeline stage's work is summed from.
"""
from __future__ import annotations

from .params import DecoderShape, attention_params, embedding_params, ffn_params, n_params


def training_flops_per_token(shape: DecoderShape) -> int:
    """6 × (active parameters − the untied embedding) + 12 · L · h · s."""
    lookup = 0 if shape.tied_embeddings else embedding_params(shape)
    matmul = n_params(shape, active=True) - lookup
    return 6 * matmul + 12 * shape.n_layers * shape.dim * shape.seq_len


def layer_forward_flops_per_token(shape: DecoderShape, i: int) -> int:
    """Forward FLOPs a token costs in layer ``i``: 2 × (attention + active FFN weights) +
    attention's 4·h·s."""
    weights = attention_params(shape) + ffn_params(shape, i, active=True)
    return 2 * weights + 4 * shape.dim * shape.seq_len


def layer_training_flops_per_token(shape: DecoderShape, i: int) -> int:
    """Forward and backward: 3 × the forward."""
    return 3 * layer_forward_flops_per_token(shape, i)


def head_training_flops_per_token(shape: DecoderShape) -> int:
    """The output head (V × h) forward and backward: 6·h·V."""
    return 6 * shape.dim * shape.vocab_size


def gpt_layer_forward_flops_per_token(shape: DecoderShape) -> int:
    """A GPT layer instead (a 2-matrix MLP of width f, GeLU, not SwiGLU): 2·(4h² + 2h·f) +
    4·h·s — 24h² + 4hs at f = 4h (Narayanan et al., 2021, eq. 3 ÷ 3 passes ÷ L)."""
    h = shape.dim
    return 2 * (4 * h * h + 2 * h * shape.ffn_hidden) + 4 * h * shape.seq_len
