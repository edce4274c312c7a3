"""The decoder's shape and its parameter counts.

A Llama-style decoder layer (``meshscope.parallel.model``) holds, with hidden size h, key/value
width kv = (key/value heads) × (h / heads) — kv = h without grouped-query attention (GQA,
Ainslie et al., 2023) — and FFN width f:

- attention: wq and wo (h × h each), wk and wv (kv × h each): 2h² + 2h·kv;
- a SwiGLU FFN, w1 and w3 (f × h) and w2 (h × f): 3h·f;
- or a mixture of experts (Shazeer et al., 2017; the top-k router of Fedus et al., 2021):
  a router (E × h), E experts of width f_e (3h·f_e each) and an optional shared expert of
  width f_s (3h·f_s); a token passes through the router, its top-k experts and the shared one;
- two RMSNorm weights (h each).

The model adds the token embedding (V × h), a final norm (h) and the output head (V × h,
the embedding itself when tied). ``n_params(shape, active=True)`` counts only what one token
passes through: the top-k experts of each MoE layer instead of all E — the N of the 6N rule
(``flops.py``).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    """The sizes every count here reads. ``n_kv_heads`` None: as many key/value heads as
    query heads (kv = h). ``moe_experts`` 0: dense. An MoE layer is every ``moe_every``-th
    layer (layers k−1, 2k−1, …) after the first ``moe_first_dense`` layers."""
    dim: int
    n_layers: int
    ffn_hidden: int
    seq_len: int
    vocab_size: int = 0
    n_heads: int = 1
    n_kv_heads: int | None = None
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_every: int = 1
    moe_first_dense: int = 0
    moe_hidden: int | None = None        # None: ffn_hidden
    moe_shared_hidden: int = 0
    tied_embeddings: bool = False

    @property
    def kv_dim(self) -> int:
        """Width of wk and wv: h without GQA, else key/value heads × head width."""
        if self.n_kv_heads is None:
            return self.dim
        return self.n_kv_heads * (self.dim // self.n_heads)

    @property
    def expert_hidden(self) -> int:
        return self.moe_hidden or self.ffn_hidden

    def is_moe_layer(self, i: int) -> bool:
        return (self.moe_experts > 0 and i >= self.moe_first_dense
                and (i + 1) % self.moe_every == 0)


def attention_params(shape: DecoderShape) -> int:
    """wq, wk, wv, wo: 2h² + 2h·kv."""
    h = shape.dim
    return 2 * h * h + 2 * h * shape.kv_dim


def ffn_params(shape: DecoderShape, i: int, active: bool = False) -> int:
    """Layer ``i``'s FFN: 3h·f dense; router E·h + (k or E)·3h·f_e + 3h·f_s for MoE, k (the
    top-k) experts when ``active``."""
    h = shape.dim
    if not shape.is_moe_layer(i):
        return 3 * h * shape.ffn_hidden
    experts = shape.moe_top_k if active else shape.moe_experts
    return (h * shape.moe_experts + experts * 3 * h * shape.expert_hidden
            + 3 * h * shape.moe_shared_hidden)


def layer_params(shape: DecoderShape, i: int, active: bool = False) -> int:
    """Layer ``i``: its two norms, attention and FFN."""
    return 2 * shape.dim + attention_params(shape) + ffn_params(shape, i, active)


def embedding_params(shape: DecoderShape) -> int:
    return shape.vocab_size * shape.dim


def n_params(shape: DecoderShape, active: bool = False) -> int:
    """All parameters: embedding, every layer, the final norm and the output head (counted
    once with the embedding when tied); ``active``: a token's top-k experts only."""
    head = 0 if shape.tied_embeddings else embedding_params(shape)
    layers = sum(layer_params(shape, i, active) for i in range(shape.n_layers))
    return embedding_params(shape) + layers + shape.dim + head
