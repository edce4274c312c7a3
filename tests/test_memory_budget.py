"""A trace with millions of allocator [memory] events stays within the reading budgets: its
memory table counts against them like the event table (every element of traceEvents against
``--max-events``, the table's bytes against ``--max-rank-memory``), a trace past one is refused
naming it, and within them one rank's ingest and memory analysis hold a bounded number of bytes
per memory event, flat from 1 to 2 million (``bench/memory_events.py``: a saw of 1 KiB blocks
whose peak is known by construction, which the analysis must find)."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

from conftest import ROOT
from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest import budgets
from meshscope.analysis.ingest import events as ingest

sys.path.insert(0, str(ROOT))
from bench.measure import measure  # noqa: E402
from bench.memory_events import LOAD_SCRIPT, expected_peak, write_trace  # noqa: E402

# Measured: 139 bytes a [memory] event above the imports at 1M events, for a 50-byte memory
# table (Arrow): the table, its pandas frame and the analysis' sorted copies of one device.
PER_TABLE_BYTE = 3.5


def test_memory_events_count_against_the_budgets(tmp_path, monkeypatch):
    for var in budgets.ENV.values():
        monkeypatch.delenv(var, raising=False)
    trace = tmp_path / "rank0.json.gz"
    write_trace(trace, 60_000)
    got = ingest.load_trace(trace)
    assert len(got.memory) == 60_000 and len(got.events) == 8
    monkeypatch.setenv(budgets.ENV["events"], "50000")
    with pytest.raises(InputError, match=r"more than 50,000 events.*--max-events"):
        ingest.load_trace(trace)
    monkeypatch.delenv(budgets.ENV["events"])
    monkeypatch.setenv(budgets.ENV["rank_memory"], str(1 << 20))
    with pytest.raises(InputError, match=r"event and memory tables grow beyond 1 MiB.*"
                                         r"\[memory\] events read.*--max-rank-memory"):
        ingest.load_trace(trace)


def _peak(tmp_path: pathlib.Path, n: int) -> dict:
    trace = tmp_path / f"rank0-{n}.json.gz"
    write_trace(trace, n)
    got = json.loads(measure([sys.executable, "-c", LOAD_SCRIPT, str(trace)],
                             env={"PYTHONPATH": str(ROOT)}).stdout.strip().splitlines()[-1])
    assert got["memory_events"] == n and got["peak_allocated_bytes"] == expected_peak(n)
    assert got["curve_points"] <= 4001
    got["per_event"] = (got["peak_mb"] - got["before_mb"]) * 2**20 / n
    return got


@pytest.mark.slow
def test_millions_of_memory_events_hold_a_flat_cost_per_event(tmp_path):
    small, large = _peak(tmp_path, 1_000_000), _peak(tmp_path, 2_000_000)
    for got in (small, large):
        table = got["memory_arrow_bytes"] / got["memory_events"]
        assert table <= 56, got                     # ~50 bytes a memory event, as Arrow
        assert got["per_event"] <= PER_TABLE_BYTE * table, got
    assert large["per_event"] <= 1.1 * small["per_event"], (small, large)
