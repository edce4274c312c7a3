"""The planner without running anything: memory against published figures, traffic and bubbles
against hand-made cases whose answer is known by construction, and `meshscope plan` as a user
runs it. The planner's bytes against measured traces are in tests/test_sweep.py."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, meshscope
from meshscope.analysis.pipeline.bubble import theory_fraction as analysis_theory
from meshscope.layouts.plan import (Candidate, ModelSpec, SpecError, memory, model_states,
                                    theory_fraction, transfers)
from meshscope.layouts.plan.comm_model import CommModel
from meshscope.layouts.plan.traffic import ddp_buckets
from meshscope.parallel.config import PRESETS
from meshscope.parallel.layout import parse_layout
from meshscope.theory import params as theory_params
from meshscope.theory.schedules import in_flight
from pipeline_replay import replayed_bubble

# meta-llama/Llama-2-7b-hf's config.json (Hugging Face), the fields the planner reads.
LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
             "vocab_size": 32000, "max_position_embeddings": 4096,
             "tie_word_embeddings": False}


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_model_states_match_the_zero_paper(stage, expected_gb):
    """Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
    Models", Fig. 1: Ψ = 7.5B parameters, N_d = 64 data-parallel ranks, mixed-precision Adam
    (K = 12) — 120 GB per device for baseline data parallelism, 31.4 GB with P_os, 16.6 GB
    with P_os+g and 1.9 GB with P_os+g+p."""
    states = model_states(7.5e9, stage, 64, "mixed")
    assert states.total_bytes / 1e9 == pytest.approx(expected_gb, abs=0.05)


def test_llama2_7b_zero1_on_8_ranks(tmp_path):
    """Llama-2-7B from its Hugging Face config.json: 6,738,415,616 parameters (the count the
    Llama 2 release reports as 6.7B / "7B"); under ZeRO-1 on 8 data-parallel ranks with
    mixed-precision Adam the ZeRO paper's P_os formula (§5.1: 2Ψ + 2Ψ + KΨ/N_d) gives
    5.5 × Ψ bytes = 37.1 GB of model states per rank; one sequence of 4096 tokens per rank
    adds activations, and ZeRO-1 no buffers beyond DDP's."""
    path = tmp_path / "llama-2-7b.json"
    path.write_text(json.dumps(LLAMA2_7B))
    spec = ModelSpec.from_json(path)
    assert spec.n_params() == 6_738_415_616
    cand = Candidate(parse_layout("dp=8"), dp_mode="zero1", microbatches=1, global_batch=8)
    (est,) = memory(spec, cand, "mixed")
    assert est.model_states_bytes / 1e9 == pytest.approx(37.06, abs=0.01)
    assert est.params_bytes == pytest.approx(2 * spec.n_params())
    assert est.grads_bytes == pytest.approx(2 * spec.n_params())
    assert est.optimizer_bytes == pytest.approx(12 * spec.n_params() / 8)
    # Activations of a 7B model for one 4k sequence: tens of GB (no recomputation), ordered
    # above a layer's weights and below the whole model's states.
    assert 4 * spec.dim * spec.ffn_hidden < est.activations_bytes < est.model_states_bytes


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_model_spec_agrees_with_the_runner(name):
    """One definition of parameters and FLOPs per token: the planner's spec of each preset
    gives the runner's own counts (parallel/config.py)."""
    cfg = PRESETS[name]
    spec = ModelSpec.from_config(cfg)
    assert spec.n_params() == cfg.n_params()
    assert spec.flops_per_token() == cfg.flops_per_token()


@pytest.mark.parametrize("extra", [
    {}, {"n_kv_heads": 2}, {"tied_embeddings": True},
    {"moe_experts": 8, "moe_top_k": 2, "moe_hidden": 96},
    {"moe_experts": 4, "moe_top_k": 1, "moe_every": 2, "moe_first_dense": 1,
     "moe_shared_hidden": 48, "n_kv_heads": 1},
])
def test_weight_list_totals_the_closed_form(extra):
    """The planner's tensor-by-tensor weight list (``layer_params``, ``stage_params``: what
    memory and traffic are summed from) holds exactly the parameters that
    ``meshscope.theory.params`` counts in closed form — GQA, MoE, shared experts, tied
    embeddings alike."""
    spec = ModelSpec(dim=64, n_layers=4, n_heads=8, ffn_hidden=160, vocab_size=300,
                     seq_len=32, **extra)
    tensors = [p for g in spec.stage_params(list(range(4)), first=True, last=True) for p in g]
    assert sum(p.numel for p in tensors) == theory_params.n_params(spec.shape)
    per_layer = [sum(p.numel for p in spec.layer_params(i)) for i in range(4)]
    assert per_layer == [theory_params.layer_params(spec.shape, i) for i in range(4)]


def test_spec_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**LLAMA2_7B, "num_key_value_heads": 5}))
    with pytest.raises(SpecError, match="n_kv_heads"):
        ModelSpec.from_json(bad)
    missing = {k: v for k, v in LLAMA2_7B.items() if k != "intermediate_size"}
    bad.write_text(json.dumps(missing))
    with pytest.raises(SpecError, match="ffn_hidden.*intermediate_size"):
        ModelSpec.from_json(bad)


def _torch_order(schedule: str, p: int, m: int, v: int) -> dict:
    """The action order torch.distributed.pipelining gives each of ``p`` ranks, read without
    starting processes: ScheduleInterleaved1F1B's own per-rank calculation (the order its
    runtime executes; with one stage per rank it is 1F1B), ScheduleGPipe's pipeline order.
    (Schedule1F1B's ``_get_pipeline_order`` is not used: in torch 2.13 it gives the last rank
    F1 before F0 and a microbatch m that does not exist — its executor does not read it.)"""
    from torch.distributed.pipelining import schedules as ts

    if schedule == "gpipe":
        s = ts.ScheduleGPipe.__new__(ts.ScheduleGPipe)
        s._num_stages, s._n_microbatches = p, m
        return s._get_pipeline_order()
    s = ts.ScheduleInterleaved1F1B.__new__(ts.ScheduleInterleaved1F1B)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = p, v, m
    s.number_of_rounds = max(1, m // p)                 # as its __init__ sets them
    s.microbatches_per_round = m // s.number_of_rounds
    return {rank: s._calculate_single_rank_operations(rank) for rank in range(p)}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_bubble_closed_form_agrees_with_torchs_own_schedules(schedule):
    """The planner's and the analysis' closed forms of the bubble against torch's own pipeline
    schedules (an independent reference): torch's action order for 2–4 stages replayed with a
    backward twice a forward, each rank's chunk 1/v of its stage's work."""
    for p in (2, 3, 4):
        for m in (p, 2 * p, 3 * p):
            for v in ((2, 3) if schedule == "interleaved-1f1b" else (1,)):
                # a backward twice a forward: its input and weight halves each a forward
                torch_says = replayed_bubble(_torch_order(schedule, p, m, v), p * v,
                                             1 / v, 1 / v, 1 / v)
                assert torch_says > 0
                assert theory_fraction(schedule, p, m, v) == pytest.approx(torch_says), \
                    (schedule, p, m, v)
                assert analysis_theory(schedule, p, m, v) == pytest.approx(torch_says), \
                    (schedule, p, m, v)


def test_bubble_closed_form_values():
    """Narayanan et al. 2021: (p−1)/(m+p−1) for 1F1B, (p−1)/(v·m+p−1) interleaved."""
    assert theory_fraction("1f1b", 4, 4) == pytest.approx(3 / 7)
    assert theory_fraction("gpipe", 2, 8) == pytest.approx(1 / 9)
    assert theory_fraction("interleaved-1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert theory_fraction("1f1b", 1, 4) == 0.0
    # activations held: 1F1B's first stage holds p microbatches, its last one; GPipe all m
    assert in_flight("1f1b", 4, 8, 1, 0) == 4 and in_flight("1f1b", 4, 8, 1, 3) == 1
    assert in_flight("gpipe", 4, 8, 1, 3) == 8


def test_ddp_buckets_close_at_their_caps():
    """DDP's rule: the first bucket closes once it holds ≥ 1 MiB, the others at ≥ 25 MiB."""
    mib = 1 << 20
    assert ddp_buckets([mib // 2] * 3) == [mib, mib // 2]
    assert ddp_buckets([10 * mib] * 6) == [10 * mib, 30 * mib, 20 * mib]
    assert ddp_buckets([100]) == [100]


def test_fsdp_pads_every_weight_to_the_shard_count():
    """A one-layer model whose FFN width 6 is not divisible by 4 shards: FSDP2 pads w1/w3's
    first dimension 6 → 8 (and w2's first dimension, the hidden size 8, needs none)."""
    spec = ModelSpec(dim=8, n_layers=1, n_heads=2, ffn_hidden=6, vocab_size=16, seq_len=8)
    cand = Candidate(parse_layout("dp=4"), dp_mode="fsdp", microbatches=1, global_batch=4)
    layer = next(t for t in transfers(spec, cand) if t.op == "all_gather" and "layer" in t.what)
    # attention_norm 8, wq/wk/wv/wo 4·64, ffn_norm 8, w1 and w3 (6→8 rows)·8, w2 8·6
    padded = 8 + 4 * 64 + 8 + 2 * 8 * 8 + 8 * 6
    assert layer.msg_bytes == padded * 4
    assert layer.count == 2      # ZeRO-3: gathered for forward and again for backward


def test_traffic_scales_as_the_runner_issues_it():
    """Relations of the tiny model's traffic that hold by construction: twice the microbatches
    double tp's and pp's operations but not DDP's once-per-step all-reduce; the V schedule moves
    no activation between the two stages its middle rank holds."""
    spec = ModelSpec.from_config(PRESETS["tiny"])

    def count(layout, dim, **kw):
        return sum(t.count for t in transfers(spec, Candidate(parse_layout(layout), **kw))
                   if t.dim == dim)

    assert count("dp=2,tp=2", "tp", microbatches=8) == 2 * count("dp=2,tp=2", "tp",
                                                                  microbatches=4) - 9
    assert count("dp=2,tp=2", "dp", microbatches=8) == count("dp=2,tp=2", "dp", microbatches=4)
    assert count("dp=2,pp=2", "pp", microbatches=8) == 2 * count("dp=2,pp=2", "pp",
                                                                  microbatches=4)
    # 4 stages on 2 ranks: every boundary is a send and a receive each way per microbatch (4
    # ops × 4 microbatches); interleaved placement crosses ranks at all 3, the V at 2
    assert count("pp=2", "pp", schedule="interleaved-1f1b") == 3 * 4 * 4
    assert count("pp=2", "pp", schedule="zbv") == 2 * 4 * 4


def test_comm_model_interpolates_between_measured_sizes():
    table = CommModel.from_rows([
        {"op": "all_reduce", "n_ranks": 4, "size_bytes": 1000, "time_us": 100},
        {"op": "all_reduce", "n_ranks": 4, "size_bytes": 4000, "time_us": 400},
        # two nearly equal sizes are one point (their medians), not a steep slope
        {"op": "all_reduce", "n_ranks": 4, "size_bytes": 4100, "time_us": 400},
        {"op": "all_reduce", "n_ranks": 4, "size_bytes": 4010, "time_us": 9000},
    ], alpha_us=10)
    assert table.time_us("all_reduce", 4, 2000) == pytest.approx(200, rel=0.01)
    assert table.time_us("all_reduce", 4, 8020) == pytest.approx(800, rel=0.01)
    assert table.time_us("all_reduce", 4, 500) == pytest.approx(50, rel=0.01)  # extended
    assert table.time_us("all_reduce", 4, 10) == pytest.approx(10)        # the latency floor
    # a group of 2 moves less per rank: busbw stays, f(all_reduce) falls from 1.5 to 1
    assert table.time_us("all_reduce", 2, 2000) == pytest.approx(200 / 1.5, rel=0.01)


def test_plan_command_for_a_7b_model(tmp_path):
    """`meshscope plan` of a Hugging Face config on 8 GPUs: every layout listed, ZeRO-1's
    states as above (the ZeRO paper's accounting: ``--framework torch``), and no torch
    imported."""
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(LLAMA2_7B))
    proc = meshscope("plan", "--model-json", path, "--world", 8, "--dp-modes", "ddp,zero1",
                     "--microbatches", 4, "--recompute", "none",   # nothing searched
                     "--precision", "mixed", "--framework", "torch", "--global-batch", 64,
                     "--seq-len", 2048,
                     "--device", "H100", "--device-memory-gb", 80, "--json", check=True)
    plan = json.loads(proc.stdout)
    names = [r["name"] for r in plan["rows"]]
    assert "dp8-zero1-mb4" in names and "dp8-mb4" in names and "tp8-mb4" in names
    z1 = next(r for r in plan["rows"] if r["name"] == "dp8-zero1-mb4")
    assert sum(z1["memory"][0][k] for k in ("params_bytes", "grads_bytes",
                                            "optimizer_bytes")) / 1e9 == pytest.approx(37.06,
                                                                                      abs=0.01)
    ddp = next(r for r in plan["rows"] if r["name"] == "dp8-mb4")
    assert ddp["fits"] is False and z1["peak_memory_bytes"] < ddp["peak_memory_bytes"]
    assert all(r["estimate"]["step_time_us"] > 0 for r in plan["rows"])
    code = ("import runpy, sys; sys.argv = ['meshscope', 'plan', '--world', '4'];"
            "\ntry:\n    runpy.run_module('meshscope', run_name='__main__')\n"
            "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_plan_command_refuses_bad_input_in_one_line(tmp_path):
    bad = tmp_path / "model.json"
    bad.write_text("{not json")
    proc = meshscope("plan", "--model-json", bad, "--world", 4)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and str(bad) in proc.stderr
    proc = meshscope("plan", "--world", 4, "--layouts", "dp=3")
    assert proc.returncode == 2 and "needs 3 ranks" in proc.stderr
