"""The shared trace corpus is required where it should be (issue 52 item 5): with
MESHSCOPE_REQUIRE_CORPUS=1 a run whose MESHSCOPE_SHARED_TRACES names a missing folder fails at
its start with one usage error naming that folder; without it, the tests that read the corpus
skip, each naming the file it missed. Run as a user runs pytest, in a fresh interpreter, on one
small test file that reads the corpus (tests/test_nccl_debug.py, one of its tests)."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

PROBE = ["tests/test_nccl_debug.py", "-k", "test_version_and_every_rank"]


def _pytest(tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MESHSCOPE_REQUIRE_CORPUS", "MESHSCOPE_SHARED_TRACES")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "--basetemp", str(tmp_path / "basetemp"), *PROBE],
                          cwd=ROOT, env={**environ, "OMP_NUM_THREADS": "1", **env},
                          capture_output=True, text=True, timeout=300)


def test_a_missing_corpus_fails_the_run_when_required(tmp_path):
    missing = tmp_path / "no-corpus-here"
    proc = _pytest(tmp_path, MESHSCOPE_REQUIRE_CORPUS="1", MESHSCOPE_SHARED_TRACES=str(missing))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out                      # pytest's usage error: nothing ran
    assert f"shared trace corpus is missing: {missing}" in out, out
    assert "skipped" not in out and "passed" not in out, out


def test_a_missing_corpus_skips_with_the_reason_when_not_required(tmp_path):
    missing = tmp_path / "no-corpus-here"
    proc = _pytest(tmp_path, MESHSCOPE_SHARED_TRACES=str(missing))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout, proc.stdout
    assert (f"shared trace corpus not available: {missing}/logs/nccl_debug_logs/"
            "aws_p4d_a100x16_2node/slurm-104.out is missing") in proc.stdout, proc.stdout
