"""The Dask engine gives the local engine's report, number for number: the per-rank work runs as
tasks of a Dask LocalCluster of two worker processes, the cross-rank stage on the gathered
tables."""
import pathlib
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from meshscope.analysis.report.analyze import analyze
from meshscope.analysis.report.result import Report

pytestmark = pytest.mark.slow
pytest.importorskip("distributed", reason="the Dask engine needs dask and distributed")


def _same(a: Report, b: Report) -> None:
    for (name, x), (_, y) in zip(a.tables(), b.tables()):
        assert list(x.columns) == list(y.columns), name
        assert len(x) == len(y), name
        for col in x.columns:
            u, v = x[col], y[col]
            if pd.api.types.is_float_dtype(u) and pd.api.types.is_float_dtype(v):
                assert np.allclose(u.to_numpy(float), v.to_numpy(float), rtol=1e-9, atol=0,
                                   equal_nan=True), (name, col)
            else:
                assert u.astype(str).tolist() == v.astype(str).tolist(), (name, col)
    from meshscope.analysis.report.summary import document

    sa, sb = document(a.summary), document(b.summary)
    for key in ("generated", "source"):
        sa.pop(key), sb.pop(key)
    assert sa == sb


@pytest.fixture(scope="module")
def synthetic16(tmp_path_factory):
    import sys
    sys.path.insert(0, str(ROOT))
    from bench.synth import make_run

    return make_run(tmp_path_factory.mktemp("synth") / "run", ranks=16, steps=3,
                    events_per_step=2000, slow_rank=5, slow_ms=20.0)


@pytest.mark.parametrize("which", ["sample", "synthetic"])
def test_dask_engine_gives_the_local_report(which, synthetic16, tmp_path):
    if which == "sample":
        run = tmp_path / "sample"
        shutil.copytree(ROOT / "samples" / "dp2-pp2-slow-rank1", run,
                        ignore=shutil.ignore_patterns("report"))
    else:
        run = pathlib.Path(synthetic16)
    local = analyze(run, engine="local", workers=2)
    dask = analyze(run, engine="dask", workers=2)
    _same(local, dask)
    assert local.summary.straggler is not None


@pytest.fixture(scope="module")
def cluster():
    """A Dask cluster started before any budget is set, as a cluster already running
    elsewhere would be: its workers inherit nothing from the command that submits to it."""
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as c:
        yield c


def _nest(depth: int):
    return [_nest(depth - 1)] if depth > 1 else []


def test_budgets_reach_the_dask_workers(cluster, tmp_path):
    """``meshscope analyze --max-events 25000 --max-nesting 12`` with a rank over each budget
    (rank 3's events doubled: about 35,000, the others about 17,000; rank 2 with one event's
    args holding lists 20 deep): on the Dask cluster, as on the local engine, each of the two
    is named with its budget and flag, the command goes on with ranks 0 and 1, and the two
    reports agree."""
    import json
    import os

    from conftest import meshscope
    from damage_corpus import copy_sample, edit_trace

    for var in ("MESHSCOPE_MAX_EVENTS", "MESHSCOPE_MAX_TRACE_BYTES"):
        assert var not in os.environ
    run = copy_sample(tmp_path / "run")
    edit_trace(run, 3, lambda doc: doc["traceEvents"].extend(list(doc["traceEvents"])))
    edit_trace(run, 2, lambda doc: next(e for e in doc["traceEvents"] if e.get("ph") == "X")
               .setdefault("args", {}).update(deep=_nest(20)))
    summaries = {}
    for engine, extra in (("local", ()), ("dask", ("--scheduler", cluster.scheduler_address))):
        proc = meshscope("analyze", run, "--no-cache", "--json", "--out", tmp_path / engine,
                         "--max-events", "25000", "--max-nesting", "12", "--engine", engine,
                         *extra)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        summaries[engine] = json.loads(proc.stdout)
    for engine, summary in summaries.items():
        refused = [p for p in summary["problems"] if "rank3.json.gz" in p]
        assert len(refused) == 1, (engine, summary["problems"])
        assert "budget 25,000" in refused[0] and "--max-events" in refused[0], refused
        deep = [p for p in summary["problems"] if "rank2.json.gz" in p]
        assert len(deep) == 1 and "--max-nesting" in deep[0], (engine, summary["problems"])
        assert summary["ranks"] == [0, 1], (engine, summary["ranks"])
    local, dask = summaries["local"], summaries["dask"]
    for key in ("generated", "source"):
        local.pop(key, None), dask.pop(key, None)
    assert local == dask


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_a_worker_killed_mid_task_is_retried(engine, tmp_path, monkeypatch):
    """The worker that gets rank 1's trace ends its process mid-task, once (a marker file says
    it happened). The report is the full one, equal to an undisturbed local analysis: on Dask
    the scheduler ran the task again on a worker (not this process); the local pool, broken
    by its dead worker, had the file read here."""
    import functools
    import os

    import engine_tasks
    from meshscope.analysis.report import rank_work

    run = tmp_path / "sample"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-slow-rank1", run,
                    ignore=shutil.ignore_patterns("report"))
    undisturbed = analyze(run, engine="local", workers=2)
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setattr(rank_work, "rank_work",
                        functools.partial(engine_tasks.dies_once, markers, "rank1.json.gz"))
    disturbed = analyze(run, engine=engine, workers=2)
    assert (markers / "killed").is_file(), "no worker was killed"
    done = [int(p.name.split("-")[1]) for p in markers.glob("done-*")]
    assert len(done) == 1, done
    if engine == "dask":
        assert done[0] != os.getpid(), "the Dask scheduler should have rerun the task"
    else:
        assert done[0] == os.getpid(), "a broken local pool's files are read here"
    assert disturbed.ranks == [0, 1, 2, 3]
    assert not [p for p in disturbed.problems if "rank1" in p], disturbed.problems
    _same(undisturbed, disturbed)


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_work_in_flight_is_bounded(engine, tmp_path):
    """16 tasks of 0.2 s on 2 workers, bound 2 × 2 = 4. The consumer takes the first result and
    then waits 3 s, long enough for every task to run were they all submitted at once (as the
    Dask engine did before): the tasks started by then are at most the bound; all 16 come
    back, in order, once it goes on."""
    import contextlib
    import functools
    import time

    import engine_tasks
    from meshscope.analysis.ingest import pool
    from meshscope.analysis.ingest.progress import Progress
    from meshscope.analysis.report import engines

    markers = tmp_path / "markers"
    markers.mkdir()
    files = [tmp_path / f"rank{i}.json" for i in range(16)]
    fn = functools.partial(engine_tasks.marks_start, markers)
    bound = pool.IN_FLIGHT_PER_WORKER * 2
    with contextlib.ExitStack() as stack:
        if engine == "local":
            results = pool.map_files(files, fn, (0.2,), workers=2)
        else:
            executor, threads, lost = stack.enter_context(engines.dask_executor(None, 2))
            assert threads == 2
            bar = stack.enter_context(Progress(len(files), "test", enabled=False))
            results = pool.map_on(executor, files, fn, (0.2,), in_flight=bound, bar=bar,
                                  lost=lost)
        first = next(results)
        time.sleep(3.0)
        started = len(list(markers.iterdir()))
        rest = list(results)
    assert 1 <= started <= bound, started
    assert [f for f, _ in [first, *rest]] == files
    assert [r for _, r in [first, *rest]] == [f.name for f in files]
