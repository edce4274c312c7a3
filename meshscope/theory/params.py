"""The decoder's shape and its parameter counts.

A decoder layer holds, with hidden size h, a heads of width d (``head_dim``; h / a unless a
model says otherwise — Qwen3, Gemma), key/value heads k (grouped-query attention, GQA,
Ainslie et al., 2023; k = a without it) and FFN width f:

- attention: wq (a·d × h), wk and wv (k·d × h each), wo (h × a·d): h·(2·a·d + 2·k·d) — the
  familiar 2h² + 2h·kv when a·d = h; q, k, v biases (Qwen2, GPT-2/3) add a·d + 2·k·d, wo's
  bias h; per-head q/k norms (Qwen3) 2·d;
- or **multi-head latent attention** (MLA, DeepSeek-V2/V3): the query through a rank-r_q
  bottleneck (h·r_q, its norm r_q, r_q·a·(d_nope + d_rope)), keys and values through a rank-r_kv
  one shared by all heads (h·(r_kv + d_rope), its norm r_kv, r_kv·a·(d_nope + d_v)) and the
  output a·d_v × h;
- the MLP: **gated** (SwiGLU, Llama and its descendants: w1 and w3 f × h, w2 h × f: 3h·f) or
  **plain** (GPT-2/3, OPT, BLOOM, MPT: a GeLU between two matrices: 2h·f); with biases f (or
  2f gated) + h;
- or a **mixture of experts** (Shazeer et al., 2017; the top-k router of Fedus et al., 2021):
  a router (E × h), E experts of width f_e and an optional shared expert of width f_s, each an
  MLP of the model's kind; a token passes through the router, its top-k experts and the
  shared one; DeepSeek keeps the first ``moe_first_dense`` layers dense;
- two norms (h each; 2h with LayerNorm's bias).

The model adds the token embedding (V × h), learned absolute positions (GPT-2/3, OPT: P × h),
an optional norm after the embedding (BLOOM), a final norm and the output head (V × h, the
embedding itself when tied). DeepSeek-V3's multi-token-prediction modules (``mtp_layers``) are
counted apart (``mtp_params``): the published 671B is the main model, the checkpoint's 685B
adds them. ``n_params(shape, active=True)`` counts only what one token passes through: the
top-k experts of each MoE layer instead of all E — the N of the 6N rule (``flops.py``).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    """The sizes every count here reads. ``n_kv_heads`` None: as many key/value heads as
    query heads. ``head_dim`` None: dim / n_heads. ``moe_experts`` 0: dense. An MoE layer is
    every ``moe_every``-th layer (layers k−1, 2k−1, …) after the first ``moe_first_dense``
    layers. ``kv_lora_rank`` > 0: multi-head latent attention. ``sliding_layers``: the layers
    whose attention sees only the last ``sliding_window`` tokens."""
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
    head_dim: int | None = None          # None: dim // n_heads
    gated_mlp: bool = True               # SwiGLU (3 matrices) or a plain 2-matrix MLP
    qkv_bias: bool = False               # wq, wk, wv have biases (GPT-2/3, Qwen2)
    out_bias: bool = False               # wo has a bias (GPT-2/3, GPT-OSS)
    mlp_bias: bool = False               # the MLPs' (and the router's) linears have biases
    norm_bias: bool = False              # LayerNorm's bias beside its weight
    qk_norm: bool = False                # per-head norms of q and k (Qwen3)
    position_embeddings: int = 0         # learned absolute positions: rows of h
    embedding_norm: bool = False         # a norm after the embedding (BLOOM)
    q_lora_rank: int = 0                 # MLA: 0 = the query without a bottleneck
    kv_lora_rank: int = 0                # MLA when > 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    mtp_layers: int = 0                  # DeepSeek-V3's multi-token prediction modules

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_width(self) -> int:
        """d: the width of one attention head (MLA: of a query/key head, nope + rope)."""
        if self.mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim or self.dim // self.n_heads

    @property
    def value_head_width(self) -> int:
        return self.v_head_dim if self.mla else self.head_width

    @property
    def q_dim(self) -> int:
        """Width of the attention's queries (a·d): h unless head_dim says otherwise."""
        return self.n_heads * self.head_width

    @property
    def kv_dim(self) -> int:
        """Width of wk and wv: h without GQA, else key/value heads × head width."""
        return self.kv_heads * self.head_width

    @property
    def expert_hidden(self) -> int:
        return self.moe_hidden or self.ffn_hidden

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP: 3 gated (SwiGLU), 2 plain."""
        return 3 if self.gated_mlp else 2

    def is_moe_layer(self, i: int) -> bool:
        return (self.moe_experts > 0 and i >= self.moe_first_dense
                and (i + 1) % self.moe_every == 0)

    def attention_span(self, i: int) -> int:
        """Tokens layer ``i``'s attention looks at: the sequence, or the sliding window."""
        if self.sliding_window and i in self.sliding_layers:
            return min(self.seq_len, self.sliding_window)
        return self.seq_len


def norm_params(shape: DecoderShape, width: int) -> int:
    return width * (2 if shape.norm_bias else 1)


def attention_params(shape: DecoderShape) -> int:
    """The attention's weights (and biases): the module docstring's forms."""
    h = shape.dim
    if shape.mla:
        a, qk, v = shape.n_heads, shape.head_width, shape.v_head_dim
        if shape.q_lora_rank:
            q = h * shape.q_lora_rank + shape.q_lora_rank + shape.q_lora_rank * a * qk
        else:
            q = h * a * qk
        kv = h * (shape.kv_lora_rank + shape.qk_rope_head_dim) + shape.kv_lora_rank \
            + shape.kv_lora_rank * a * (shape.qk_nope_head_dim + v)
        return q + kv + a * v * h + (h if shape.out_bias else 0)
    q, kv = shape.q_dim, shape.kv_dim
    weights = h * (2 * q + 2 * kv)
    bias = (q + 2 * kv if shape.qkv_bias else 0) + (h if shape.out_bias else 0)
    return weights + bias + (2 * shape.head_width if shape.qk_norm else 0)


def mlp_params(shape: DecoderShape, width: int) -> int:
    """One MLP of ``width`` (an expert's, the shared expert's or the dense one)."""
    h, n = shape.dim, shape.mlp_matrices
    bias = ((n - 1) * width + h) if shape.mlp_bias else 0
    return n * h * width + bias


def ffn_params(shape: DecoderShape, i: int, active: bool = False) -> int:
    """Layer ``i``'s FFN: one MLP of width f dense; for MoE the router E·h, (k or E) experts
    and the shared expert — k (the top-k) experts when ``active``."""
    h = shape.dim
    if not shape.is_moe_layer(i):
        return mlp_params(shape, shape.ffn_hidden)
    experts = shape.moe_top_k if active else shape.moe_experts
    router = h * shape.moe_experts + (shape.moe_experts if shape.mlp_bias else 0)
    shared = mlp_params(shape, shape.moe_shared_hidden) if shape.moe_shared_hidden else 0
    return router + experts * mlp_params(shape, shape.expert_hidden) + shared


def layer_params(shape: DecoderShape, i: int, active: bool = False) -> int:
    """Layer ``i``: its two norms, attention and FFN."""
    return 2 * norm_params(shape, shape.dim) + attention_params(shape) \
        + ffn_params(shape, i, active)


def embedding_params(shape: DecoderShape) -> int:
    return shape.vocab_size * shape.dim


def lookup_params(shape: DecoderShape) -> int:
    """Weights that are looked up, not multiplied: the token embedding (unless it is also the
    output head) and learned positions."""
    return (0 if shape.tied_embeddings else embedding_params(shape)) \
        + shape.position_embeddings * shape.dim


def n_params(shape: DecoderShape, active: bool = False) -> int:
    """All parameters of the main model: embedding (and positions), every layer, the final
    norm and the output head (counted once with the embedding when tied); ``active``: a
    token's top-k experts only. Multi-token-prediction modules: ``mtp_params``."""
    head = 0 if shape.tied_embeddings else embedding_params(shape)
    layers = sum(layer_params(shape, i, active) for i in range(shape.n_layers))
    extra = shape.position_embeddings * shape.dim \
        + (norm_params(shape, shape.dim) if shape.embedding_norm else 0)
    return embedding_params(shape) + extra + layers + norm_params(shape, shape.dim) + head


def mtp_params(shape: DecoderShape, active: bool = False) -> int:
    """DeepSeek-V3's multi-token-prediction modules, each two norms and a 2h → h projection
    before a layer like the model's last, and a norm before the (shared) output head."""
    if not shape.mtp_layers:
        return 0
    h = shape.dim
    last = layer_params(shape, shape.n_layers - 1, active)
    return shape.mtp_layers * (3 * norm_params(shape, h) + 2 * h * h + last)
