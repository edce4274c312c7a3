"""Memory is bounded by per-rank work, not by the rank count: analysing 32 synthetic ranks
peaks below a fixed multiple of analysing 4 of the same ranks' size.

Both runs come from ``bench/synth.py`` (dp × pp = 2, 1F1B, the runner's CPU trace structure,
~30k events per rank) and are analysed by ``meshscope analyze --no-cache`` as a process; the
peak RSS of its largest process comes from ``wait4`` and that of all its processes (the ingest
workers too) from sampling (``bench/measure.py``). The test also checks its own premise: the
28 extra ranks' event tables, as ingest holds them in memory, are large enough that a process
keeping them all would break the bound — so the relation can fail.
"""
from __future__ import annotations

import pathlib
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT))
from bench.measure import MESHSCOPE, measure  # noqa: E402
from bench.synth import make_run  # noqa: E402

pytestmark = pytest.mark.slow

FACTOR = 1.5
EVENTS_PER_STEP = 10_000
SIZES = {4: "dp=2,pp=2", 32: "dp=16,pp=2"}


def _event_table_mb(trace: pathlib.Path) -> float:
    from meshscope.analysis.ingest.events import load_trace

    return float(load_trace(trace).events.memory_usage(deep=True).sum()) / 2**20


def test_peak_memory_of_32_ranks_is_below_a_multiple_of_4(tmp_path):
    peaks = {}
    for ranks, layout in SIZES.items():
        run = make_run(tmp_path / f"ranks{ranks}", ranks=ranks, layout=layout,
                       events_per_step=EVENTS_PER_STEP)
        peaks[ranks] = measure([*MESHSCOPE, "analyze", "--no-cache", str(run), "--out",
                                str(tmp_path / f"report{ranks}")])
    small, big = peaks[4], peaks[32]
    extra_tables_mb = (32 - 4) * _event_table_mb(tmp_path / "ranks4" / "traces" /
                                                 "rank0.json.gz")
    # Premise: holding every rank's events would cost more than the bound allows.
    assert extra_tables_mb > (FACTOR - 1) * small.peak_rss_mb
    assert big.peak_rss_mb < FACTOR * small.peak_rss_mb
    assert big.peak_tree_rss_mb < FACTOR * small.peak_tree_rss_mb
    assert big.peak_rss_mb - small.peak_rss_mb < 0.5 * extra_tables_mb
