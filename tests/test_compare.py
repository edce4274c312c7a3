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
import dataclasses

from meshscope.analysis.compare import CompareError
from meshscope.analysis.compare.ranking import (TIE_REL, Comparison, explain, spearman, tied,
                                                worse_end)
from meshscope.analysis.compare.ranking_text import render
from meshscope.layouts.ranked import compare
from meshscope.layouts.plan import theory_fraction
from meshscope.layouts.throughput import step_table
from meshscope.collectors.run_json import read_run_info

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
        table, _ = step_table(run, read_run_info(run))
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
    diffs, gate = data.pop("diffs"), data.pop("gate")
    assert data == json.loads(json.dumps(comparison.to_dict()))
    # each later run against the first, no condition asked
    assert [(d["before"]["name"], d["after"]["name"]) for d in diffs] == \
        [(RUNS[0], r) for r in RUNS[1:]] and gate == []
    assert data["winner"] == comparison.winner.name
    out = tmp_path / "table.csv"
    meshscope("compare", *[SAMPLES / r for r in RUNS], "--csv", out, check=True)
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["name"] for r in rows] == [r.name for r in comparison.rows]
    assert float(rows[0]["step_time_us"]) == pytest.approx(comparison.rows[0].step_time_us)
    proc = meshscope("compare", *[SAMPLES / r for r in RUNS], check=True)
    assert "wins" in proc.stdout and all(r in proc.stdout for r in RUNS)


def test_the_dashboard_page_reads_the_comparison(comparison):
    """dashboard/pages/compare.py turns the `Comparison` into its table: one column per
    run in ranked order, the step times of the rows."""
    from meshscope.dashboard.pages.compare import comparison_rows
    names, figures = comparison_rows(comparison)
    assert names == [r.name for r in comparison.rows]
    step = dict((f[0], f[1]) for f in figures)["step time (ms)"]
    assert step == pytest.approx([r.step_time_us / 1e3 for r in comparison.rows])


def test_unusable_paths_are_one_line_and_exit_2(tmp_path):
    proc = meshscope("compare", tmp_path / "nope", SAMPLES / "dp4-ddp")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nope" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = meshscope("compare", tmp_path / "empty")      # one folder, and not a sweep
    assert proc.returncode == 2 and "two or more runs" in proc.stderr
    with pytest.raises(CompareError, match="nothing to compare"):
        compare([])


def test_spearman_on_known_rankings():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1], [2]) is None


def test_ties_are_ties_not_losses():
    """914.78 vs 915.01 ms is 0.025% apart: a tie (TIE_REL = 0.5%), in the worse-end marks,
    the sentences and the terminal table; 1% apart is not."""
    assert TIE_REL == 0.005
    assert tied(914.78, 915.01) and not tied(914.78, 924.0)
    assert worse_end([914.78, 915.01], "low") == set()
    assert worse_end([914.78, 915.01, 990.0], "low") == {2}
    assert worse_end([914.78, 990.0, 989.5], "low") == {1, 2}      # both at the worse end
    assert worse_end([10.0, 12.0, None, "x"], "high") == {0}
    assert worse_end([1.0, 2.0], "info") == set()


def test_a_tied_run_is_named_as_a_tie_everywhere():
    """Two real rows whose step times are set 0.23 ms apart (914.78 and 915.01 ms), and a third
    10% slower: the sentence, --json, --csv and the table call the second a tie."""
    real = compare([SAMPLES / "dp4-ddp", SAMPLES / "dp2-pp2-1f1b", SAMPLES / "dp2-ep2-moe"])
    a, b, c = (dataclasses.replace(r, step_time_us=t) for r, t in
               zip(real.rows, (914780.0, 915010.0, 1006500.0)))
    comp = Comparison(rows=[a, b, c], winner=a, explanations=explain([a, b, c], a))
    assert comp.ties == [b]
    assert comp.explanations[1] == (f"{b.label} ties with {a.label} (915.01 ms vs 914.78 ms per "
                                    "step, within 0.5%).")
    assert "slower than" in comp.explanations[2]
    assert comp.to_dict()["tied_with_winner"] == [b.name]
    rows = list(csv.DictReader(io.StringIO(comp.to_csv())))
    assert [r["tied_with_winner"] for r in rows] == ["", "yes", ""]
    lines = render(comp).splitlines()
    assert lines[2].split()[0] == "1=" and lines[1].split()[0] == "1" \
        and lines[3].split()[0] == "3"


def test_world_size_is_a_column_and_a_note_when_it_differs(tmp_path):
    """dp2-ep2-moe runs on 2 ranks, dp4-ddp on 4: the terminal table's `ranks` column, the CSV's
    `ranks`, the page's "ranks (world size)" row, and a note."""
    from meshscope.dashboard.pages.compare import comparison_rows
    c = compare([SAMPLES / "dp4-ddp", SAMPLES / "dp2-ep2-moe"])
    sizes = {r.name: r.ranks for r in c.rows}
    assert sizes == {"dp4-ddp": 4, "dp2-ep2-moe": 2}
    table = render(c).splitlines()
    assert table[0].split()[2] == "ranks"
    for line in table[1:3]:
        name, ranks = line.split()[1:3]
        assert int(ranks) == sizes[name]
    rows = list(csv.DictReader(io.StringIO(c.to_csv())))
    assert {r["name"]: int(r["ranks"]) for r in rows} == sizes
    names, figures = comparison_rows(c)
    world = dict((f[0], f[1]) for f in figures)["ranks (world size)"]
    assert dict(zip(names, world)) == sizes
    assert any("different world sizes (2, 4 ranks)" in n for n in c.notes)
