"""The plan/measure loop for a GPU job from anyone's traces (issue 49, item 5):
``compare … --detail`` with the job described by plan's flags puts each planned term beside
the report's measured one (``layouts/job_vs_plan.py``), says why a term is not measured, and
``plan --from`` the same trace names the factor that closes the GEMM term's gap.

On the shared corpus' GPU sets, analysed once a session (``conftest.real_gpu_sets``): each
compare here reads their report folders (a report folder is read as it is, not analysed
again; its traces are found beside it).
"""
from __future__ import annotations

import json
import pathlib
import re
import shutil

import pytest
from click.testing import CliRunner

from meshscope.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
H100 = "tracelens__traces__h100"          # one H100, Qwen1.5-0.5B, shapes and memory events
DDP = "hta__nccl_parser_config"           # DDP on A100: collectives, no memory events
NO_MESH = "hta__trace_diff__control"      # all_to_all + all_reduce, groups --layout cannot map
# Qwen1.5-0.5B's sizes (its Hugging Face config.json), the model the H100 trace ran
QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1024,
        "intermediate_size": 2816, "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 16, "vocab_size": 151936, "max_position_embeddings": 32768,
        "tie_word_embeddings": True, "hidden_act": "silu", "rms_norm_eps": 1e-06}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen_json(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("model") / "qwen1.5-0.5b.json"
    path.write_text(json.dumps(QWEN))
    return path


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], terminal_width=200)


def _job_args(qwen_json, layout="dp=1", *extra):
    return ("--model-json", qwen_json, "--layout", layout, "--global-batch", 1,
            "--seq-len", 8944, "--device", "H100", *extra)


def _trace(root: pathlib.Path) -> pathlib.Path:
    return next((root / H100).glob("*.json.gz"))


@pytest.fixture(scope="module")
def uncalibrated(real_gpu_sets, qwen_json) -> dict:
    """``compare H100 DDP --detail --json`` of the Qwen job on the device's own curves."""
    root, _ = real_gpu_sets
    r = _invoke("compare", root / H100 / "report", root / DDP / "report", "--detail", "--json",
                *_job_args(qwen_json))
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{"):])


def test_detail_measured_column_is_the_reports(real_gpu_sets, uncalibrated):
    root, _ = real_gpu_sets
    doc = uncalibrated
    terms = {j["run"]: {t["term"]: t for t in j["rows"]} for j in doc["job_vs_plan"]}
    for name in (H100, DDP):
        summary = json.loads((root / name / "report" / "summary.json").read_text())
        per_rank = summary["per_rank_mean"]
        mine = terms[name]
        assert mine["compute"]["measured"] == pytest.approx(
            sum(p["compute_us"] for p in per_rank) / len(per_rank))
        assert mine["step"]["measured"] == pytest.approx(summary["step_time_us"])
        assert mine["compute"]["planned"] > 0 and mine["compute"]["not_measured"] is None
    # the H100 trace's allocator peak, as its report's memory section has it
    gpu_peaks = [d["peak_allocated_bytes"] for d in
                 json.loads((root / H100 / "report" / "summary.json").read_text())["memory"]["devices"]
                 if d["device"].startswith("cuda")]
    assert terms[H100]["peak memory"]["measured"] == pytest.approx(max(gpu_peaks))
    assert terms[H100]["peak memory"]["not_measured"] is None
    # the DDP trace's communication, attributed by --layout dp=1 … is none of dp's: the report
    # files it under unknown, measured; the planner has no such dimension and says so
    unknown = terms[DDP].get("exposed unknown") or terms[DDP].get("exposed dp")
    assert unknown["measured"] == pytest.approx(sum(
        p["exposed_comm_unknown_us"] + p["exposed_comm_dp_us"]
        for p in json.loads((root / DDP / "report" / "summary.json").read_text())["per_rank_mean"]))


def test_a_term_the_trace_cannot_measure_says_why_never_zero(real_gpu_sets, qwen_json):
    root, _ = real_gpu_sets
    r = _invoke("compare", root / H100 / "report", root / NO_MESH / "report", "--detail",
                *_job_args(qwen_json, "dp=8", "--global-batch", 8))
    assert r.exit_code == 0, r.output
    block = r.output[r.output.index(f"{NO_MESH}:\n  a GPU job's terms"):]
    dp = next(line for line in block.splitlines() if line.strip().startswith("exposed dp"))
    assert "not measured" in dp and "no mesh names" in dp and "filed under 'unknown'" in dp
    assert not re.search(r"exposed dp\s+0\.00 ms", block)
    memory = next(line for line in block.splitlines() if "peak memory" in line)
    assert "not measured" in memory and "profile_memory" in memory
    # the healthy one beside it: the H100 trace measures its memory, and its dp (it has no
    # communication at all, nothing filed under unknown: a measured 0)
    h100 = r.output[r.output.index(f"{H100}:\n  a GPU job's terms"):]
    h100 = h100[:h100.index("\n\n")] if "\n\n" in h100 else h100
    for term in ("peak memory", "exposed dp"):
        line = next(line for line in h100.splitlines() if line.strip().startswith(term))
        assert "not measured" not in line, line


def test_plan_from_the_trace_names_the_factor_the_detail_measured(real_gpu_sets, qwen_json,
                                                                  uncalibrated):
    root, _ = real_gpu_sets
    trace = _trace(root)
    gemms = next(t for j in uncalibrated["job_vs_plan"] if j["run"] == H100 for t in j["rows"]
                 if t["term"].startswith("GEMMs"))
    p = _invoke("plan", "--model-json", qwen_json, "--world", 1, "--seq-len", 8944,
                "--global-batch", 1, "--layouts", "dp=1", "--micro-batch-size", 1,
                "--dp-modes", "ddp", "--recompute", "none", "--from", trace, "--json")
    assert p.exit_code == 0, p.output
    plan = json.loads(p.output[p.output.index("{"):])
    factor = float(re.search(r"every GEMM curve × ([0-9.]+)", " ".join(plan["notes"])).group(1))
    # the plan's GEMM rate × factor: its GEMM time ÷ factor — the detail's measured/planned
    assert gemms["ratio"] * factor == pytest.approx(1.0, abs=1e-3)
    assert abs(gemms["ratio"] - 1.0) > 0.05         # a gap the calibration has to close
    calibrated = _invoke("compare", root / H100 / "report", root / DDP / "report", "--detail",
                         "--json", *_job_args(qwen_json), "--from", trace)
    assert calibrated.exit_code == 0, calibrated.output
    doc = json.loads(calibrated.output[calibrated.output.index("{"):])
    after = next(t for j in doc["job_vs_plan"] if j["run"] == H100 for t in j["rows"]
                 if t["term"].startswith("GEMMs"))
    assert abs(after["ratio"] - 1.0) < abs(gemms["ratio"] - 1.0) / 4
    # the next plan is the calibrated one: compare --from plans the step plan --from does
    step = next(t for j in doc["job_vs_plan"] if j["run"] == H100 for t in j["rows"]
                if t["term"] == "step")
    assert step["planned"] == pytest.approx(plan["rows"][0]["estimate"]["step_time_us"])
    assert step["planned"] != pytest.approx(next(
        t for j in uncalibrated["job_vs_plan"] if j["run"] == H100 for t in j["rows"]
        if t["term"] == "step")["planned"])


def test_a_runner_samples_detail_is_unchanged(tmp_path):
    runs = []
    for name in ("dp4-ddp", "dp2-pp2-1f1b"):
        shutil.copytree(ROOT / "samples" / name, tmp_path / name)
        runs.append(tmp_path / name)
    r = _invoke("compare", *runs, "--detail", "--from", runs[0])
    assert r.exit_code == 0, r.output
    assert "measured / planned: step 201.2 / " in r.output
    assert "memory, planned against measured (MiB):" in r.output
    assert "a GPU job's terms" not in r.output and "not planned —" not in r.output


@pytest.mark.parametrize("args, flag", [
    (("--detail", "--from", "TRACE"), "--model-json"),
    (("--model-json", "MODEL", "--global-batch", "1"), "--layout"),
    (("--model-json", "MODEL", "--layout", "dp=1"), "--global-batch"),
    (("--model-json", "MODEL", "--layout", "dp=2", "--global-batch", "3"), "--global-batch"),
])
def test_a_gpu_job_the_traces_cannot_describe_needs_the_users_flags(real_gpu_sets, qwen_json,
                                                                     args, flag):
    root, _ = real_gpu_sets
    args = [{"TRACE": _trace(root), "MODEL": qwen_json}.get(a, a) for a in args]
    r = _invoke("compare", root / H100 / "report", root / DDP / "report", *args)
    assert r.exit_code == 2, r.output
    assert flag in r.output and "Traceback" not in r.output
