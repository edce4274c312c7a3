"""Traces from other people's GPU jobs: a plain folder, no run.json, read-only."""
import json
import shutil

import pytest

from conftest import meshscope, shared_trace


def test_gpu_trace_folder_without_run_json(tmp_path):
    src = shared_trace("gpu/hta/trace_diff/control/control.json.gz")
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(src, folder / src.name)
    proc = meshscope("analyze", folder, "--json", check=True)
    summary = json.loads(proc.stdout)
    assert summary["device"] == "gpu" and summary["run"] is None
    assert summary["ranks"] == [3]          # from distributedInfo, not the file name
    assert summary["pipeline_stages"] == []
    row = summary["per_rank_mean"][0]
    assert row["comm_us"] > 0 and 0 < row["overlap_pct"] < 100
    parts = (row["compute_us"] + row["exposed_comm_us"] + row["bubble_us"] + row["other_us"]
             + row["idle_us"])
    assert abs(parts - row["window_us"]) <= 0.01 * row["window_us"]
    assert (folder / "report" / "summary.json").exists()


def test_unwritable_report_location_is_a_clear_error(tmp_path):
    src = shared_trace("gpu/hta/nccl_parser_config/nccl_data.json.gz")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the report folder would go")
    proc = meshscope("analyze", src.parent, "--out", blocker / "report")
    assert proc.returncode == 2
    assert "cannot write the report" in proc.stderr and "Traceback" not in proc.stderr


PLAIN_DDP = r'''
import sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
out = sys.argv[1]
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
             on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/worker{rank}.pt.trace.json")
             ) as prof:
    for step in range(5):
        loss = model(torch.randn(64, 256)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        prof.step()
dist.destroy_process_group()
'''


def test_plain_ddp_script_without_meshscope(tmp_path):
    """A 2-rank DDP loop that knows nothing of meshscope (torch.profiler only), analysed with
    no run.json."""
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(PLAIN_DDP)
    traces = tmp_path / "traces"
    traces.mkdir()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", str(script), str(traces)], check=True,
                   capture_output=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    summary = json.loads(meshscope("analyze", traces, "--json", check=True).stdout)
    assert summary["run"] is None and summary["ranks"] == [0, 1]
    assert summary["steps"] == [2, 3, 4]
    for row in summary["per_rank_mean"]:
        assert row["compute_us"] > 0 and row["comm_us"] > 0  # DDP's gradient all-reduce
    # One process group in distributedInfo (the world): its all-reduces can be matched.
    assert summary["cross_rank"]["matchable"] is True
    assert {w["rank"] for w in summary["cross_rank"]["rank_savings"]} == {0, 1}
    assert summary["cross_rank"]["matched_on"] == "group_order"


def test_devicemesh_group_descriptions_name_the_dimension(tmp_path):
    """A foreign GPU trace whose collectives were issued on a DeviceMesh group (description
    ``mesh_tp``): exposed communication is attributed to tp, with no run.json. The input is the
    real A100 DDP trace with its group description renamed to what a DeviceMesh writes."""
    import gzip

    src = shared_trace("gpu/hta/nccl_parser_config/nccl_data.json.gz")
    doc = json.loads(gzip.decompress(src.read_bytes()))
    renamed = 0
    for ev in doc["traceEvents"]:
        args = ev.get("args") or {}
        if args.get("Process Group Description") == "default_pg":
            args["Process Group Description"] = "mesh_tp"
            renamed += 1
    assert renamed > 0
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    summary = json.loads(meshscope("analyze", folder, "--json", check=True).stdout)
    row = summary["per_rank_mean"][0]
    assert row["exposed_comm_us"] > 0
    assert row["exposed_comm_tp_us"] == pytest.approx(row["exposed_comm_us"])
    assert row["exposed_comm_unknown_us"] == 0
