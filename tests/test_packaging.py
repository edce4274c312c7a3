"""The wheel built from the repository installs into a fresh venv beside the CPU torch and runs
there, also from a directory holding a user's own ``analysis/`` and ``parallel/`` packages.

How the fresh venv gets its dependencies: by default the project venv's third-party
distributions are hard-linked into it (no copy, no download: seconds), then pip installs the
wheel with dependency resolution against them — so a requirement that the CPU torch 2.13 does
not satisfy would make pip fetch another torch, which the test catches. What that cannot see,
an import of a package the wheel does not declare, is checked directly: every distribution
whose modules ``meshscope analyze`` loaded must be in the wheel's requirement closure. With
``MESHSCOPE_PACKAGING_FROM_INDEX=1`` only torch is linked and every other dependency comes from
the package index, as for a user (about two minutes here, mostly downloads).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

SITE = pathlib.Path(sysconfig.get_paths()["purelib"])   # the project venv's site-packages
TORCH_ENTRIES = ("torch", "torchgen", "functorch")
SHADOW = 'raise ImportError("the user\'s own {name} package was imported instead of meshscope\'s")\n'
# Imported by a dependency when it happens to be installed (this venv links the project
# venv's packages, the test and dask extras among them), never required by it.
OPTIONAL = {"cloudpickle": "pyarrow.lib takes it in place of pickle when it is importable"}
# Run in the fresh venv: the command, then which distributions its modules came from, and
# the wheel's requirement closure.
PROBE = textwrap.dedent('''
    import importlib.metadata as md, json, re, runpy, sys
    at_start = set(sys.modules)          # what the interpreter's start-up loaded (site, .pth)
    sys.argv = ["meshscope", *sys.argv[1:]]
    try:
        runpy.run_module("meshscope", run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
    owners = md.packages_distributions()
    used = set()
    for name in set(sys.modules) - at_start:
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top.startswith("_") and top[1:] in sys.stdlib_module_names:
            continue
        used.update(owners.get(top, []))
    def canon(n): return re.sub(r"[-_.]+", "-", n).lower()
    closure, todo = set(), ["meshscope"]
    while todo:
        name = todo.pop()
        if canon(name) in closure:
            continue
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:   # a requirement whose marker left it out
            continue
        closure.add(canon(name))
        for req in requires:
            if "extra ==" in req:
                continue
            todo.append(re.match(r"[A-Za-z0-9_.-]+", req).group(0))
    import meshscope, torch
    print(json.dumps({"used": sorted({canon(u) for u in used}), "closure": sorted(closure),
                      "meshscope": meshscope.__file__, "torch": torch.__version__}))
''')


def _link(entries, dest: pathlib.Path) -> None:
    for entry in entries:
        src = SITE / entry
        if src.is_dir():
            shutil.copytree(src, dest / entry, copy_function=os.link)
        else:
            os.link(src, dest / entry)


def _pip(*args, python: pathlib.Path, timeout=900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel of the working tree (its tracked and new files, copied — its links as links —
    so that the build writes nothing into the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    src = tmp / "src"
    for f in filter(None, files):
        if f.startswith("samples/"):
            continue
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / f).is_symlink():        # meshscope/analysis -> ../analysis, as committed
            os.symlink(os.readlink(ROOT / f), src / f)
        elif (ROOT / f).is_file():
            shutil.copy2(ROOT / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True)
    (found,) = (tmp / "dist").glob("meshscope-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> pathlib.Path:
    root = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = pathlib.Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    torch_entries = [e.name for e in SITE.iterdir()
                     if e.name in TORCH_ENTRIES or e.name.startswith("torch-")]
    if os.environ.get("MESHSCOPE_PACKAGING_FROM_INDEX") == "1":
        _link(torch_entries, site)
    else:
        _link([e.name for e in SITE.iterdir()
               if not e.name.startswith(("meshscope", "__editable__", "__pycache__"))], site)
    _pip("install", "-q", wheel, python=python)
    return root


def test_pip_kept_the_cpu_torch(venv):
    listed = json.loads(_pip("list", "--format", "json", python=venv / "bin" / "python").stdout)
    names = {d["name"].lower(): d["version"] for d in listed}
    assert names["torch"] == "2.13.0+cpu"
    assert not [n for n in names if n.startswith("nvidia-")]
    assert names["meshscope"]


@pytest.fixture
def user_dir(tmp_path) -> pathlib.Path:
    """A training repository's folder: packages named ``analysis`` and ``parallel`` that fail
    loudly when imported, and a copy of a sample run."""
    d = tmp_path / "my-training-repo"
    for name in ("analysis", "parallel", "collectors"):
        (d / name).mkdir(parents=True)
        (d / name / "__init__.py").write_text(SHADOW.format(name=name))
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", d / "run",
                    ignore=shutil.ignore_patterns("report"))
    return d


def test_installed_command_analyses_a_sample_beside_shadowing_packages(venv, user_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    for cmd in ([venv / "bin" / "meshscope"], [venv / "bin" / "python", "-m", "meshscope"]):
        out = user_dir / "out"
        proc = subprocess.run([*map(str, cmd), "analyze", "run", "--json", "--out", str(out)],
                              cwd=user_dir, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout)["ranks"] == [0, 1, 2, 3]
        assert "Traceback" not in proc.stderr
        shutil.rmtree(out)


def test_notebook_import_from_that_directory(venv, user_dir):
    """``from meshscope import analysis`` in a script run where the user's ``analysis/`` is."""
    code = ("from meshscope import analysis; import meshscope; "
            "run = analysis.open('run'); print(meshscope.__file__, len(run.breakdown()))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=user_dir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path, rows = proc.stdout.split()
    assert str(venv) in path and int(rows) > 0


def test_every_module_the_command_loads_is_a_declared_dependency(venv, user_dir):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE, "analyze", "run",
                           "--out", str(user_dir / "probe")], cwd=user_dir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["meshscope"].startswith(str(venv))
    assert found["torch"] == "2.13.0+cpu"
    undeclared = sorted(set(found["used"]) - set(found["closure"]) - set(OPTIONAL))
    assert undeclared == [], f"imported but not required by the wheel: {undeclared}"
