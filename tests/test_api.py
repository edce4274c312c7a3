"""The notebook API returns the same numbers the CLI writes."""
import json
import shutil

import pandas as pd

from meshscope import analysis
from conftest import ROOT, meshscope


def test_open_returns_what_analyze_writes(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run, ignore=shutil.ignore_patterns("report"))
    meshscope("analyze", run, "--no-cache", check=True)
    api = analysis.open(run)
    for name in ("breakdown", "bubbles", "bandwidth", "pipeline_phases", "stage_imbalance"):
        written = pd.read_parquet(run / "report" / f"{name}.parquet")
        pd.testing.assert_frame_equal(getattr(api, name)().reset_index(drop=True), written,
                                      check_dtype=False)
    written = json.loads((run / "report" / "summary.json").read_text())
    assert api.summary()["per_rank_mean"] == written["per_rank_mean"]
    assert [f["id"] for f in api.findings()] == [f["id"] for f in written["findings"]]
    assert "RunAnalysis" in repr(api)
