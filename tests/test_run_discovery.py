"""One run discovery (issue 35, item 2): what is a run is ``collectors.run_dir.run_kind``, for
the dashboard's runs folder and for ``meshscope analyze`` alike. A job that wrote one folder
per rank (a Megatron job's ``result/0/`` and ``result/1/``) is one run of two ranks — the
dashboard showed two one-rank runs, offered as a sweep — and a run folder made while the
dashboard runs is found by its URL without opening the Runs page."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import ROOT, meshscope
from meshscope.collectors import run_dir as rd
from meshscope.dashboard import runs as runs_mod
from meshscope.dashboard.runs import RunIndex

TRACES = ROOT / "samples" / "dp4-ddp" / "traces"


def _rank_folders(root, names=("0", "1")):
    """``root/result/<name>/`` holding rank i's trace of the dp4 sample, for each name."""
    for i, name in enumerate(names):
        d = root / "result" / name
        d.mkdir(parents=True)
        shutil.copy(TRACES / f"rank{i}.json.gz", d / f"trace_{i}.json.gz")
    return root / "result"


@pytest.mark.parametrize("names", [("0", "1"), ("rank0", "rank1"), ("worker_0", "worker_1")])
def test_one_folder_per_rank_is_one_run_for_the_dashboard_and_the_cli(tmp_path, names):
    result = _rank_folders(tmp_path, names)
    assert rd.run_kind(result) == "rank folders"
    index = RunIndex(tmp_path)
    assert list(index.runs) == ["result"] and index.sweeps == {}
    doc = json.loads(meshscope("analyze", result, "--json", check=True).stdout)
    assert doc["ranks"] == [0, 1]


def test_folders_that_are_not_ranks_stay_runs_of_their_own(tmp_path):
    """A folder whose trace-holding sub-folders are not all named for ranks (two jobs side by
    side, a sweep) is no run itself: each sub-folder is."""
    for name, rank in (("before", 0), ("after", 1)):
        (tmp_path / "jobs" / name).mkdir(parents=True)
        shutil.copy(TRACES / f"rank{rank}.json.gz", tmp_path / "jobs" / name / "t.json.gz")
    (tmp_path / "jobs" / "0").mkdir()
    shutil.copy(TRACES / "rank0.json.gz", tmp_path / "jobs" / "0" / "t.json.gz")
    assert rd.run_kind(tmp_path / "jobs") is None
    index = RunIndex(tmp_path)
    assert sorted(index.runs) == ["jobs/0", "jobs/after", "jobs/before"]
    assert index.sweeps == {"jobs": ["jobs/0", "jobs/after", "jobs/before"]}


def test_a_run_made_later_is_found_by_its_url(tmp_path, monkeypatch):
    index = RunIndex(tmp_path)
    assert index.get("late") is None
    (tmp_path / "late").mkdir()
    shutil.copy(TRACES / "rank0.json.gz", tmp_path / "late" / "rank0.json.gz")
    monkeypatch.setattr(runs_mod, "RESCAN_S", 0.0)
    entry = index.get("late")
    assert entry is not None and entry.kind == "folder of traces"
    assert index.get("../late") is None and index.get("nothing-here") is None
