"""Throughput per step for ``meshscope run``'s printout: tokens/s, model FLOPs and MFU.

The definitions live once, in ``meshscope.analysis.records.steps`` (``throughput``), which the
report uses too; this is the run command's view of the same table.
"""
from __future__ import annotations

import pathlib

import pandas as pd

from meshscope.analysis.records.steps import throughput
from meshscope.collectors import step_timer
from meshscope.collectors.run_info import RunInfo


def step_table(run_dir: pathlib.Path, run: RunInfo) -> tuple[pd.DataFrame | None, list[str]]:
    """Columns: step, loss (mean over the ranks that compute it), step_time_us, tokens_per_s,
    mfu_pct — None when the run left no readable step timers; and a line naming each timer file
    that could not be read (its rank is left out)."""
    steps, problems = step_timer.read_all(run_dir)
    if steps.empty:
        return None, problems
    return throughput(steps, run), problems
