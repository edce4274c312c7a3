"""The type check of .ci/run, under ``make test`` too: mypy, strict, on the vocabulary, the
report's shared records and the codec that writes and reads them (pyproject's [tool.mypy] lists
the files)."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_the_shared_words_and_records_type_check_strictly():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found in 4 source files" in proc.stdout
