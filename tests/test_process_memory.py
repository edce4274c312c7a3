"""The analysing command allocates Arrow memory through the C library's allocator
(``analysis/report/process_memory.py``), unless the user named a pool of their own; the
Python API leaves its caller's pool as it was.

Each case runs in a fresh interpreter: ``meshscope analyze`` through ``runpy`` (as ``python -m
meshscope`` runs it), then the process reports which pool pyarrow allocates from.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

COMMAND = textwrap.dedent('''
    import json, runpy, sys
    sys.argv = ["meshscope", "analyze", "--no-cache", *sys.argv[1:]]
    try:
        runpy.run_module("meshscope", run_name="__main__")
    except SystemExit as e:
        assert not e.code, e.code
    import pyarrow as pa
    print(json.dumps({"pool": pa.default_memory_pool().backend_name}), file=sys.stderr)
''')
LIBRARY = textwrap.dedent('''
    import json, sys
    import pyarrow as pa
    before = pa.default_memory_pool().backend_name
    from meshscope.analysis import api
    api.analyze(sys.argv[1])
    print(json.dumps({"before": before, "pool": pa.default_memory_pool().backend_name}),
          file=sys.stderr)
''')


@pytest.fixture
def sample(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp4-ddp", run, ignore=shutil.ignore_patterns("report"))
    return run


def _run(script: str, *args, pool: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = pool
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=ROOT,
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stderr.strip().splitlines()[-1])


def test_the_command_allocates_arrow_memory_through_the_c_library(sample, tmp_path):
    got = _run(COMMAND, sample, "--out", tmp_path / "report")
    assert got["pool"] == "system"
    assert (tmp_path / "report" / "summary.json").is_file()


def test_a_pool_the_user_chose_is_kept(sample, tmp_path):
    got = _run(COMMAND, sample, "--out", tmp_path / "report", pool="jemalloc")
    assert got["pool"] == "jemalloc"


def test_the_python_api_leaves_the_callers_pool_alone(sample):
    got = _run(LIBRARY, sample)
    assert got["pool"] == got["before"]
    assert got["pool"] != "system"      # the premise: pyarrow's own default is another pool
