"""Damaged and hostile input through ``meshscope analyze``: the corpus of
``tests/damage_corpus.py``, one row per case.

For every case: the exit code; no traceback, and with exit code 2 exactly one error line; the
problem (or error) line names the file and the field; and the ranks the damage did not touch
come out with exactly the per-rank numbers of the undamaged run (whole-trace compute,
communication and their overlap, which depend on that rank's trace alone), whichever other
file was damaged. The command runs in this process (click's test runner: the same command,
its exit code and its two streams, without an interpreter start per case), and each copy starts
with the undamaged run's ingest cache (entries are keyed by file content: only the damaged file
is parsed).
"""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

from damage_corpus import CASES, Case, copy_sample
from meshscope.cli import main

PER_RANK = ["rank", "compute_us", "comm_us", "overlapped_comm_us", "overlap_pct"]


def _analyze(target, *args):
    result = CliRunner().invoke(main, ["analyze", str(target), "--json", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{type(result.exception).__name__}: {result.exception}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    return result


def _report(target, *args) -> tuple[dict, pd.DataFrame]:
    result = _analyze(target, *args)
    assert result.exit_code == 0, result.stderr
    out = target / "report"
    return json.loads(result.stdout), pd.read_parquet(out / "trace_overlap.parquet")


@pytest.fixture(scope="session")
def undamaged(tmp_path_factory):
    run = copy_sample(tmp_path_factory.mktemp("undamaged") / "run")
    summary, overlap = _report(run)
    assert summary["problems"] == [] and summary["ranks"] == [0, 1, 2, 3]
    return summary, overlap, run / "report" / ".cache"


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        yield pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_damaged_input(case: Case, tmp_path, undamaged):
    base_summary, base_overlap, cache = undamaged
    run = copy_sample(tmp_path / "run")
    (run / "report" / ".cache").mkdir(parents=True)
    for entry in cache.glob("*.parquet"):               # the event tables, not the report key
        shutil.copy(entry, run / "report" / ".cache")
    case.damage(run)
    target = run / case.target
    if case.exit_code == 2:
        result = _analyze(target, *case.args)
        assert result.exit_code == 2, result.stdout[-2000:]
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("meshscope: error: "), result.stderr
        for needle in case.needles:
            assert needle in lines[0], (needle, lines[0])
        return
    summary, overlap = _report(target, *case.args)
    if case.needles:
        hits = [p for p in summary["problems"] if all(n in p for n in case.needles)]
        assert hits, (case.needles, summary["problems"])
    assert summary["ranks"] == list(case.ranks or (0, 1, 2, 3)), summary["problems"]
    mine = overlap.set_index("rank").loc[list(case.good_ranks)]
    theirs = base_overlap.set_index("rank").loc[list(case.good_ranks)]
    pd.testing.assert_frame_equal(mine[PER_RANK[1:]], theirs[PER_RANK[1:]], check_exact=True)
    if case.foreign:
        assert summary["run"] is None
        assert any("plain folder of traces" in n for n in summary.get("notes", [])) or \
            any("plain folder of traces" in p for p in summary["problems"])
    if case.clock_skew:
        _same_cross_rank_figures(summary, base_summary)


def _same_cross_rank_figures(summary: dict, base: dict) -> None:
    """Issue 14: a clock 10 s ahead is measured and aligned before any cross-rank figure: the
    same bubbles, waits and straggler as the undamaged run, and the offset reported."""
    offsets = {o["rank"]: o for o in summary["clock_offsets"]}
    base_offsets = {o["rank"]: o for o in base["clock_offsets"]}
    shift = offsets[1]["offset_us"] - base_offsets[1]["offset_us"]
    both = offsets[1]["uncertainty_us"] + base_offsets[1]["uncertainty_us"]
    assert abs(shift - 10e6) <= max(both, 1e3), offsets     # within the estimates' uncertainty
    assert offsets[1]["applied_us"] == offsets[1]["offset_us"]
    assert any("rank 1's clock" in n and "aligned" in n for n in summary["notes"])
    for stage, base_stage in zip(summary["pipeline_stages"], base["pipeline_stages"]):
        assert stage["bubble_fraction"] == pytest.approx(base_stage["bubble_fraction"],
                                                         abs=1e-6)
    assert summary["cross_rank"]["straggler"] == base["cross_rank"]["straggler"]
    waits = {w["rank"]: w for w in summary["cross_rank"].get("rank_waits", [])}
    base_waits = {w["rank"]: w for w in base["cross_rank"].get("rank_waits", [])}
    assert waits.keys() == base_waits.keys()
    for r, w in waits.items():
        for k, v in w.items():
            if isinstance(v, float):
                assert v == pytest.approx(base_waits[r][k], rel=1e-6, abs=1.0), (r, k)
    # The same findings (their what-if costs move with the offset's uncertainty, not the skew).
    assert [f["id"] for f in summary["findings"]] == [f["id"] for f in base["findings"]]
