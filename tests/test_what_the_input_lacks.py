"""Pages and text that say what the input lacks, never that all is well and never an
instruction that would change nothing (issue 45, item 4): a run without Flight Recorder
records cannot be judged for hangs; a single-rank trace has no stragglers to find; a report of
today's version lacks a table because the run did (no "re-run" advice); the overview opens with
the run's first finding. Each beside its healthy twin: the samples, which have records, many
ranks and a straggler or none."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import ROOT, meshscope
from meshscope.dashboard import state as st
from meshscope.dashboard.app import BUILDERS
from meshscope.dashboard.data import open_report
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex

SAMPLES = ROOT / "samples"


def _notes(root, run_id, page) -> dict:
    ctx = PageContext(open_report(RunIndex(root).get(run_id)),
                      st.ViewState(page=page, runs=(run_id,)))
    return {i.id: i.text for s in BUILDERS[page](ctx) for i in s.items if hasattr(i, "text")}


@pytest.fixture(scope="module")
def lacking(tmp_path_factory):
    """Two runs made from the dp4-ddp sample by taking inputs away, each analysed as a user
    would: ``no-dumps`` without its Flight Recorder dumps (comms/), ``one-rank`` with rank 0's
    trace alone."""
    root = tmp_path_factory.mktemp("lacking")
    out = {}
    for name in ("no-dumps", "one-rank"):
        run = root / name
        shutil.copytree(SAMPLES / "dp4-ddp", run, ignore=shutil.ignore_patterns("report"))
        if name == "no-dumps":
            shutil.rmtree(run / "comms")
        else:
            for f in (run / "traces").iterdir():
                if not f.name.startswith("rank0."):
                    f.unlink()
        proc = meshscope("analyze", run)
        assert proc.returncode == 0, proc.stderr
        out[name] = proc.stdout
    return root, out


def test_without_records_hangs_cannot_be_judged(lacking):
    root, text = lacking
    doc = json.loads((root / "no-dumps" / "report" / "summary.json").read_text())
    assert doc["flight_recorder_ranks"] == [] and doc["hangs"] == []
    notes = _notes(root, "no-dumps", "health")
    assert notes["fr-none"].startswith("No Flight Recorder records: hangs and desyncs cannot "
                                       "be judged")
    assert "fr-healthy" not in notes
    assert "Flight Recorder: no records — hangs and desyncs cannot be judged." in \
        text["no-dumps"]


def test_with_records_no_hang_is_a_verdict(tmp_path):
    """The healthy twin: the sample's four ranks left records, and no rank missed a
    collective."""
    doc = json.loads((SAMPLES / "dp4-ddp" / "report" / "summary.json").read_text())
    assert doc["flight_recorder_ranks"] == [0, 1, 2, 3]
    notes = _notes(SAMPLES, "dp4-ddp", "health")
    assert notes["fr-healthy"].startswith("No hang and no desync in the records of 4 rank(s)")
    proc = meshscope("analyze", SAMPLES / "dp4-ddp", "--out", tmp_path / "r")
    assert "Flight Recorder: the records of 4 rank(s) show no hang and no desync." in \
        proc.stdout


def test_a_single_rank_has_no_stragglers_to_find_and_no_rerun_is_advised(lacking):
    root, _ = lacking
    doc = json.loads((root / "one-rank" / "report" / "summary.json").read_text())
    assert doc["ranks"] == [0]
    overview = _notes(root, "one-rank", "overview")
    assert overview["straggler"] == "A single-rank trace has no stragglers to find."
    stragglers = _notes(root, "one-rank", "stragglers")
    assert stragglers["saving-none"].startswith("A single-rank trace has no stragglers to "
                                                "find")
    assert stragglers["clock-none"].startswith("A single-rank trace has no stragglers to find")
    for page in ("overview", "stragglers", "communication", "pipeline", "timeline"):
        for key, text in _notes(root, "one-rank", page).items():
            assert "re-run" not in text, (page, key, text)


def test_the_overview_opens_with_the_first_finding():
    doc = json.loads((SAMPLES / "dp2-pp2-slow-rank1" / "report" / "summary.json").read_text())
    first = doc["findings"][0]
    notes = _notes(SAMPLES, "dp2-pp2-slow-rank1", "overview")
    assert notes["lead-finding"] == (f"First finding: [{first['severity']}] {first['title']} "
                                     f"— costs {first['cost_us'] / 1e3:.1f} ms/step "
                                     f"({first['cost_pct']:.1f}%).")
    ctx = PageContext(open_report(RunIndex(SAMPLES).get("dp2-pp2-slow-rank1")),
                      st.ViewState(page="overview", runs=("dp2-pp2-slow-rank1",)))
    ids = [i.id for s in BUILDERS["overview"](ctx) for i in s.items]
    assert ids.index("lead-finding") < ids.index("straggler") < ids.index("findings-table")
