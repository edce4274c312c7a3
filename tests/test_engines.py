"""The Dask engine gives the local engine's report, number for number: the per-rank work runs as
tasks of a Dask LocalCluster of two worker processes, the cross-rank stage on the gathered
tables."""
import pathlib
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from meshscope.analysis.report.analyze import Report, analyze

pytestmark = pytest.mark.slow
pytest.importorskip("distributed", reason="the Dask engine needs dask and distributed")


def _same(a: Report, b: Report) -> None:
    for name in Report.TABLES:
        x, y = getattr(a, name), getattr(b, name)
        assert list(x.columns) == list(y.columns), name
        assert len(x) == len(y), name
        for col in x.columns:
            u, v = x[col], y[col]
            if pd.api.types.is_float_dtype(u) and pd.api.types.is_float_dtype(v):
                assert np.allclose(u.to_numpy(float), v.to_numpy(float), rtol=1e-9, atol=0,
                                   equal_nan=True), (name, col)
            else:
                assert u.astype(str).tolist() == v.astype(str).tolist(), (name, col)
    sa, sb = a.summary(), b.summary()
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
    assert local.straggler is not None


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
