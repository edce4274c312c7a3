"""`meshscope compare` and its API on the shipped sample runs (read only): each row holds its
run's own report numbers, ranked by step time; the planner's bytes stand beside the bytes
measured in the traces; --json is what the dashboard's compare page reads."""
import csv
import io
import json
import statistics

import pandas as pd
import pytest

from conftest import ROOT, meshscope
from meshscope.analysis.compare import CompareError, compare, spearman
from meshscope.parallel.plan import theory_fraction
from meshscope.parallel.throughput import step_table

SAMPLES = ROOT / "samples"
RUNS = ["dp4-ddp", "dp2-pp2-1f1b", "tp2-pp2-interleaved"]


@pytest.fixture(scope="module")
def comparison():
    return compare([SAMPLES / r for r in RUNS])


def assert_row_is_its_report(row, run):
    """Every measured number of a comparison row is its run's own: summary.json, the step
    timers (tests/test_sweep.py uses this too)."""
    s = json.loads((run / "report" / "summary.json").read_text())
    per_rank = s["per_rank_mean"]
    assert row.compute_us == pytest.approx(statistics.fmean(r["compute_us"]
                                                           for r in per_rank))
    for dim, v in row.exposed_comm_us.items():
        assert v == pytest.approx(statistics.fmean(r[f"exposed_comm_{dim}_us"]
                                                   for r in per_rank))
    stages = s["pipeline_stages"]
    if stages:
        assert row.bubble_fraction == pytest.approx(statistics.fmean(
            x["bubble_fraction"] for x in stages))
    else:
        assert row.bubble_fraction is None
    thr = s.get("throughput")
    if thr:
        assert row.step_time_us == pytest.approx(thr["step_time_us"])
    else:   # schema 1: the step timers' table, warm-up step 0 left out
        desc = json.loads((run / "run.json").read_text())
        table, _ = step_table(run, desc)
        assert row.step_time_us == pytest.approx(table["step_time_us"][1:].median())
    steps = pd.concat(pd.read_parquet(p) for p in (run / "steps").glob("*.parquet"))
    assert row.peak_memory_bytes == steps["peak_memory_bytes"].max()
    assert [f.id for f in row.findings] == [f["id"] for f in s["findings"][:3]]


def test_rows_hold_each_runs_own_report(comparison):
    assert sorted(r.name for r in comparison.rows) == sorted(RUNS)
    times = [r.step_time_us for r in comparison.rows]
    assert times == sorted(times) and comparison.winner is comparison.rows[0]
    for row in comparison.rows:
        assert_row_is_its_report(row, SAMPLES / row.name)
        assert row.ranks == 4 and row.microbatches == 4


def planned_vs_measured(row, dims) -> list[str]:
    """Assert the planner's bytes per step of each of ``dims`` the report attributes equal the
    measured ones within 5%; returns the dimensions checked (tests/test_sweep.py too)."""
    checked = []
    for dim in dims:
        if dim not in row.comm_bytes:
            continue
        assert row.predicted.comm_bytes.get(dim) == pytest.approx(row.comm_bytes[dim],
                                                                  rel=0.05), \
            (row.name, dim, row.predicted.comm_bytes, row.comm_bytes)
        checked.append(dim)
    return checked


def test_planned_dp_and_pp_bytes_stand_beside_the_measured_ones(comparison):
    """The planner's bytes per step equal those measured in the sample runs' traces within 5%:
    dp (DDP's bucketed all-reduce) and pp (1F1B and interleaved activations and gradients)."""
    checked = [d for row in comparison.rows for d in planned_vs_measured(row, ("dp", "pp"))]
    assert checked.count("dp") >= 2 and checked.count("pp") >= 2


def test_planned_tp_bytes_stand_beside_the_measured_ones(comparison):
    """tp with sequence parallelism, interleaved over 2 pipeline ranks (the sample)."""
    row = next(r for r in comparison.rows if r.name == "tp2-pp2-interleaved")
    assert planned_vs_measured(row, ("tp",)) == ["tp"]


def test_explanations_name_the_bubble_and_its_remedy(comparison):
    """The interleaved run's sentence gives the closed form at twice the microbatches:
    (p−1)/(v·m+p−1) = 1/17 ≈ 6% at m = 8 (p = 2, v = 2)."""
    text = next(e for e in comparison.explanations if e.startswith("tp2·pp2"))
    assert "slower than" in text and "pipeline bubble" in text
    assert f"8 microbatches would bring it to ~{theory_fraction('interleaved-1f1b', 2, 8, 2):.0%}" \
        in text
    assert comparison.explanations[0].startswith(f"{comparison.winner.label} wins")


def test_json_and_csv_for_scripts(tmp_path, comparison):
    proc = meshscope("compare", *[SAMPLES / r for r in RUNS], "--json", check=True)
    data = json.loads(proc.stdout)
    assert data == json.loads(json.dumps(comparison.to_dict()))
    assert data["winner"] == comparison.winner.name
    out = tmp_path / "table.csv"
    meshscope("compare", *[SAMPLES / r for r in RUNS], "--csv", out, check=True)
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["name"] for r in rows] == [r.name for r in comparison.rows]
    assert float(rows[0]["step_time_us"]) == pytest.approx(comparison.rows[0].step_time_us)
    proc = meshscope("compare", *[SAMPLES / r for r in RUNS], check=True)
    assert "wins" in proc.stdout and all(r in proc.stdout for r in RUNS)


def test_the_dashboard_page_reads_compare_json(comparison):
    """dashboard/pages/compare.py turns `Comparison.to_dict()` into its table: one column per
    run in ranked order, the step times of the rows."""
    from meshscope.dashboard.pages.compare import comparison_rows
    names, figures = comparison_rows(json.loads(json.dumps(comparison.to_dict())))
    assert names == [r.name for r in comparison.rows]
    step = dict((f[0], f[1]) for f in figures)["step time (ms)"]
    assert step == pytest.approx([r.step_time_us / 1e3 for r in comparison.rows])


def test_unusable_paths_are_one_line_and_exit_2(tmp_path):
    proc = meshscope("compare", tmp_path / "nope", SAMPLES / "dp4-ddp")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nope" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = meshscope("compare", tmp_path / "empty")
    assert proc.returncode == 2 and "run.json" in proc.stderr
    with pytest.raises(CompareError, match="nothing to compare"):
        compare([])


def test_spearman_on_known_rankings():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1], [2]) is None
