"""Traces from other people's GPU jobs: a plain folder, no run.json, read-only."""
import json
import shutil

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
