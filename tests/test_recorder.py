"""collectors.Recorder around training loops that are not meshscope's runner.

Each test writes its own small torch-only training script, runs it on 2 gloo ranks with
torchrun, and checks that the run directory is complete and that ``meshscope analyze`` reports
on it.
"""
import gzip
import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from meshscope.collectors import Recorder
from meshscope.collectors.flight_recorder import read_dump
from meshscope.collectors.recorder import given_layout, infer_layout, layout_str
from meshscope.collectors.schema import validate_run_json
from conftest import ROOT, meshscope

pytestmark = pytest.mark.slow

STEPS = 6
PROFILE = (2, 4)

# A plain DDP loop: torch only, plus the Recorder. No meshscope runner code.
DDP_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from meshscope.collectors import Recorder

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Recorder(sys.argv[1], profile_steps=({first}, {last}), model_flops_per_token=6 * 33088,
              global_batch_tokens=64) as rec:
    for step in range({steps}):
        x = torch.randn(32, 64)
        with rec.phase("fwd_bwd"):
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
        with rec.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        rec.step(loss=loss.item(), tokens=32)
dist.destroy_process_group()
"""

# torchtitan-style: a named 2-D DeviceMesh; DDP over the "dp" dimension's group, and an
# all-reduce over "tp" standing in for tensor-parallel traffic.
MESH_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP
from meshscope.collectors import Recorder

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", ({dp}, {tp}), mesh_dim_names=("dp", "tp"))
model = DDP(torch.nn.Linear(32, 32), process_group=mesh["dp"].get_group())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Recorder(sys.argv[1], mesh=mesh, profile_steps=(1, 2)) as rec:
    for step in range(4):
        y = model(torch.randn(8, 32))
        dist.all_reduce(y.detach().clone(), group=mesh["tp"].get_group())
        y.sum().backward()
        opt.step()
        rec.step(loss=y.sum().item(), tokens=8)
dist.destroy_process_group()
"""


def run_script(tmp_path, source: str, out) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recorder-ddp")
    out = tmp / "run"
    run_script(tmp, DDP_SCRIPT.format(first=PROFILE[0], last=PROFILE[1], steps=STEPS), out)
    proc = meshscope("analyze", out, "--json")
    return out, proc


def test_ddp_loop_gives_a_run_directory_analyze_accepts(ddp_run):
    out, proc = ddp_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["ranks"] == [0, 1] and summary["missing_ranks"] == []
    assert summary["steps"] == list(range(PROFILE[0], PROFILE[1] + 1))
    b = pd.read_parquet(out / "report" / "breakdown.parquet")
    per_rank = b.groupby("rank")["comm_us"].sum()
    assert sorted(per_rank.index) == [0, 1]
    assert (per_rank > 0).all(), "DDP all-reduces gradients every step"


def test_ddp_run_json(ddp_run):
    out, _ = ddp_run
    desc = validate_run_json(out / "run.json")
    assert desc["status"] == "completed" and desc["recorded_by"] == "collectors.Recorder"
    assert desc["layout"] == {"dp": 2, "tp": 1, "pp": 1, "cp": 1, "ep": 1}
    assert desc["layout_str"] == "dp=2" and desc["world_size"] == 2
    assert desc["mesh"]["coordinates"] == {"0": {"dp": 0}, "1": {"dp": 1}}
    assert desc["process_groups"] == [{"dimension": "dp", "ranks": [0, 1], "name": "0",
                                       "desc": "default_pg", "mesh_dim": None}]
    assert desc["steps"] == STEPS and desc["profile_steps"] == list(PROFILE)
    assert desc["model"] == {"flops_per_token": 6 * 33088}
    assert desc["device"]["type"] == "cpu" and desc["device"]["backend"] == "gloo"
    assert desc["nnodes"] == 1 and desc["end_time"] and desc["start_time"]
    assert desc["command"][-1] == str(out)


def test_ddp_steps_traces_and_comms(ddp_run):
    out, _ = ddp_run
    desc = json.loads((out / "run.json").read_text())
    for rank in (0, 1):
        steps = pd.read_parquet(out / "steps" / f"rank{rank}.parquet")
        assert steps["step"].tolist() == list(range(STEPS)), "one row per step"
        assert (steps["rank"] == rank).all() and (steps["tokens"] == 32).all()
        assert steps["loss"].notna().all() and (steps["fwd_bwd_us"] > 0).all()
        assert (steps["optimizer_us"] > 0).all()
        trace = json.loads(gzip.decompress((out / "traces" / f"rank{rank}.json.gz")
                                           .read_bytes()))
        assert trace["meshscope"] == {"layout": "dp=2", "rank": rank, "run_id": desc["run_id"],
                                      "coordinates": {"dp": rank}}
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {f"ProfilerStep#{s}" for s in range(PROFILE[0], PROFILE[1] + 1)} <= names
        assert {"meshscope/pipeline", "meshscope/optimizer"} <= names
        dump = read_dump(out / "comms" / f"rank{rank}.json")
        assert dump.rank == rank and dump.reason == "end" and dump.error is None
        entries = dump.flight_recorder.entries
        assert entries, "DDP's all-reduces are in the Flight Recorder buffer"


@pytest.mark.parametrize("dp,tp", [(1, 2), (2, 1)])
def test_named_2d_mesh(tmp_path, dp, tp):
    out = tmp_path / "run"
    run_script(tmp_path, MESH_SCRIPT.format(dp=dp, tp=tp), out)
    desc = validate_run_json(out / "run.json")
    assert desc["layout"] == {"dp": dp, "tp": tp, "pp": 1, "cp": 1, "ep": 1}
    assert desc["layout_str"] == ("tp=2" if tp == 2 else "dp=2")
    assert desc["mesh"]["dims"] == ["dp", "tp"] and desc["mesh"]["shape"] == [dp, tp]
    if tp == 2:
        assert desc["mesh"]["coordinates"] == {"0": {"dp": 0, "tp": 0}, "1": {"dp": 0, "tp": 1}}
    else:
        assert desc["mesh"]["coordinates"] == {"0": {"dp": 0, "tp": 0}, "1": {"dp": 1, "tp": 0}}
    table = {(g["dimension"], tuple(g["ranks"])) for g in desc["process_groups"]}
    wide = "tp" if tp == 2 else "dp"
    narrow = "dp" if tp == 2 else "tp"
    assert table == {(wide, (0, 1)), (narrow, (0,)), (narrow, (1,))}
    assert all(g["name"] and g["mesh_dim"] == g["dimension"] for g in desc["process_groups"])
    # The size-1 groups are the mesh's own (mesh_<dim>); the full one is the default group,
    # which the mesh reuses — listed once, under its mesh dimension.
    assert {g["desc"] for g in desc["process_groups"] if g["dimension"] == narrow} \
        == {f"mesh_{narrow}"}
    for rank in (0, 1):
        assert len(pd.read_parquet(out / "steps" / f"rank{rank}.parquet")) == 4
        assert (out / "traces" / f"rank{rank}.json.gz").exists()
    proc = meshscope("analyze", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["ranks"] == [0, 1]


def test_failing_loop_reraises_and_records_failure(tmp_path):
    source = DDP_SCRIPT.replace("rec.step(loss=loss.item(), tokens=32)",
                                "rec.step(loss=loss.item(), tokens=32)\n"
                                "        if step == 2: raise ValueError('boom')")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source.format(first=0, last=1, steps=STEPS)))
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "ValueError: boom" in proc.stderr
    desc = validate_run_json(out / "run.json")
    assert desc["status"] == "failed" and "ValueError: boom" in desc["error"]
    # Every rank raises; torchrun may stop the others before they finish: judge rank 0.
    dump = read_dump(out / "comms" / "rank0.json")
    assert dump.reason == "exception" and dump.error == "ValueError: boom"
    assert pd.read_parquet(out / "steps" / "rank0.parquet")["step"].tolist() == [0, 1, 2]


def test_layout_inference_table():
    assert infer_layout(["dp_replicate", "dp_shard", "tp"], [2, 4, 2], 16) == \
        {"dp": 8, "tp": 2, "pp": 1, "cp": 1, "ep": 1}
    assert infer_layout(["pp", "dp_shard", "cp", "tp"], [2, 2, 2, 2], 16)["cp"] == 2
    assert infer_layout(["pp", "experts"], [2, 4], 8) == \
        {"dp": 1, "tp": 1, "pp": 2, "cp": 1, "ep": 1, "experts": 4}
    assert infer_layout([], [4], 4)["dp"] == 4
    assert layout_str({"dp": 1, "tp": 1}) == "dp=1"
    assert given_layout({"dp": 2, "ep": 2}, 2) == {"dp": 2, "tp": 1, "pp": 1, "cp": 1, "ep": 2}
    with pytest.raises(ValueError, match="dp·tp·pp·cp = 4 ranks, but the world has 8"):
        given_layout({"dp": 2, "tp": 2}, 8)
    assert layout_str({"dp": 2, "tp": 1, "pp": 2}) == "dp=2,pp=2"


def test_recorder_needs_torch_distributed(tmp_path):
    with pytest.raises(RuntimeError, match="init_process_group"):
        with Recorder(tmp_path / "run"):
            pass


ONE_RANK_SCRIPT = """
import sys
import torch.distributed as dist
from meshscope.collectors import Recorder

dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
with Recorder(sys.argv[1], profile_steps=(0, 0)) as rec:
    rec.step(loss=1.0, tokens=1)
dist.destroy_process_group()
"""


def test_refuses_a_used_output_directory(tmp_path):
    script = tmp_path / "one.py"
    script.write_text(textwrap.dedent(ONE_RANK_SCRIPT))
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

    def once(store):
        return subprocess.run([sys.executable, str(script), str(out), str(tmp_path / store)],
                              env=env, capture_output=True, text=True, timeout=120)

    first = once("s1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["steps"] == 1
    second = once("s2")
    assert second.returncode != 0
    assert f"output directory {out} exists and is not empty" in second.stderr
