"""bench/gpu_check.sh, as far as a machine without a GPU allows: its CPU fallback end to end,
its refusal without CUDA, and its comparison with HTA on a real GPU trace recorded by others
(the check a CUDA run would get), including that a disagreement is caught."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, meshscope, shared_trace

sys.path.insert(0, str(ROOT))
from bench import gpu_report  # noqa: E402

SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _script(*args, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_cpu_fallback_runs_every_step(tmp_path):
    proc = _script("--cpu", "--out", tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    for heading in ("=== machine", "=== run: layout dp=2, preset tiny", "=== analyze",
                    "== 1. overlap and compute time against HTA", "== 2. tokens/s and MFU",
                    "== 3. step timers against the trace",
                    "== 4. memory against the allocator's own peak"):
        assert heading in out
    # HTA finds no kernels in CPU traces; the memory check is CUDA's (and each rank says on its
    # stderr that --memory-snapshot writes no snapshot on a CPU run).
    assert "checks: 2 passed, 0 failed, 2 did not apply" in out
    for rank in (0, 1):
        log = (tmp_path / "run" / "logs" / f"rank{rank}.stderr.log").read_text()
        assert "--memory-snapshot needs CUDA" in log
    assert not (tmp_path / "run" / "memory").exists()
    summary = json.loads((tmp_path / "run" / "report" / "summary.json").read_text())
    assert summary["ranks"] == [0, 1] and summary["device"] == "cpu"
    # Every profiled step of every rank was set beside its trace span.
    assert out.count("agree (within 5%)") == 1
    rows = [ln for ln in out.splitlines() if ln.strip().endswith("%") and ln.strip()[:1].isdigit()]
    assert len(rows) == 2 * 3


def test_without_cuda_it_says_so_and_stops():
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _script()
    assert proc.returncode == 3
    assert "no CUDA device: run with --cpu" in proc.stderr
    assert "=== run" not in proc.stdout


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    """A folder with a recorded A100 DDP trace (NCCL kernels on several streams) and
    meshscope's report of it, as gpu_check.sh leaves a CUDA run."""
    trace = shared_trace("gpu/hta/nccl_parser_config/nccl_data.json.gz")
    run = tmp_path_factory.mktemp("gpu") / "run"
    (run / "traces").mkdir(parents=True)
    shutil.copy(trace, run / "traces" / trace.name)
    meshscope("analyze", "--no-cache", run / "traces", "--out", run / "report", check=True)
    return run, json.loads((run / "report" / "summary.json").read_text())


def test_hta_comparison_passes_on_a_real_gpu_trace(gpu_run, capsys):
    run, summary = gpu_run
    assert summary["device"] == "gpu"
    assert gpu_report.check_overlap(run, summary) is True
    assert "agree" in capsys.readouterr().out


def test_hta_comparison_catches_a_wrong_overlap(gpu_run):
    run, summary = gpu_run
    wrong = copy.deepcopy(summary)
    wrong["trace_overlap"][0]["overlap_pct"] += 5.0
    assert gpu_report.check_overlap(run, wrong) is False
