"""The whole path on real multi-process gloo runs: run → run directory → analyze → report."""
import gzip
import json

import pandas as pd
import pytest

from meshscope.collectors.schema import validate_run_json
from conftest import meshscope
from meshscope.parallel.model import PRESETS
from meshscope.parallel.reference import reference_losses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dp2pp2(tmp_path_factory):
    """dp=2, pp=2 on 4 ranks, 1F1B, 4 microbatches, 6 steps (the last three profiled)."""
    run = tmp_path_factory.mktemp("e2e") / "dp2pp2"
    meshscope("run", "--layout", "dp=2,pp=2", "--schedule", "1f1b", "--microbatches", 4,
              "--steps", 6, "--out", run, check=True)
    proc = meshscope("analyze", run, "--json", check=True)
    return run, json.loads(proc.stdout)


def test_run_directory_is_complete(dp2pp2):
    run, _ = dp2pp2
    validate_run_json(run / "run.json")
    desc = json.loads((run / "run.json").read_text())
    assert desc["schema_version"] == 1 and desc["status"] == "completed"
    assert desc["world_size"] == 4 and desc["layout"]["dp"] == 2 and desc["layout"]["pp"] == 2
    assert sorted(desc["mesh"]["coordinates"]) == ["0", "1", "2", "3"]
    dims = {(g["dimension"], tuple(g["ranks"])) for g in desc["process_groups"]}
    assert dims == {("pp", (0, 2)), ("pp", (1, 3)), ("dp", (0, 1)), ("dp", (2, 3))}
    assert all(g.get("name") and g.get("desc") == f"mesh_{g['dimension']}"
               for g in desc["process_groups"])
    for r in range(4):
        trace = json.loads(gzip.decompress((run / "traces" / f"rank{r}.json.gz").read_bytes()))
        assert trace["distributedInfo"]["rank"] == r
        assert trace["meshscope"] == {"layout": "dp=2,pp=2", "rank": r, "run_id": desc["run_id"],
                                      "coordinates": desc["mesh"]["coordinates"][str(r)]}
        steps = pd.read_parquet(run / "steps" / f"rank{r}.parquet")
        assert steps["step"].tolist() == list(range(6))
    assert not (run / ".meta").exists()


def test_every_record_is_present_and_consistent(dp2pp2):
    """traces, comms and steps for ranks 0-3; step counts agree; Flight Recorder sequence
    numbers of each process group increase by one."""
    run, _ = dp2pp2
    for sub, suffix in (("traces", ".json.gz"), ("comms", ".json"), ("steps", ".parquet")):
        assert sorted(p.name for p in (run / sub).iterdir()) == \
            [f"rank{r}{suffix}" for r in range(4)], sub
    counts = {len(pd.read_parquet(run / "steps" / f"rank{r}.parquet")) for r in range(4)}
    assert counts == {6}
    for r in range(4):
        dump = json.loads((run / "comms" / f"rank{r}.json").read_text())
        assert dump["reason"] == "end" and dump["rank"] == r
        by_group: dict = {}
        for e in dump["flight_recorder"]["entries"]:
            key = "p2p_seq_id" if e["is_p2p"] else "collective_seq_id"
            by_group.setdefault((e["process_group"][0], key), []).append(e[key])
        assert by_group, f"rank {r}: no collectives recorded"
        for (group, key), seqs in by_group.items():
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (r, group, key, seqs)


def test_losses_match_one_process(dp2pp2):
    """Correct or worthless: the same losses as one process with the same global batch."""
    run, _ = dp2pp2
    steps = pd.concat(pd.read_parquet(run / "steps" / f"rank{r}.parquet") for r in range(4))
    # Only the last pipeline stage (ranks 2 and 3) computes the loss.
    assert steps.dropna(subset=["loss"])["rank"].unique().tolist() == [2, 3]
    parallel = steps.dropna(subset=["loss"]).groupby("step")["loss"].mean().tolist()
    expected = reference_losses(PRESETS["tiny"], steps=6, seed=0, batch=16)
    assert parallel == pytest.approx(expected, rel=1e-4)


def test_report_relations(dp2pp2):
    run, summary = dp2pp2
    assert summary["ranks"] == [0, 1, 2, 3] and summary["missing_ranks"] == []
    assert summary["steps"] == [3, 4, 5]
    b = pd.read_parquet(run / "report" / "breakdown.parquet")
    assert sorted(b["rank"].unique()) == [0, 1, 2, 3]
    assert len(b) == 4 * 3
    assert (b["overlapped_comm_us"] <= b["comm_us"] + 1e-6).all()
    assert (b["overlapped_comm_us"] <= b["compute_us"] + 1e-6).all()
    parts = (b["compute_us"] - b["overlapped_comm_us"] + b["overlapped_comm_us"]
             + b["exposed_comm_us"] + b["bubble_us"] + b["other_us"] + b["idle_us"])
    assert ((parts - b["window_us"]).abs() <= 0.01 * b["window_us"]).all()
    assert (b["comm_us"] > 0).all(), "every rank sends, receives or all-reduces each step"
    pct = b["overlapped_comm_us"] / b["comm_us"] * 100
    assert (pct - b["overlap_pct"]).abs().max() < 1e-9
    bub = pd.read_parquet(run / "report" / "bubbles.parquet")
    assert sorted(bub["rank"].unique()) == [0, 1, 2, 3]
    assert (bub["bubble_fraction"] > 0).all() and (bub["bubble_fraction"] < 1).all()
    assert set(bub["stage"]) == {0, 1}
    assert bub["theory_fraction"].unique().tolist() == [pytest.approx(1 / 5)]


def test_text_summary_names_every_rank(dp2pp2):
    run, _ = dp2pp2
    proc = meshscope("analyze", run, check=True)
    assert "Pipeline bubble per stage" in proc.stdout
    for r in range(4):
        assert any(line.split()[:1] == [str(r)] for line in proc.stdout.splitlines())


def test_demo_runs_and_analyses_without_serving(tmp_path):
    """What `make demo` runs, minus the server: a run directory with its report."""
    proc = meshscope("demo", "--no-serve", "--out", tmp_path, check=True)
    run = tmp_path / "demo-1"
    assert (run / "report" / "summary.json").exists()
    assert "Pipeline bubble per stage" in proc.stdout
    assert "loss" in proc.stdout
