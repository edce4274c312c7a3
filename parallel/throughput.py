"""Throughput per step: tokens/s, model FLOPs and MFU.

For step t, ``step_time_us`` is the slowest rank's wall time (every rank waits for it),
``tokens_per_s`` = global batch × sequence length / step time, and ``mfu_pct`` =
flops_per_token × tokens_per_s / (world size × the device's peak FLOP/s) × 100 — model FLOPs
utilisation as in the PaLM paper, with flops_per_token from ``ModelConfig.flops_per_token``.
MFU is NaN where the device's peak is unknown (every CPU); the peak comes from run.json
(``device.peak_flops``: the command line's ``--peak-tflops`` or ``collectors/devices.py``).
"""
from __future__ import annotations

import math
import pathlib

import pandas as pd

from meshscope.collectors import step_timer


def step_table(run_dir: pathlib.Path, desc: dict) -> tuple[pd.DataFrame | None, list[str]]:
    """Columns: step, loss (mean over the ranks that compute it), step_time_us, tokens_per_s,
    mfu_pct — None when the run left no readable step timers; and a line naming each timer file
    that could not be read (its rank is left out)."""
    steps, problems = step_timer.read_all(run_dir)
    if steps.empty:
        return None, problems
    out = steps.groupby("step").agg(step_time_us=("wall_time_us", "max")).reset_index()
    loss = steps.dropna(subset=["loss"]).groupby("step")["loss"].mean()
    out["loss"] = out["step"].map(loss)
    tokens = desc["global_batch"] * desc["model"]["seq_len"]
    out["tokens_per_s"] = tokens / (out["step_time_us"] / 1e6)
    peak = (desc.get("device") or {}).get("peak_flops")
    flops = desc["model"]["flops_per_token"]
    out["mfu_pct"] = (flops * out["tokens_per_s"] / (desc["world_size"] * peak) * 100
                      if peak else math.nan)
    return out, problems
