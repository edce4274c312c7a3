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
