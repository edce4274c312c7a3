"""Shared test helpers: running the CLI as a user would, and the shared real-trace corpus."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The shared real-trace corpus (../shared/traces/MANIFEST.md): MESHSCOPE_SHARED_TRACES names
# it (a relative path is read from the repository root), else ../shared/traces beside the
# repository. Without it the tests that read it skip, each saying which file is missing — unless
# MESHSCOPE_REQUIRE_CORPUS=1 (.ci/run sets it), where a missing corpus stops the run at its
# start with one usage error naming the folder, so that a run without the corpus cannot pass
# without its strongest checks (issue 52 item 5; docs/testing.md).
SHARED_TRACES = (ROOT / os.environ.get("MESHSCOPE_SHARED_TRACES", "../shared/traces")).resolve()
REQUIRE_CORPUS = os.environ.get("MESHSCOPE_REQUIRE_CORPUS", "") == "1"


def pytest_configure(config):
    """With MESHSCOPE_REQUIRE_CORPUS=1, no run without the shared corpus: a usage error (pytest
    exits 4 before collecting) naming the folder looked for, not a hundred silent skips."""
    if REQUIRE_CORPUS and not (SHARED_TRACES / "MANIFEST.md").is_file():
        raise pytest.UsageError(
            f"MESHSCOPE_REQUIRE_CORPUS=1 but the shared trace corpus is missing: {SHARED_TRACES} "
            "holds no MANIFEST.md (set MESHSCOPE_SHARED_TRACES to the corpus folder, or unset "
            "MESHSCOPE_REQUIRE_CORPUS to skip the tests that read it)")


@pytest.fixture(scope="session", autouse=True)
def run_index_in_tmp(tmp_path_factory):
    """Every report the suite writes is registered (``meshscope analyze``, issue 50) in an
    index under the session's tmp folder, never the user's cache (``MESHSCOPE_INDEX``; the
    CLI's subprocesses inherit it)."""
    os.environ["MESHSCOPE_INDEX"] = str(tmp_path_factory.mktemp("index") / "index.sqlite")
    yield


def _samples_fingerprint() -> list[tuple[str, int]]:
    """Each entry of a shipped sample's folder and of its report folder, with its modification
    time: what a test that wrote into ``samples/`` changes (a re-analysis in place rewrites
    ``report/``; a cached one adds ``report/.cache``)."""
    out = []
    for sample in sorted((ROOT / "samples").iterdir()):
        if not sample.is_dir():
            continue
        for folder in (sample, sample / "report"):
            if folder.is_dir():
                out += [(e.path, e.stat(follow_symlinks=False).st_mtime_ns)
                        for e in os.scandir(folder)]
    return sorted(out)


@pytest.fixture(autouse=True)
def samples_stay_as_shipped(request):
    """``samples/`` is read-only to the suite: a test that analyses a sample works on a copy.
    A test after which a sample's folder or report changed fails, naming what changed —
    ``test_sample_regression`` compares the shipped reports byte for byte and would otherwise
    fail later, in whichever test ran next, depending on the order. (Under ``-n`` a test in
    the other worker may be the writer; the paths named say which sample.)"""
    before = _samples_fingerprint()
    yield
    after = _samples_fingerprint()
    if after != before:
        changed = sorted(set(before) ^ set(after))
        pytest.fail(f"{request.node.nodeid} (or a test beside it) changed samples/: "
                    + ", ".join(sorted({p for p, _ in changed}))[:2000], pytrace=False)


def meshscope(*args, timeout=600, check=False, env=None) -> subprocess.CompletedProcess:
    """Run ``meshscope ARGS`` in a fresh interpreter (``env``: variables to add); returns the
    completed process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "meshscope", *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"meshscope {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def runs_side_by_side(*argvs, timeout=600) -> None:
    """``meshscope run ARGV`` for each of ``argvs`` at once, each a fresh interpreter (its
    output in ``<--out>.log`` beside its folder); fails naming the one that failed. For jobs
    whose work is mostly a fixed wait (``--inject fixed-work``), which hardly compete for the
    cores: what one run after the other would take in sum, side by side takes about the
    longest."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    started = []
    for argv in argvs:
        out = pathlib.Path(argv[list(map(str, argv)).index("--out") + 1])
        log = out.parent / f"{out.name}.log"
        with log.open("w") as f:
            started.append((argv, log, subprocess.Popen(
                [sys.executable, "-m", "meshscope", "run", *map(str, argv)], cwd=ROOT,
                env=env, stdout=f, stderr=subprocess.STDOUT)))
    for argv, log, proc in started:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert code == 0, (argv, log.read_text()[-3000:])


def processes_under(folder) -> list[psutil.Process]:
    """Live processes working in ``folder``: named in their command line (a launcher, a rank
    started as torchrun does), or holding a file in it open — a rank forked from the fork
    server (parallel/rank_start.py) carries the server's command line, but writes its output
    to its run's logs."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(folder) in part for part in p.info["cmdline"] or ()) or \
                    any(f.path.startswith(str(folder)) for f in p.open_files()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def shared_trace(rel: str) -> pathlib.Path:
    """A file of ../shared/traces, or skip the test when the corpus is absent."""
    path = SHARED_TRACES / rel
    if not path.exists():
        pytest.skip(f"shared trace corpus not available: {path} is missing")
    return path


@pytest.fixture(scope="session")
def world4_sweep(tmp_path_factory) -> pathlib.Path:
    """The sweep of issue 12, run once per session through `meshscope sweep` as a user would:
    every valid layout of 4 ranks for the tiny model over dp, tp and pp — dp4, tp4, pp4,
    dp2·tp2, dp2·pp2, tp2·pp2 (1F1B, 4 microbatches, 4 steps, steps 2-3 profiled). About four
    minutes on 2 cores. Returns the sweep folder: sweep.json, plan.json, comparison.json and
    one run directory per layout, SWEEP/<name> (names in sweep.json)."""
    out = tmp_path_factory.mktemp("world4") / "sweep"
    meshscope("sweep", "--world", 4, "--steps", 4, "--out", out, timeout=1800, check=True)
    return out


@pytest.fixture(scope="session")
def memory_twins(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """(healthy, leaking) runner runs recorded with memory, analysed, made once a session and
    shared by the memory tests and the Memory page's browser test: pp=2, the ``balanced``
    model, 5 steps (2-4 profiled); the second with rank 1 keeping 8 MiB more at every step
    (``--inject leak=1:8``). Both in one folder (a runs folder the dashboard can serve)."""
    root = tmp_path_factory.mktemp("memory-twins")
    common = ("--layout", "pp=2", "--model", "balanced", "--steps", "5")
    out = []
    for name, extra in (("healthy", ()), ("leak", ("--inject", "leak=1:8"))):
        meshscope("run", *common, *extra, "--out", root / name, timeout=900, check=True)
        meshscope("analyze", root / name, check=True)
        out.append(root / name)
    return out[0], out[1]


@pytest.fixture(scope="session")
def injected_runs(tmp_path_factory):
    """Runner jobs with a known hang cause injected (tests/injected_runs.py), shared by the
    session: ``injected_runs[name]`` runs the job of that name on first use — ``size-mismatch``,
    ``order-divergence``, ``host-stall`` (issue 47), ``hang``, ``crash``, ``desync``,
    ``healthy`` — and returns its ``InjectedRun`` (run folder, PyTorch's pickles, rank, step,
    exit code)."""
    from injected_runs import InjectedRuns

    return InjectedRuns(tmp_path_factory.mktemp("injected-runs"))


GPU_SETS_ROOT = SHARED_TRACES / "gpu"
# The folders of ../shared/traces/gpu holding traces, by a flat name; a set analyse refuses as
# a whole (two files that no rank names) is said so by analyze and is not a report to view.
GPU_SETS = sorted({str(p.parent.relative_to(GPU_SETS_ROOT)).replace("/", "__"): p.parent
                   for p in GPU_SETS_ROOT.rglob("*.json.gz")}.items()) \
    if GPU_SETS_ROOT.is_dir() else []
GPU_SETS_REFUSED = {"hta__rank_unavailable"}


@pytest.fixture(scope="session")
def real_gpu_sets(tmp_path_factory):
    """Every set of the shared GPU corpus copied into one runs folder and analysed as a user
    would (``meshscope analyze SET --json``), once a session: (the folder, name → the
    document ``--json`` printed, None for a set analyse refuses). Skips without the corpus."""
    import json
    import shutil

    if not GPU_SETS:
        pytest.skip(f"shared trace corpus not available: {GPU_SETS_ROOT} is missing")
    root = tmp_path_factory.mktemp("real")
    out = {}
    for name, src in GPU_SETS:
        shutil.copytree(src, root / name)
        proc = meshscope("analyze", root / name, "--json")
        if name in GPU_SETS_REFUSED:
            assert proc.returncode == 2 and "no rank" in proc.stderr, proc.stderr
            out[name] = None
            continue
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
        out[name] = json.loads(proc.stdout)
    return root, out


@pytest.fixture(scope="session", autouse=True)
def every_written_summary_validates(tmp_path_factory):
    """After the session: every summary.json that meshscope wrote under the tests' temporary
    folders (each ``meshscope analyze``, sweep, compare of a fresh run: a report folder holding
    meshscope's marker, ``.meshscope-report``) and that is of today's schema version validates
    against the JSON Schema generated from the report's record (issue 44). A document a test
    wrote by hand or damaged on purpose has no marker beside it, or another version, or is
    not JSON, and is passed over."""
    yield
    import json

    import jsonschema

    from meshscope.analysis.report import summary_schema
    from meshscope.analysis.report.model import REPORT_SCHEMA_VERSION

    validator = jsonschema.Draft202012Validator(summary_schema.schema())
    bad, seen = [], 0
    for path in tmp_path_factory.getbasetemp().rglob("summary.json"):
        if not (path.parent / ".meshscope-report").is_file() or not path.is_file():
            continue                 # not meshscope's, or a FIFO a test made (it would hang)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("schema_version") != REPORT_SCHEMA_VERSION:
            continue
        seen += 1
        bad += [f"{path}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(doc)][:3]
    if bad:
        pytest.fail(f"{len(bad)} schema errors in {seen} summaries written by the tests:\n"
                    + "\n".join(bad[:20]), pytrace=False)
