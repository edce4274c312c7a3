"""`meshscope sweep` on real multi-process gloo runs: the world-4 sweep of issue 12 (the
session fixture ``world4_sweep``), a sweep killed after two runs and resumed, a sweep whose runs
fail; and the planner's bytes per step per dimension against the bytes the same runs' traces
show (dp, tp with sequence parallelism, pp, cp, ep)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, meshscope, processes_under
from meshscope.layouts.ranked import compare
from meshscope.layouts.plan import Candidate
from meshscope.layouts.sweep import Sweep, SweepError, SweepSpec, candidates
from meshscope.parallel.config import PRESETS
from test_compare import assert_row_is_its_report, planned_vs_measured

WORLD4 = ["dp4-mb4", "tp4-mb4", "pp4-1f1b-mb4", "dp2-tp2-mb4", "dp2-pp2-1f1b-mb4",
          "tp2-pp2-1f1b-mb4"]


# -- enumeration, without running -----------------------------------------------------------

def test_world4_enumerates_every_valid_layout():
    names = [c.name for c in candidates(SweepSpec(world=4))]
    assert names == WORLD4
    # tiny8 has 8 layers: 4 pipeline ranks × 2 stages fit, and 8 microbatches split 16
    # sequences on 1 or 2 data-parallel ranks but not on 4
    more = [c.name for c in candidates(SweepSpec(world=4, model="tiny8",
                                                 schedules=("1f1b", "interleaved-1f1b"),
                                                 microbatches=(4, 8)))]
    assert "pp4-interleaved-1f1b-mb8" in more and "dp4-mb8" not in more
    # MoE: ep borrows dp·cp ranks; tensor parallelism of MoE layers is refused by the runner
    moe = [c.name for c in candidates(SweepSpec(world=4, model="tiny-moe",
                                                dims=("dp", "tp", "ep")))]
    assert "dp4-ep4-mb4" in moe and "dp4-ep2-mb4" in moe and not any("tp" in n for n in moe)


def test_explicit_layouts_are_checked_like_meshscope_run():
    spec = SweepSpec(world=4, layouts=("dp=2,pp=2", "tp=4"))
    assert [c.name for c in candidates(spec)] == ["tp4-mb4", "dp2-pp2-1f1b-mb4"]
    with pytest.raises(SweepError, match="tp=3 does not divide"):
        candidates(SweepSpec(world=3, layouts=("tp=3",)))
    with pytest.raises(SweepError, match="needs 2 ranks"):
        candidates(SweepSpec(world=4, layouts=("dp=2",)))


def test_a_damaged_sweep_json_is_named_by_its_field(tmp_path):
    """A sweep.json whose second run has a wall time that is not a number, and one whose run
    has no status: `meshscope compare` and `meshscope sweep --resume` exit 2 naming the file
    and the field, without a traceback. The first run, as the sweep wrote it, reads back
    with every field."""
    sweep = Sweep.open(tmp_path / "s", SweepSpec(world=4))
    sweep.save()
    path = tmp_path / "s" / "sweep.json"
    doc = json.loads(path.read_text())
    assert list(doc["runs"][0]) == ["name", "candidate", "status", "error", "stage", "started",
                                    "finished", "wall_s"]
    assert Sweep.open(tmp_path / "s").state["dp4-mb4"].layout == "dp=4"
    for field, value, said in (("wall_s", "fast", "field runs[1].wall_s must be a number"),
                               ("status", None, "field runs[1].status must be one of pending")):
        doc["runs"][1][field] = value
        path.write_text(json.dumps(doc))
        for args in (("compare", tmp_path / "s"), ("sweep", "--resume", tmp_path / "s")):
            proc = meshscope(*args)
            assert proc.returncode == 2 and f"{path}: {said}" in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr
        doc["runs"][1] = json.loads(json.dumps(doc["runs"][0]))


def test_a_folder_of_another_sweep_is_refused(tmp_path):
    Sweep.open(tmp_path / "s", SweepSpec(world=4)).save()
    with pytest.raises(SweepError, match="other options .*microbatches"):
        Sweep.open(tmp_path / "s", SweepSpec(world=4, microbatches=(2,)))
    proc = meshscope("sweep", "--world", 4, "--microbatches", 2, "--out", tmp_path / "s")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    proc = meshscope("sweep", "--resume", tmp_path / "s", "--list", check=True)
    assert all(n in proc.stdout for n in WORLD4) and "pending" in proc.stdout


# -- the world-4 sweep ----------------------------------------------------------------------

@pytest.mark.slow
def test_world4_table_is_complete_and_each_row_is_its_report(world4_sweep):
    c = compare(world4_sweep)
    assert sorted(r.name for r in c.rows) == sorted(WORLD4) and not c.failed
    times = [r.step_time_us for r in c.rows]
    assert times == sorted(times) and c.winner.name == c.rows[0].name
    for row in c.rows:
        assert_row_is_its_report(row, world4_sweep / row.name)
        assert row.predicted is not None and row.predicted.step_time_us > 0
    written = json.loads((world4_sweep / "comparison.json").read_text())
    assert [r["name"] for r in written["rows"]] == [r.name for r in c.rows]
    plan = json.loads((world4_sweep / "plan.json").read_text())
    assert sorted(r["name"] for r in plan["rows"]) == sorted(WORLD4)
    assert len(c.explanations) == len(WORLD4)
    state = json.loads((world4_sweep / "sweep.json").read_text())
    assert {r["status"] for r in state["runs"]} == {"completed"}


@pytest.mark.slow
@pytest.mark.parametrize("dim,runs", [("dp", ["dp4-mb4", "dp2-pp2-1f1b-mb4"]),
                                      ("tp", ["tp4-mb4", "tp2-pp2-1f1b-mb4"]),
                                      ("pp", ["pp4-1f1b-mb4", "dp2-pp2-1f1b-mb4",
                                              "tp2-pp2-1f1b-mb4"])])
def test_planned_bytes_match_the_traces(world4_sweep, dim, runs):
    """dp: DDP's one bucketed all-reduce per step; tp (sequence parallel): 4 all-gathers and 4
    reduce-scatters per layer and microbatch, the embedding's and head's, the logits', the
    optimizer's norm-gradient all-reduces; pp: activations and gradients per microbatch."""
    c = compare([world4_sweep / r for r in runs])
    for row in c.rows:
        assert planned_vs_measured(row, (dim,)) == [dim], (row.name, row.comm_bytes)


# -- killed and resumed ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """dp2, tp2, cp2 (2 ranks each): the sweep process is SIGKILLed once two runs are
    complete and the third is training, then the same command resumes it."""
    out = tmp_path_factory.mktemp("resume") / "sweep"
    args = ["sweep", "--world", 2, "--dims", "dp,tp,cp", "--steps", 2, "--out", out]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "meshscope", *map(str, args)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    state = {}
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            state = {r["name"]: r["status"] for r in
                     json.loads((out / "sweep.json").read_text())["runs"]}
        except (OSError, ValueError, KeyError):
            pass
        if list(state.values()) == ["completed", "completed", "running"] and \
                (out / "cp2-mb4").exists():
            break
        time.sleep(0.2)
    assert proc.poll() is None, f"the sweep ended before it could be killed: {state}"
    before = {n: json.loads((out / n / "run.json").read_text())["run_id"]
              for n in ("dp2-mb4", "tp2-mb4")}
    reports = {n: (out / n / "report" / "summary.json").stat().st_mtime_ns
               for n in ("dp2-mb4", "tp2-mb4")}
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # The killed sweep's launcher child is told by the kernel (parent-death signal) and stops
    # its ranks: nothing of the sweep keeps running.
    deadline = time.monotonic() + 90
    while processes_under(out) and time.monotonic() < deadline:
        time.sleep(0.5)
    orphans = [p.info["cmdline"] for p in processes_under(out)]
    killed_state = json.loads((out / "sweep.json").read_text())
    resumed_proc = meshscope(*args, timeout=900, check=True)
    return out, before, reports, orphans, killed_state, resumed_proc


@pytest.mark.slow
def test_a_killed_sweep_resumes_without_redoing_completed_runs(resumed):
    out, before, reports, orphans, killed_state, proc = resumed
    assert orphans == []
    assert [r["status"] for r in killed_state["runs"]] == ["completed", "completed", "running"]
    assert "3 layouts of 2 ranks, model tiny, 1 to run" in proc.stdout
    state = json.loads((out / "sweep.json").read_text())
    assert [r["status"] for r in state["runs"]] == ["completed"] * 3
    for name, run_id in before.items():
        assert json.loads((out / name / "run.json").read_text())["run_id"] == run_id
        assert (out / name / "report" / "summary.json").stat().st_mtime_ns == reports[name]
    c = compare(out)
    assert sorted(r.name for r in c.rows) == ["cp2-mb4", "dp2-mb4", "tp2-mb4"]


def _measured_bytes_by_op(run) -> dict[str, float]:
    """op → bytes per step per rank (mean over ranks and profiled steps) from the report's
    collective-instance table (its bandwidth table before that exists)."""
    import pandas as pd
    report = run / "report"
    path = report / "instances.parquet"
    if not path.exists():
        path = report / "bandwidth.parquet"
    t = pd.read_parquet(path, columns=["rank", "step", "op", "msg_bytes"])
    n = t.groupby(["rank", "step"]).ngroups
    return (t.groupby("op")["msg_bytes"].sum() / n).to_dict()


@pytest.mark.slow
def test_planned_bytes_match_the_traces_cp_and_tp(resumed):
    """cp: the ring's K, V (and positions) exchanges, cp − 1 in forward and cp in backward per
    layer and microbatch, with dK, dV on the way back — in a layout without pp they are the
    only sends and receives, and the gradient all-reduce over dp × cp the only all-reduce, so
    they are compared by op (with dp = 1 the dp × cp group is the cp group, so the report files
    the gradient all-reduce under cp beside the ring); tp without dp: the optimizer all-reduces
    each replicated norm gradient three times."""
    out = resumed[0]
    rows = {r.name: r for r in compare(out).rows}
    cp = rows["cp2-mb4"]
    by_op = _measured_bytes_by_op(out / "cp2-mb4")
    assert cp.predicted.comm_bytes["cp"] == pytest.approx(by_op["send"] + by_op["recv"],
                                                          rel=0.05)
    assert cp.predicted.comm_bytes["dp"] == pytest.approx(by_op["all_reduce"], rel=0.05)
    assert planned_vs_measured(rows["dp2-mb4"], ("dp",)) == ["dp"]
    assert planned_vs_measured(rows["tp2-mb4"], ("tp",)) == ["tp"]


@pytest.mark.slow
def test_planned_bytes_match_the_traces_ep():
    """ep, on the shipped dp2·ep2 MoE sample: per MoE layer and microbatch the expert counts and
    four token all-to-alls of T·k rows (the ep group's mean per rank) — the runner's only
    all-to-alls, compared by op where the report cannot attribute the group yet."""
    run = ROOT / "samples" / "dp2-ep2-moe"
    row = compare([run]).rows[0]
    if "ep" in row.comm_bytes:
        assert planned_vs_measured(row, ("ep",)) == ["ep"]
    else:
        assert row.predicted.comm_bytes["ep"] == pytest.approx(
            _measured_bytes_by_op(run)["all_to_all"], rel=0.05)


@pytest.mark.slow
def test_failing_runs_are_recorded_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "sweep"
    proc = meshscope("sweep", "--world", 2, "--dims", "dp,tp", "--steps", 2, "--inject",
                     "crash=1:0", "--out", out, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert [r["name"] for r in runs] == ["dp2-mb4", "tp2-mb4"]
    for r in runs:
        assert r["status"] == "failed" and r["stage"] == "run"
        assert "rank 1 failed" in r["error"] and "InjectedCrash" in r["error"]
    assert "dp2-mb4: failed" in proc.stdout and "tp2-mb4: failed" in proc.stdout
    # resuming keeps the failures unless asked to retry them
    again = meshscope("sweep", "--resume", out, "--list", check=True)
    assert "0 to run" in again.stdout


def test_candidate_names_round_trip():
    for c in candidates(SweepSpec(world=4, model="tiny8", schedules=("zbv", "gpipe"),
                                  dp_modes=("ddp", "fsdp"))):
        assert Candidate.from_dict(c.as_dict()) == c
    assert PRESETS["tiny8"].n_layers == 8
