"""The single-process reference every parallel layout must reproduce.

Same model, seed, data and optimizer as the runner; the global batch is split into the same
number of microbatches per data-parallel rank and gradients are accumulated, so the update
equals what DDP (mean over ranks) and the pipeline schedules (mean over microbatches) compute.
"""
from __future__ import annotations

import torch

from .data import global_batch
from .model import ModelConfig, build_model, lm_loss


def reference_losses(cfg: ModelConfig, *, steps: int, seed: int, batch: int, lr: float = 1e-3
                     ) -> list[float]:
    """Per-step mean loss over the global batch, trained in one process."""
    torch.set_num_threads(1)
    model = build_model(cfg, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    out = []
    for step in range(steps):
        x, y = global_batch(seed, step, batch, cfg.seq_len, cfg.vocab_size)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out
