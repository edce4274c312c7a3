"""Shared test helpers: running the CLI as a user would, and the shared real-trace corpus."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"


def meshscope(*args, timeout=600, check=False) -> subprocess.CompletedProcess:
    """Run ``meshscope ARGS`` in a fresh interpreter; returns the completed process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "meshscope", *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"meshscope {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def shared_trace(rel: str) -> pathlib.Path:
    """A file of ../shared/traces, or skip the test when the corpus is absent."""
    path = SHARED_TRACES / rel
    if not path.exists():
        pytest.skip(f"shared trace corpus not available: {path} is missing")
    return path


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
