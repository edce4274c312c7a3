"""Model sizes, without torch: the configuration of the Llama-style model (``parallel.model``)
and its named presets.

Kept apart from the model so that commands that only plan or validate a layout (``meshscope
plan``, ``meshscope sweep``'s enumeration, ``--help``) read sizes without importing torch.
"""
from __future__ import annotations

import dataclasses
import functools

from meshscope.theory.flops import training_flops_per_token
from meshscope.theory.params import DecoderShape, n_params


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    ffn_hidden: int = 172
    seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # Mixture of experts: 0 experts = dense. ``moe_every`` = k puts an MoE FFN in every k-th
    # layer (layers k-1, 2k-1, …); 1 = every layer.
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_every: int = 1
    moe_hidden: int = 64
    moe_aux_coef: float = 0.01

    def is_moe_layer(self, i: int) -> bool:
        return self.shape.is_moe_layer(i)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @functools.cached_property
    def shape(self) -> DecoderShape:
        """These sizes as ``meshscope.theory`` counts them (no GQA, no shared expert)."""
        return DecoderShape(dim=self.dim, n_layers=self.n_layers, ffn_hidden=self.ffn_hidden,
                            seq_len=self.seq_len, vocab_size=self.vocab_size,
                            n_heads=self.n_heads, moe_experts=self.moe_experts,
                            moe_top_k=self.moe_top_k, moe_every=self.moe_every,
                            moe_hidden=self.moe_hidden)

    def n_params(self, active: bool = False) -> int:
        """Parameter count (embedding and output head untied); ``active`` counts only the
        top-k experts a token passes through (``meshscope.theory.params.n_params``)."""
        return n_params(self.shape, active)

    def flops_per_token(self) -> int:
        """Training FLOPs per token, 6 × active non-embedding parameters + 12 · L · h · s
        (``meshscope.theory.flops.training_flops_per_token``, which cites its sources)."""
        return training_flops_per_token(self.shape)


# Named sizes. "tiny" keeps CI fast; "balanced" makes compute dominate per pipeline stage on CPU
# so bubble measurements are meaningful, "wide" even more so; "small" is a sensible GPU smoke size.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "balanced": ModelConfig(dim=256, n_layers=4, n_heads=4, ffn_hidden=680, seq_len=128),
    # Four times balanced's compute per token for twice its bytes between stages, and the last
    # stage's head and loss about 1% of its work: what the bubble-vs-closed-form checks need at
    # 8 microbatches, where a few ms per transfer or a 3% heavier stage move the bubble by 10%.
    "wide": ModelConfig(dim=512, n_layers=4, n_heads=8, ffn_hidden=1536, seq_len=128),
    # 8 layers so that 4 pipeline ranks can hold two stages each.
    "tiny8": ModelConfig(n_layers=8),
    "tiny-moe": ModelConfig(moe_experts=4, moe_top_k=2, moe_every=1, moe_hidden=64),
    "small": ModelConfig(vocab_size=32000, dim=1024, n_layers=16, n_heads=16, ffn_hidden=2816,
                         seq_len=1024),
}
