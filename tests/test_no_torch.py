"""Commands that do not train never import torch, and ``analyze`` never imports Dash.

Checked two ways, in fresh interpreters: ``sys.modules`` of the command's own process after it
ran (the command run through ``runpy``, as ``python -m meshscope`` runs it), and an import hook
(a ``sitecustomize`` on ``PYTHONPATH``) that every process of the command loads — the
analysis's worker processes too, whether forked, spawned or served by a fork server — and that
writes a file naming each forbidden package a process imported.
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

FORBIDDEN = ("torch", "dash", "plotly", "flask")
HOOK = textwrap.dedent('''
    import os, sys

    class _Watch:
        """Record (never block) the first import of each forbidden package, per process."""
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in {forbidden!r} and "." not in name:
                with open(os.path.join({out!r}, f"{{os.getpid()}}-{{top}}"), "w") as f:
                    f.write(" ".join(sys.argv))
            return None

    sys.meta_path.insert(0, _Watch())
''')
RUNNER_OF = textwrap.dedent('''
    import json, runpy, sys
    sys.argv = ["meshscope", *sys.argv[1:]]
    try:
        runpy.run_module("meshscope", run_name="__main__")
    except SystemExit as e:
        code = e.code or 0
    else:
        code = 0
    loaded = sorted({m.partition(".")[0] for m in sys.modules} & set(%r))
    print(json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
''')
RUNNER = RUNNER_OF % (FORBIDDEN,)


def _run(tmp_path, *args, code: int = 0) -> tuple[dict, list[str]]:
    """Run ``meshscope ARGS``, which must exit with ``code``; (its own process's verdict, the
    hook's records of all its processes)."""
    hook_dir, seen = tmp_path / "hook", tmp_path / "seen"
    hook_dir.mkdir(exist_ok=True)
    seen.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(HOOK.format(forbidden=FORBIDDEN, out=str(seen)))
    env = {**os.environ, "PYTHONPATH": str(hook_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", RUNNER, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    verdict = json.loads(proc.stderr.strip().splitlines()[-1])
    assert verdict["code"] == code, proc.stderr[-3000:]
    return verdict, sorted(p.name.split("-", 1)[1] for p in seen.iterdir())


@pytest.fixture
def sample(tmp_path):
    """A copy of the bundled 4-rank pipeline sample, without its report."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run,
                    ignore=shutil.ignore_patterns("report"))
    return run


def test_the_hook_sees_an_import_of_torch(tmp_path):
    """The check can fail: a process that imports torch is recorded."""
    hook_dir, seen = tmp_path / "hook", tmp_path / "seen"
    hook_dir.mkdir()
    seen.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK.format(forbidden=FORBIDDEN, out=str(seen)))
    subprocess.run([sys.executable, "-c", "import torch"], check=True,
                   env={**os.environ, "PYTHONPATH": str(hook_dir)})
    assert [p.name.split("-", 1)[1] for p in seen.iterdir()] == ["torch"]


def test_analyze_imports_neither_torch_nor_dash(tmp_path, sample):
    verdict, seen = _run(tmp_path, "analyze", sample, "--no-cache", "--json")
    assert (sample / "report" / "summary.json").is_file()
    assert verdict["loaded"] == [] and seen == []


def test_analyzing_pytorchs_own_dumps_imports_no_torch(tmp_path):
    """PyTorch's Flight Recorder pickles are read by meshscope's plain-data reader, not by
    torch's loader: a folder of them is analysed without importing torch."""
    from fr_fixtures import moe_dumps, write_dumps

    write_dumps(tmp_path / "fr", moe_dumps())
    verdict, seen = _run(tmp_path, "analyze", tmp_path / "fr", "--no-cache", "--json")
    assert (tmp_path / "fr" / "report" / "summary.json").is_file()
    assert verdict["loaded"] == [] and seen == []


@pytest.mark.parametrize("args", [["--help"], ["analyze", "--help"], ["dashboard", "--help"],
                                  ["run", "--help"], ["--version"]])
def test_help_imports_nothing_heavy(tmp_path, args):
    verdict, seen = _run(tmp_path, *args)
    assert verdict["loaded"] == [] and seen == []


def test_a_refused_layout_imports_no_torch_in_any_process(tmp_path):
    """``meshscope run`` checks what it is asked before anything imports torch
    (parallel/options.py) and before it starts the fork server the ranks come from
    (parallel/rank_start.py): a layout that cannot work costs the command's start only."""
    verdict, seen = _run(tmp_path, "run", "--layout", "dp=2,pp=64", "--out", tmp_path / "run",
                         code=2)
    assert not (tmp_path / "run").exists()
    assert verdict["loaded"] == [] and seen == []


def test_a_reused_report_is_printed_without_pandas(sample):
    """analysis/report/reuse.py: a second ``meshscope analyze`` of unchanged inputs prints the
    stored report, reading summary.json through the typed reader, and imports neither pandas,
    numpy nor pyarrow — importing them is most of what a reused run would cost."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run([sys.executable, "-m", "meshscope", "analyze", str(sample)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "report written" in first.stdout
    heavy = ("pandas", "numpy", "pyarrow")
    proc = subprocess.run([sys.executable, "-c", RUNNER_OF % (heavy,), "analyze", str(sample)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    verdict = json.loads(proc.stderr.strip().splitlines()[-1])
    assert verdict["code"] == 0, proc.stderr[-3000:]
    assert "report unchanged" in proc.stdout
    assert proc.stdout.split("\nreport ")[0] == first.stdout.split("\nreport ")[0]
    assert verdict["loaded"] == []
