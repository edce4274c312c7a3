"""Deterministic synthetic token data.

Sequences follow a noisy affine recurrence t[i+1] = (a·t[i] + b) mod V, so a model can learn them
and the loss falls; every batch is a pure function of (seed, step), so a multi-rank run and a
single process see exactly the same global batch.
"""
from __future__ import annotations

import torch


def global_batch(seed: int, step: int, batch_size: int, seq_len: int, vocab_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, each (batch_size, seq_len) int64."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab_size, (batch_size, 1), generator=g)
    mult = torch.randint(1, 8, (batch_size, 1), generator=g)
    steps = torch.arange(seq_len + 1).unsqueeze(0)
    seq = (start + mult * steps) % vocab_size
    noise = torch.rand(seq.shape, generator=g) < 0.05
    seq = torch.where(noise, torch.randint(0, vocab_size, seq.shape, generator=g), seq)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def dp_shard(t: torch.Tensor, dp_rank: int, dp_size: int) -> torch.Tensor:
    """This data-parallel rank's contiguous slice of the global batch."""
    per = t.shape[0] // dp_size
    return t[dp_rank * per:(dp_rank + 1) * per]
