"""The planner's GPU job model against published figures — each test names its source. The
expected values are the publications' own numbers (or their published formulas evaluated by
hand in the comment), never the planner's output."""
import dataclasses
import math
import sys

import pytest

from conftest import ROOT
from meshscope.layouts.plan import Candidate, ModelSpec, memory, transfers
from meshscope.layouts.plan.activations import layer_activation_bytes
from meshscope.layouts.plan.job_compute import TRAINING_DERATE
from meshscope.layouts.plan.job_step import predict_job, required_derate
from meshscope.layouts.plan.states import gather_buffer_bytes, model_states_by_term
from meshscope.layouts.plan.topology import Topology
from meshscope.layouts.plan.training import Training
from meshscope.parallel.layout import parse_layout

sys.path.insert(0, str(ROOT))
from bench.plan_references import jobs as references  # noqa: E402

GIB = 2 ** 30
MIB = 2 ** 20
MIXED_TORCH = Training(framework="torch", precision="mixed")
DEEPSPEED = Training(framework="deepspeed", precision="mixed")


# -- ZeRO paper ---------------------------------------------------------------------------------

@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, expected_gb):
    """Rajbhandari et al. 2020, Fig. 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12):
    120 / 31.4 / 16.6 / 1.9 GB per device for baseline, P_os, P_os+g, P_os+g+p."""
    states = model_states_by_term(7.5e9, stage, 64, MIXED_TORCH)
    assert states.total_gpu_bytes / 1e9 == pytest.approx(expected_gb, abs=0.05)


# -- DeepSpeed's documented estimator outputs ------------------------------------------------------

@pytest.mark.parametrize("offload,expected_gib", [("none", 15.93), ("optimizer", 5.31)])
def test_deepspeed_zero2_estimate(offload, expected_gib):
    """DeepSpeed docs/code-docs/source/memory.rst: estimate_zero2_model_states_mem_needs_all_cold
    (total_params=2851e6, num_gpus_per_node=8, num_nodes=1) prints 15.93GB per GPU with
    offload_optimizer=none and 5.31GB with offload_optimizer=cpu (GB = 2**30 bytes)."""
    t = dataclasses.replace(DEEPSPEED, offload=offload)
    states = model_states_by_term(2851e6, 2, 8, t)
    assert states.total_gpu_bytes / GIB == pytest.approx(expected_gib, abs=0.01)


@pytest.mark.parametrize("offload,expected_gib", [("none", 6.09), ("optimizer", 0.78),
                                                  ("all", 0.12)])
def test_deepspeed_zero3_estimate(offload, expected_gib):
    """DeepSpeed memory.rst: estimate_zero3_model_states_mem_needs_all_cold(total_params=2851e6,
    largest_layer_params=32e6, num_gpus_per_node=8, num_nodes=1): 6.09GB per GPU without
    offload, 0.78GB with offload_optimizer=cpu, 0.12GB with offload_param=cpu too."""
    t = dataclasses.replace(DEEPSPEED, offload=offload)
    states = model_states_by_term(2851e6, 3, 8, t)
    total = states.total_gpu_bytes + gather_buffer_bytes(32e6, 3, t)
    assert total / GIB == pytest.approx(expected_gib, abs=0.01)


@pytest.mark.parametrize("gpus,offload,expected_gib", [(1, "none", 46.91), (1, "optimizer", 5.43),
                                                       (1, "all", 0.25), (2, "none", 23.58),
                                                       (2, "optimizer", 2.84)])
def test_deepspeed_zero3_t0_3b(gpus, offload, expected_gib):
    """Hugging Face Transformers' DeepSpeed guide: estimate_zero3_model_states_mem_needs_all_live
    for bigscience/T0_3B ("2783M total params, 65M largest layer params") prints 46.91 / 5.43 /
    0.25 GB per GPU on one GPU and 23.58 / 2.84 GB on two. The printed counts are cut to the
    million (65M may be up to 65.99M), hence 1% or 0.01 GB."""
    t = dataclasses.replace(DEEPSPEED, offload=offload)
    total = model_states_by_term(2783e6, 3, gpus, t).total_gpu_bytes \
        + gather_buffer_bytes(65e6, 3, t)
    assert total / GIB == pytest.approx(expected_gib, rel=0.01, abs=0.01)


# -- the Ultra-Scale Playbook ---------------------------------------------------------------------

@pytest.mark.parametrize("billions,no_fp32_acc_gb,fp32_acc_gb", [(1, 16, 20), (7, 112, 140),
                                                                (70, 1120, 1400),
                                                                (405, 6480, 8100)])
def test_playbook_model_state_table(billions, no_fp32_acc_gb, fp32_acc_gb):
    """Ultra-Scale Playbook, "Memory usage in Transformers": model states of 1B / 7B / 70B /
    405B models are 16 / 112 / 1120 / 6480 GB in bf16 mixed precision without fp32 gradient
    accumulation and 20 / 140 / 1400 / 8100 GB with it."""
    n = billions * 1e9
    without = model_states_by_term(n, 0, 1, MIXED_TORCH).total_gpu_bytes
    with_acc = model_states_by_term(n, 0, 1, dataclasses.replace(MIXED_TORCH, fp32_grads=True))
    assert without / 1e9 == pytest.approx(no_fp32_acc_gb)
    assert with_acc.total_gpu_bytes / 1e9 == pytest.approx(fp32_acc_gb)


LLAMA31_8B = ModelSpec(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
                       vocab_size=128256, seq_len=1024, name="llama-3.1-8b")
LLAMA31_70B = ModelSpec(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672,
                        vocab_size=128256, seq_len=8192, name="llama-3.1-70b")


@pytest.mark.parametrize("seq,act_gib", [(1024, 4.25), (4096, 17.0), (16384, 68.0)])
def test_playbook_llama_8b_memory_figure(seq, act_gib):
    """Ultra-Scale Playbook, memory figure for Llama 3.1 8B (fragments/pp_memoryusage.html,
    one GPU): model parameters 14.957 GiB, gradients 14.957 GiB, optimizer states 59.828 GiB
    (bf16 weights and gradients, fp32 Adam moments), and activations 4.25 / 17 / 68 GiB at
    sequence 1024 / 4096 / 16384 — the Playbook's count is Korthikanti's 34·s·b·h per layer
    (no s² term: selective recomputation or flash attention)."""
    spec = dataclasses.replace(LLAMA31_8B, seq_len=seq)
    assert spec.n_params() == 8_030_261_248
    t = Training(framework="torch", precision="bf16", block="gpt", recompute="selective")
    states = model_states_by_term(spec.n_params(), 0, 1, t)
    # the figure's values are rounded to 1/1024 GiB
    assert states.kind_bytes("params") / GIB == pytest.approx(14.957, rel=1e-3)
    assert states.kind_bytes("grads") / GIB == pytest.approx(14.957, rel=1e-3)
    assert states.kind_bytes("optimizer") / GIB == pytest.approx(59.828, rel=1e-3)
    acts = spec.n_layers * layer_activation_bytes(
        dataclasses.replace(spec, ffn_hidden=4 * spec.dim), 0, tokens=seq, tp=1, sp=False,
        t=t, s_local=seq)
    assert acts / GIB == pytest.approx(act_gib, rel=0.001)


def test_playbook_llama_70b_parameters():
    """Ultra-Scale Playbook, tp_sp_memoryusage figure for Llama 3.1 70B without parallelism:
    model parameters 131.5 GiB (bf16)."""
    assert LLAMA31_70B.n_params() == 70_553_706_496
    t = Training(framework="torch", precision="bf16")
    params = model_states_by_term(LLAMA31_70B.n_params(), 0, 1, t).kind_bytes("params")
    assert params / GIB == pytest.approx(131.5, rel=0.001)


# -- Megatron-LM theoretical_memory_usage ---------------------------------------------------------

def test_megatron_theoretical_memory_70b():
    """Megatron-LM megatron/training/theoretical_memory_usage.py for this configuration:
    Llama-3-70B (--hidden-size 8192 --num-layers 80 --num-attention-heads 64
    --group-query-attention --num-query-groups 8 --ffn-hidden-size 28672 --swiglu
    --normalization RMSNorm --untie-embeddings-and-output-weights, padded vocab 128256),
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 (256 GPUs, dp 8)
    --use-distributed-optimizer --sequence-parallel --recompute-granularity selective
    --seq-length 8192 --micro-batch-size 1. Its formulas, evaluated by hand:

    - parameters: layer = 2·h·(1.5·f + 1) + 2h²·(1 + 8/64) = 855,654,400; block = 80 layers
      + final norm = 68,452,360,192; embeddings 2·h·V = 2,101,346,304; total 70,553,706,496;
    - most loaded shard = (block/pp + h·V)/tp = 2,270,470,400 parameters × (6 + 12/dp = 7.5
      bytes) → weight and optimizer = 16,239.67 MB;
    - activation = [s·b·h·(18 + 4f/h) · L + 8·s·b·pp + s·b·h·pp] / tp = 20,512.03 MB (first
      pipeline stage, pp microbatches in flight);
    - total = 36,751.70 MB.

    Weights and optimizer must agree to 0.1%. The activations to 5%: Megatron's formula keeps
    the GPT MLP's 4f/h where SwiGLU's fused gate/up output and down-projection input are 6f/h
    (the function's own TODO says it ignores the block's real projections)."""
    spec = dataclasses.replace(LLAMA31_70B, seq_len=8192)
    cand = Candidate(parse_layout("dp=8,tp=8,pp=4"), schedule="1f1b", microbatches=32,
                     dp_mode="zero1", sp=True, global_batch=256)
    t = Training(framework="megatron", precision="mixed", recompute="selective")
    first = memory(spec, cand, training=t)[0]
    assert first.model_states_bytes / MIB == pytest.approx(16239.67, rel=0.001)
    assert first.activations_bytes / MIB == pytest.approx(20512.03, rel=0.05)
    assert (first.model_states_bytes + first.activations_bytes) / MIB == \
        pytest.approx(36751.70, rel=0.05)


# -- Korthikanti et al. 2022 ----------------------------------------------------------------------

# Table 3 of Korthikanti et al. (GPT, s = 2048, V = 51200, t = 8): (name, a, h)
KORTHIKANTI = [("22B", 64, 6144), ("175B", 96, 12288), ("530B", 128, 20480),
               ("1T", 160, 25600)]


def _korthikanti_table2(setting, a, h, s=2048, b=1, t=8):
    """Table 2's per-layer activation bytes (the paper's formulas)."""
    sbh = s * b * h
    return {"none-t1": sbh * (34 + 5 * a * s / h),
            "tp": sbh * (10 + 24 / t + 5 * a * s / (h * t)),
            "tp+sp": sbh / t * (34 + 5 * a * s / h),
            "tp+selective": sbh * (10 + 24 / t),
            "tp+sp+selective": sbh * 34 / t,
            "full": 2 * sbh}[setting]


@pytest.mark.parametrize("name,a,h", KORTHIKANTI)
@pytest.mark.parametrize("setting", ["none-t1", "tp", "tp+sp", "tp+selective",
                                     "tp+sp+selective", "full"])
def test_korthikanti_activation_per_layer(name, a, h, setting):
    """Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", Table 2 (activation bytes per layer for each parallelism and recomputation
    setting) evaluated for the GPT configurations of its Table 3, within 5% (e.g. 175B at
    t = 8: 579 MB without SP, 107 MB with SP and selective recomputation)."""
    spec = ModelSpec(dim=h, n_layers=1, n_heads=a, ffn_hidden=4 * h, vocab_size=51200,
                     seq_len=2048)
    tp = 1 if setting == "none-t1" else 8
    sp = "sp" in setting
    recompute = "selective" if "selective" in setting else ("full" if setting == "full"
                                                            else "none")
    t = Training(framework="megatron", precision="mixed", block="gpt",
                 flash_attention=False, recompute=recompute)
    ours = layer_activation_bytes(spec, 0, tokens=2048, tp=tp, sp=sp, t=t, s_local=2048)
    assert ours == pytest.approx(_korthikanti_table2(setting, a, h), rel=0.05)


# -- Megatron-LM's README throughput table (Narayanan et al. 2021, Table 1) -----------------------

# Its rows are the first ten of bench/plan_references/jobs.csv (megatron-*, with the settings
# the paper describes in §5.1 — fp16 mixed precision, full recomputation, the interleaved
# schedule with scatter/gather — and the micro-batch size, schedule and DDP of its own script,
# examples/sc21/run_table_1.sh (16 sequences a microbatch, 8 at 18.4B, 4 at 39.1B, 2 at 76.1B
# and 145.6B; torch DDP's overlapped all-reduce up to 18.4B; 1F1B at 39.1B and 1008B, which
# the script runs without virtual stages); no sequence parallelism). All ten are the rows
# TRAINING_DERATE is fitted on. The table's parameter counts, in billions, as published:
MEGATRON_BILLIONS = {"1.7b": 1.7, "3.6b": 3.6, "7.5b": 7.5, "18.4b": 18.4, "39.1b": 39.1,
                     "76.1b": 76.1, "145.6b": 145.6, "310.1b": 310.1, "529.6b": 529.6,
                     "1008b": 1008.0}
MEGATRON_ROWS = [r for r in references.load() if r.source == "megatron-readme"]


def test_megatron_table_parameter_counts():
    """The table's parameter counts (P = 12lh²(1 + 13/12h + (V+s)/12lh), eq. 2) against the
    planner's count of the same GPT (a plain GeLU MLP, biases, LayerNorm, learned positions,
    tied head), to the table's 0.1B — and the eq. 2 count itself."""
    assert len(MEGATRON_ROWS) == 10
    for row in MEGATRON_ROWS:
        spec = references.spec_of(row)
        published = MEGATRON_BILLIONS[row.id.removeprefix("megatron-")]
        eq2 = spec.n_layers * (12 * spec.dim ** 2 + 13 * spec.dim) \
            + (spec.vocab_size + spec.seq_len) * spec.dim
        assert eq2 / 1e9 == pytest.approx(published, abs=0.06)
        assert spec.n_params() / 1e9 == pytest.approx(published, abs=0.06)


def test_training_derate_is_the_fit_on_the_named_rows():
    """TRAINING_DERATE is what fitting the catalogue-device rows jobs.csv marks ``fit`` gives
    (the geometric mean of the derate each row needs) — the ten rows of Megatron-LM's
    Table 1."""
    fit = [r for r in references.load() if r.fit and not r.device.startswith("file:")]
    assert sorted(r.id for r in fit) == sorted(r.id for r in MEGATRON_ROWS)
    logs = []
    for r in fit:
        spec, cand, t, dev, topo, opts = references.job(r)
        pub = references.published_tokens_per_s(r, spec, dev) * cand.layout.world_size
        logs.append(math.log(required_derate(spec, cand, t, dev, topo, opts, pub)))
    assert math.exp(sum(logs) / len(logs)) == pytest.approx(TRAINING_DERATE, rel=2e-3)


@pytest.mark.parametrize("row", MEGATRON_ROWS, ids=[r.id for r in MEGATRON_ROWS])
def test_megatron_table_throughput_within_15_percent(row):
    """Megatron-LM README (Narayanan et al. 2021, Table 1): achieved TFLOP/s per GPU (eq. 3,
    recomputation counted) of each row, predicted within 15% with the one constant fitted on
    the ten of them (their spread: each needs 0.815-0.911)."""
    spec, cand, t, dev, topo, opts = references.job(row)
    est = predict_job(spec, cand, t, dev, topo, opts)
    assert est.hw_tflops_per_gpu == pytest.approx(row.value, rel=0.15)
    pub = references.published_tokens_per_s(row, spec, dev)
    assert est.tokens_per_s / cand.layout.world_size == pytest.approx(pub, rel=0.15)


# -- traffic and topology (by construction) -------------------------------------------------------

def test_zero1_is_one_reduce_scatter_and_all_gather_per_step():
    """The distributed optimizer (ZeRO-1) reduce-scatters the gradients and all-gathers the
    weights once per step whatever the microbatches (Megatron-LM's DistributedOptimizer), not
    once per microbatch as ZeRO-2/3 gather."""
    spec = dataclasses.replace(LLAMA31_70B, seq_len=4096)
    t = Training(framework="megatron", precision="mixed")
    for m in (1, 8):
        cand = Candidate(parse_layout("dp=8,tp=8,pp=4"), dp_mode="zero1", microbatches=m,
                         global_batch=8 * m)
        dp = [x for x in transfers(spec, cand, training=t) if x.dim == "dp" and x.pp_rank == 0]
        assert sorted(x.op for x in dp) == ["all_gather", "reduce_scatter"]
        assert all(x.count == 1 for x in dp)
        # the fp32 gradients (4 bytes) and bf16 weights (2 bytes) of the stage's shard of tp
        rs = next(x for x in dp if x.op == "reduce_scatter")
        ag = next(x for x in dp if x.op == "all_gather")
        assert rs.msg_bytes == pytest.approx(2 * ag.msg_bytes)
        assert rs.wire_bytes == pytest.approx(rs.msg_bytes * 7 / 8)   # (n−1)/n


def test_link_level_follows_the_rank_order():
    """tp innermost: a tp group of 8 sits in one 8-GPU node (NVLink), dp and pp groups span
    nodes (the network); with 4 GPUs a node tp=8 spans two."""
    cand = Candidate(parse_layout("dp=4,tp=8,pp=2"))
    topo = Topology.for_device("H100", 8)
    assert topo.level_of(cand, "tp") == "intra"
    assert topo.level_of(cand, "dp") == "inter" and topo.level_of(cand, "pp") == "inter"
    assert Topology.for_device("H100", 4).level_of(cand, "tp") == "inter"
    assert topo.intra.busbw_gbps > topo.inter.busbw_gbps


# -- MoE: shared experts and dense first layers ---------------------------------------------------

# Qwen/Qwen1.5-MoE-A2.7B's config.json (Hugging Face), the fields the planner reads.
QWEN_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
            "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
            "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
            "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
            "max_position_embeddings": 8192, "decoder_sparse_step": 1,
            "tie_word_embeddings": False}


def test_qwen_moe_parameters_with_a_shared_expert():
    """Qwen1.5-MoE-A2.7B's model card: 14.3B parameters in total, 2.7B activated (60 routed
    experts, top-4, and a shared expert of width 5632 in every layer). The planner leaves out
    the q/k/v biases and the shared expert's gate (about 0.2M), hence 1%."""
    spec = ModelSpec.from_dict(QWEN_MOE)
    assert spec.moe_shared_hidden == 5632
    assert spec.n_params() / 1e9 == pytest.approx(14.3, rel=0.01)
    assert spec.active_params() / 1e9 == pytest.approx(2.7, rel=0.01)


def test_dense_first_layers_and_deepseek_shared_experts():
    """DeepSeek's config names: first_k_dense_replace layers keep a dense MLP;
    n_shared_experts × moe_intermediate_size is the shared experts' width."""
    spec = ModelSpec.from_dict({**QWEN_MOE, "first_k_dense_replace": 1,
                                "shared_expert_intermediate_size": None,
                                "n_shared_experts": 2})
    assert spec.moe_shared_hidden == 2 * 1408
    assert not spec.is_moe_layer(0) and spec.is_moe_layer(1)
    names0 = {p.name for p in spec.layer_params(0)}
    assert "w1" in names0 and not any(n.startswith("expert") for n in names0)


@pytest.mark.parametrize("p,v", [(4, 5), (8, 3), (16, 2)])
def test_interleaved_activations_in_flight_match_megatron(p, v):
    """Megatron-LM theoretical_memory_usage.py, compute_activation_memory: with the interleaved
    schedule the first stage holds p · (1 + (p − 1)/(p · v)) microbatches' worth of its layers'
    activations (the "interleaved schedule memory penalty"). The first rank's activations with
    v stages a rank, over those of the plain 1F1B (p microbatches), are that penalty."""
    spec = ModelSpec(dim=4096, n_layers=p * v * 2, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
                     vocab_size=128256, seq_len=4096)
    t = Training(framework="megatron", precision="mixed", recompute="selective")
    layout = parse_layout(f"dp=2,tp=8,pp={p}")

    def first_layers_bytes(schedule, virtual):
        cand = Candidate(layout, schedule=schedule, microbatches=8 * p, global_batch=16 * p,
                         virtual=virtual)
        per = layer_activation_bytes(spec, 0, tokens=4096, tp=8, sp=True, t=t, s_local=4096)
        layers = sum(len(cand.stage_layers(spec.n_layers)[s]) for s in cand.stages_of(0))
        est = memory(spec, cand, training=t)[0]
        return est.microbatches_in_flight * layers * per

    penalty = 1 + (p - 1) / (p * v)
    assert first_layers_bytes("interleaved-1f1b", v) / first_layers_bytes("1f1b", None) == \
        pytest.approx(penalty)
