"""The file-system calls a command makes, as ``strace`` sees them: for the tests that a write
is durable (the report's exchange, the trace cache's entry), which only the order of the
``fsync`` and ``rename`` calls shows."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT

_FSYNC = re.compile(r"\bf(?:data)?sync\(\d+<([^>]*)>\) = 0")
_RENAME = re.compile(r"\brename(?:at2?)?\((?:[^,]*, )?\"([^\"]*)\", (?:[^,]*, )?"
                     r"\"([^\"]*)\"(?:, RENAME_EXCHANGE)?\) = 0")


def fs_calls(argv: list[str], log) -> list[tuple]:
    """Run ``argv`` (from the repository, one OpenMP thread) under ``strace -f`` and return
    its successful flushes and renames in order: ``("fsync", path)`` and
    ``("rename", source, destination)`` (an exchange of two folders is a rename too). The test
    is skipped where strace is missing or may not trace; a failing command fails it."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace to watch the system calls")
    proc = subprocess.run(["strace", "-f", "-y", "-qq", "-o", str(log), "-e",
                           "trace=fsync,fdatasync,rename,renameat,renameat2", *argv],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    calls = []
    for line in log.read_text().splitlines():
        if m := _FSYNC.search(line):
            calls.append(("fsync", m.group(1)))
        elif m := _RENAME.search(line):
            calls.append(("rename", m.group(1), m.group(2)))
    return calls
