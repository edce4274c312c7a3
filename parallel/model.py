"""A small Llama-style decoder language model (RMSNorm, RoPE, SwiGLU).

The model is deliberately plain: parallelism is applied *to* it from outside (see
``parallel.pipeline``), in the torchtitan style, never baked in. Layers live in a
``ModuleDict`` keyed by their index so that a pipeline stage can drop the layers it does not own
and still keep the same parameter names as the full model.

References: Llama (Touvron et al., 2023) for the block layout; RMSNorm (Zhang & Sennrich,
2019); rotary position embeddings (Su et al., 2021); SwiGLU (Shazeer, 2020).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import PRESETS, ModelConfig  # noqa: F401 - re-exported: the sizes live in config.py


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (seq_len, head_dim/2) for rotary embeddings."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
    angles = torch.outer(torch.arange(cfg.seq_len).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x (batch, heads, seq, head_dim) by position angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    seq = x.shape[-2]
    c, s = cos[:seq], sin[:seq]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return out.flatten(-2)


def causal_attention(q, k, v):
    """Causal scaled dot-product attention over (batch, heads, seq, head_dim)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Multi-head causal self-attention. ``attn_fn`` is the core (q, k, v) → out operation;
    context parallelism replaces it with ring attention (``parallel.context_parallel``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.attn_fn = causal_attention
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.attn_fn(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if cfg.is_moe_layer(index):
            from .moe import MoE
            self.feed_forward = MoE(cfg)
        else:
            self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Decoder LM. Any of ``tok_embeddings``, ``norm``, ``output`` may be ``None`` on a
    pipeline stage that does not own it; the forward then passes hidden states through."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Module | None = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): Block(cfg, i) for i in range(cfg.n_layers)})
        self.norm: nn.Module | None = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output: nn.Module | None = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # Global positions of this rank's tokens when the sequence is sharded (context
        # parallelism); None means positions 0 … seq-1.
        self.positions: torch.Tensor | None = None

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens_or_hidden) if self.tok_embeddings is not None \
            else tokens_or_hidden
        if self.positions is not None:
            cos, sin = self.rope_cos[self.positions], self.rope_sin[self.positions]
        else:
            cos, sin = self.rope_cos, self.rope_sin
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def build_model(cfg: ModelConfig, seed: int) -> Transformer:
    """The full model, initialised identically on every rank from ``seed``."""
    torch.manual_seed(seed)
    return Transformer(cfg)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))

