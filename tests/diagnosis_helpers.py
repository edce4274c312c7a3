"""What several diagnosis tests share: the shipped samples analysed once per session by the code
under test, and what a healthy report must not say."""
from __future__ import annotations

import pathlib

import pytest

from conftest import ROOT, meshscope

SAMPLES = ROOT / "samples"


def assert_healthy(summary: dict) -> None:
    """What a healthy run's report must not say (a false alarm is a bug): no straggler above
    low, no hang or desync verdict, no warm-up step flagged slow."""
    straggler = summary["cross_rank"]["straggler"]
    timed = {f["id"]: f for f in summary["findings"]}
    assert straggler is None or timed.get("straggler", {}).get("severity") == "low", straggler
    assert not [h for h in summary["hangs"] if h["verdict"] in ("missing", "mismatch")], \
        summary["hangs"]
    assert not {"hang", "desync"} & set(timed), summary["findings"]
    assert not set(summary["warmup_steps"]) & set(summary["slow_steps"])


@pytest.fixture(scope="session")
def analysed_samples(tmp_path_factory) -> dict[str, tuple[pathlib.Path, dict]]:
    """Every shipped sample, copied and analysed afresh by the code under test: name → (its
    copy, its summary.json). Read-only for the tests (copy again to change one)."""
    import json
    import shutil

    out = {}
    root = tmp_path_factory.mktemp("samples")
    for sample in sorted(p for p in SAMPLES.iterdir() if (p / "run.json").is_file()):
        copy = root / sample.name
        shutil.copytree(sample, copy, ignore=shutil.ignore_patterns("report"))
        proc = meshscope("analyze", copy, "--json", check=True)
        out[sample.name] = (copy, json.loads(proc.stdout))
    return out
