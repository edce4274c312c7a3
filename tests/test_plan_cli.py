"""`meshscope plan` for a GPU job as a user runs it: the options of issue 25, every term in
--json, calibration that transfers or refuses, and one-line refusals (exit 2). The numbers
checked here hold by construction (the published comparisons are in test_plan_published.py)."""
import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, meshscope

# meta-llama/Meta-Llama-3-70B's config.json (Hugging Face), the fields the planner reads.
LLAMA3_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
              "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
              "vocab_size": 128256, "max_position_embeddings": 8192,
              "tie_word_embeddings": False}
# mistralai/Mixtral-8x7B-v0.1's config.json
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "vocab_size": 32000, "max_position_embeddings": 32768, "num_local_experts": 8,
           "num_experts_per_tok": 2, "tie_word_embeddings": False}


@pytest.fixture
def llama70b(tmp_path):
    path = tmp_path / "llama-3-70b.json"
    path.write_text(json.dumps(LLAMA3_70B))
    return path


def plan_json(*args):
    return json.loads(meshscope("plan", *args, "--json", check=True).stdout)


def test_70b_plan_has_every_term(llama70b):
    """A 70B job on 256 H100s: memory per term, bytes per dimension as buffers and on the
    wire, each dimension's link level, and every step-time term."""
    p = plan_json("--model-json", llama70b, "--world", 256, "--seq-len", 8192,
                  "--global-batch", 512, "--layouts", "dp=8,tp=8,pp=4", "--dp-modes", "zero1",
                  "--schedules", "interleaved-1f1b", "--virtual-stages", 5, "--microbatches",
                  64, "--recompute", "selective", "--device", "H100", "--gpus-per-node", 8)
    assert p["training"]["framework"] == "megatron" and p["training"]["recompute"] == \
        "selective"
    (row,) = p["rows"]
    assert row["candidate"]["virtual_stages"] == 5
    mem = row["memory"][0]
    for term in ("weights_16bit", "main_grads_fp32", "master_weights_fp32", "adam_state_fp32",
                 "activations"):
        assert mem["terms"][term] > 0
    # the distributed optimizer shards master weights and moments 8 ways, not the fp32 grads
    assert mem["terms"]["master_weights_fp32"] == pytest.approx(
        mem["terms"]["main_grads_fp32"] / 8)
    assert row["link_level"] == {"dp": "inter", "tp": "intra", "pp": "inter"}
    for dim in ("dp", "tp", "pp"):
        assert 0 < row["wire_bytes"][dim] <= row["comm_bytes"][dim] * 2
    terms = row["estimate"]["terms"]
    for t in ("gemm_us", "memory_bound_us", "exposed_tp_us", "exposed_pp_us", "exposed_dp_us",
              "bubble_us", "optimizer_us", "gemm_efficiency"):
        assert t in terms
    est = row["estimate"]
    assert 0 < est["mfu_pct"] < 100 and est["hw_tflops_per_gpu"] > 0
    # a dense job's throughput is a point: no range
    assert p["throughput_range"] is None and "tokens_per_s_per_gpu_range" not in row


def test_stage_layers_and_recompute_change_memory(llama70b):
    """--stage-layers moves layers between stages (the first stage's activations fall with
    fewer layers); full recomputation keeps less than selective."""
    common = ("--model-json", llama70b, "--world", 64, "--seq-len", 4096, "--global-batch", 64,
              "--layouts", "dp=4,tp=8,pp=2", "--microbatches", 16)
    even = plan_json(*common)["rows"][0]["memory"]
    lopsided = plan_json(*common, "--stage-layers", "30,50")["rows"][0]["memory"]
    assert lopsided[0]["activations_bytes"] < even[0]["activations_bytes"]
    assert lopsided[1]["params_bytes"] > even[1]["params_bytes"]
    full = plan_json(*common, "--recompute", "full")["rows"][0]["memory"]
    assert full[0]["activations_bytes"] < even[0]["activations_bytes"] / 5


def test_precisions_optimizers_and_offload(llama70b):
    """bf16-only drops the master copy; SGD keeps half Adam's moments, bf16 moments half the
    fp32 ones; offloading the optimizer moves master weights, fp32 gradients and moments to the
    host."""
    common = ("--model-json", llama70b, "--world", 64, "--seq-len", 4096, "--global-batch", 64,
              "--layouts", "dp=8,tp=8", "--microbatches", 8, "--framework", "deepspeed",
              "--dp-modes", "zero2")

    def first(*extra):
        return plan_json(*common, *extra)["rows"][0]["memory"][0]

    mixed, bf16 = first(), first("--precision", "bf16")
    assert "master_weights_fp32" in mixed["terms"] and "master_weights_fp32" not in bf16["terms"]
    sgd = first("--optimizer", "sgd")
    assert sgd["terms"]["sgd_state_fp32"] == pytest.approx(mixed["terms"]["adam_state_fp32"] / 2)
    off = first("--offload", "optimizer")
    assert off["optimizer_bytes"] == 0 and off["cpu_bytes"] > 0
    fp8 = first("--precision", "fp8")
    assert fp8["activations_bytes"] < mixed["activations_bytes"]
    # fp8 GEMMs cast 16-bit weights (Transformer Engine's and torchao's default); the weights
    # themselves are fp8 only with --fp8-params
    assert fp8["terms"]["weights_16bit"] == pytest.approx(mixed["terms"]["weights_16bit"])
    fp8_params = first("--precision", "fp8", "--fp8-params")
    assert fp8_params["terms"]["weights_fp8"] == pytest.approx(
        mixed["terms"]["weights_16bit"] / 2)
    bf16_states = first("--optimizer-states", "bf16")
    assert bf16_states["terms"]["adam_state_bf16"] == pytest.approx(
        mixed["terms"]["adam_state_fp32"] / 2)


def test_moe_with_tensor_and_expert_parallelism(tmp_path):
    """Mixtral on 64 GPUs with tp and ep together (which the runner cannot launch): experts
    split over tp × ep, their ZeRO state over dp·cp/ep."""
    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(MIXTRAL))
    p = plan_json("--model-json", path, "--world", 64, "--seq-len", 4096, "--global-batch",
                  256, "--layouts", "dp=16,tp=4,ep=8;dp=64,ep=8", "--dp-modes", "zero1",
                  "--microbatches", 4)
    rows = {r["name"]: r for r in p["rows"]}
    tp4, ep_only = rows["dp16-tp4-ep8-zero1-mb4"], rows["dp64-ep8-zero1-mb4"]
    w = "weights_16bit (experts)"
    assert tp4["memory"][0]["terms"][w] == pytest.approx(ep_only["memory"][0]["terms"][w] / 4)
    # expert master weights sharded over dp·cp/ep: 2 ranks with dp16, 8 with dp64
    m = "master_weights_fp32 (experts)"
    assert tp4["memory"][0]["terms"][m] == pytest.approx(
        ep_only["memory"][0]["terms"][m] / 4 * 8 / 2)
    assert "ep" in tp4["wire_bytes"] and "ep_replica" in tp4["wire_bytes"]


def test_a_moe_plan_prints_its_throughput_as_a_range_with_the_reason(tmp_path):
    """Without a trace a MoE job's throughput is a range around the predicted point, with
    the reason: in --json and in the text table (tok/s/GPU as low–high and the line saying
    what the range is); a dense job's stays a point (test_70b_plan_has_every_term)."""
    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(MIXTRAL))
    args = ("--model-json", path, "--world", 64, "--seq-len", 4096, "--global-batch", 256,
            "--layouts", "dp=64,ep=8", "--dp-modes", "zero1", "--microbatches", 4,
            "--device", "H100")
    p = plan_json(*args)
    rng = p["throughput_range"]
    assert rng["low_factor"] < 1 < rng["high_factor"] and "host" in rng["reason"]
    (row,) = p["rows"]
    low, high = row["tokens_per_s_per_gpu_range"]
    assert low < row["estimate"]["tokens_per_s"] / 64 < high
    out = meshscope("plan", *args, check=True).stdout
    row = next(line for line in out.splitlines() if "dp64-ep8-zero1-mb4" in line)
    assert re.search(r" \d[\d,]*–\d[\d,]* ", row)      # low–high, not a point
    assert "tok/s/GPU is a range for this MoE job" in out and "kernel launches" in out


def test_from_a_run_with_another_model_plans_that_model(llama70b, tmp_path):
    """`plan --from RUN --model-json BIG.json` plans BIG (not the run's tiny model), with the
    run's calibrated terms and a note saying so."""
    p = plan_json("--from", ROOT / "samples" / "dp4-ddp", "--model-json", llama70b,
                  "--world", 64, "--layouts", "dp=8,tp=8", "--global-batch", 64,
                  "--seq-len", 4096)
    assert p["n_params"] == 70_553_706_496
    assert any("applied to llama-3-70b" in n for n in p["notes"])
    assert p["rates"]["source"].startswith("calibrated from")


def test_a_cpu_run_cannot_calibrate_a_gpu_job(llama70b):
    proc = meshscope("plan", "--from", ROOT / "samples" / "dp4-ddp", "--framework", "megatron",
                     "--model-json", llama70b, "--world", 64)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "ran on cpu" in proc.stderr


def test_gpu_run_calibrates_the_gemm_curve(llama70b, tmp_path):
    """A GPU run (here the sample's run.json relabelled as an H100 run) scales the GEMM curve
    through its measured rate, and the plan names the run it came from."""
    run = tmp_path / "gpu-run"
    shutil.copytree(ROOT / "samples" / "dp4-ddp", run)
    info = json.loads((run / "run.json").read_text())
    info["device"] = {**info["device"], "type": "cuda", "name": "NVIDIA H100 80GB HBM3"}
    (run / "run.json").write_text(json.dumps(info))
    p = plan_json("--from", run, "--framework", "megatron", "--model-json", llama70b,
                  "--world", 64, "--layouts", "dp=8,tp=8", "--global-batch", 64,
                  "--seq-len", 4096, "--device", "H100")
    assert any("calibrated from" in n and "gpu-run" in n for n in p["notes"])
    assert any("ms a step of overhead measured in gpu-run" in n for n in p["notes"])
    # its 4 ranks fit in a node: its measured collectives time the in-node level
    assert any(n.startswith("in a node: the collectives measured in") for n in p["notes"])
    assert p["rows"][0]["estimate"]["terms"]["gemm_efficiency"] < 0.05   # a CPU's rate


@pytest.mark.parametrize("args,message", [
    (("--world", 4, "--recompute", "full"), "--framework megatron"),
    (("--world", 4, "--gpus-per-node", 8), "describes a GPU job"),
    (("--world", 4, "--eager-kernels"), "--fused-kernels/--eager-kernels describes a GPU"),
    (("--world", 64, "--framework", "megatron", "--devices", 4), "--devices is the runner's"),
    (("--world", 64, "--framework", "megatron", "--tflops", 400), "needs --device"),
    (("--world", 64, "--framework", "megatron", "--layouts", "dp=32,pp=2", "--global-batch",
      128, "--stage-layers", "40,41"), "the model has 80"),
    (("--world", 64, "--framework", "megatron", "--layouts", "dp=64", "--global-batch", 256,
      "--offload", "all"), "needs --dp-modes fsdp"),
])
def test_refusals_are_one_line(llama70b, args, message):
    extra = () if "--world" in args and args[1] == 4 else ("--model-json", llama70b)
    proc = meshscope("plan", *extra, *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr


def test_gpu_plan_imports_no_torch(llama70b):
    code = ("import runpy, sys; sys.argv = ['meshscope', 'plan', '--model-json', "
            f"{str(llama70b)!r}, '--world', '64', '--device', 'H100', '--layouts', "
            "'dp=8,tp=8', '--global-batch', '64'];"
            "\ntry:\n    runpy.run_module('meshscope', run_name='__main__')\n"
            "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
