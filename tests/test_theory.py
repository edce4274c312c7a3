"""meshscope.theory's closed forms on inputs whose answer is known by construction: schedule
diagrams counted by hand, nccl-tests' published bus factors, parameter counts of real torch
models, and FLOPs from torch's own counter on a real forward and backward."""
import math

import pytest

from meshscope.theory import bus_factors as bf
from meshscope.theory import flops, params, schedules
from meshscope.theory.params import DecoderShape


# -- schedules -------------------------------------------------------------------------------
# 1F1B, p = 2 ranks, m = 2 microbatches, every F and B one slot. Drawn by hand (rank 0 warms
# up with p − 1 − r = 1 forward, then alternates):
#   rank 0: F0 F1 .  B0 .  B1
#   rank 1: .  F0 B0 F1 B1 .
# 6 slots = 2(m + p − 1), 2m = 4 of them busy on each rank: the bubble is 2/6 = 1/3.
#
# ZB1P (zero-bubble, one stage a rank), p = 2, m = 2, forward F, input gradient I and weight
# gradient W one slot each (a backward split in two). Drawn by hand, each action as soon as
# its input is there (rank 1's I after its own F, rank 0's I after rank 1's):
#   rank 0: F0 F1 .  I0 W0 I1 W1
#   rank 1: .  F0 I0 F1 I1 W0 W1
# 7 slots, 3m = 6 busy on each rank: one idle forward slot, the bubble is 1/7 (not 0; a
# 1F1B of the same work would idle 3 of 9 slots). ZB-V and DualPipeV are held to torch's own
# orders in tests/test_schedules_against_torch.py.
@pytest.mark.parametrize("schedule,p,m,v,fraction", [
    ("1f1b", 2, 2, 1, 1 / 3),
    ("gpipe", 2, 2, 1, 1 / 3),
    ("1f1b", 4, 8, 1, 3 / 11),      # 3 idle slots of 11 on every rank
    ("gpipe", 4, 1, 1, 3 / 4),      # one microbatch: each rank works 1 slot of 4
    ("interleaved-1f1b", 4, 4, 2, 3 / 11),   # slots v times shorter: (p−1)/(v·m+p−1)
    ("looped-bfs", 2, 3, 3, 1 / 10),
    ("zero-bubble", 2, 2, 1, 1 / 7),
    ("1f1b", 1, 8, 1, 0.0), (None, 1, 8, 1, 0.0),  # no pipeline, no bubble
])
def test_bubble_fraction_counted_by_hand(schedule, p, m, v, fraction):
    assert schedules.bubble_fraction(schedule, p, m, v) == pytest.approx(fraction)


def test_bubble_shrinks_with_microbatches_and_virtual_stages():
    gpipe = [schedules.bubble_fraction("gpipe", 4, m) for m in (1, 2, 4, 8, 16)]
    assert gpipe == sorted(gpipe, reverse=True) and len(set(gpipe)) == 5
    inter = [schedules.bubble_fraction("interleaved-1f1b", 4, 8, v) for v in (1, 2, 4)]
    assert inter[0] == schedules.bubble_fraction("1f1b", 4, 8)   # v = 1 is plain 1F1B
    assert inter == sorted(inter, reverse=True) and len(set(inter)) == 3
    # the zero-bubble schedules' bubble is smaller than interleaving's, but not 0
    zb = [schedules.bubble_fraction(s, 4, 8, 2) for s in ("zero-bubble", "zbv", "dualpipev")]
    assert all(0 < b < inter[1] for b in zb)


def test_idle_microbatches_is_the_bubble_in_microbatches():
    # the step is m busy microbatches plus the idle ones: 1F1B p = 4 idles 3 (3/11 at m = 8)
    assert schedules.idle_microbatches("1f1b", 4, 8) == 3
    assert schedules.idle_microbatches("interleaved-1f1b", 4, 8, 2) == pytest.approx(1.5)
    assert schedules.idle_microbatches("1f1b", 1, 8) == 0


def test_unknown_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown schedule 'chimera'"):
        schedules.bubble_fraction("chimera", 4, 8)


def test_stage_placement():
    assert schedules.stages_of_rank(1, 4, 2, "loop") == [1, 5]
    assert schedules.stages_of_rank(0, 4, 3, "loop") == [0, 4, 8]
    assert schedules.stages_of_rank(1, 4, 2, "v") == [1, 6]
    # every placement holds each of the p·v stages exactly once
    for name, spec in schedules.SCHEDULES.items():
        v = spec.fixed_virtual or 3
        held = sorted(s for r in range(4) for s in schedules.stages_of_rank(r, 4, v,
                                                                            spec.placement))
        assert held == list(range(4 * v)), name


def test_activations_in_flight():
    # 1F1B on 4 ranks: rank r runs p − r warm-up forwards before its first backward.
    assert [schedules.in_flight("1f1b", 4, 8, 1, r) for r in range(4)] == [4, 3, 2, 1]
    assert [schedules.in_flight("1f1b", 4, 2, 1, r) for r in range(4)] == [2, 2, 2, 1]
    assert schedules.in_flight("gpipe", 4, 8, 1, 3) == 8       # every forward first
    assert schedules.in_flight("1f1b", 1, 8, 1, 0) == 1


# -- bus factors -------------------------------------------------------------------------------
@pytest.mark.parametrize("op,n,factor", [
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n−1)/n, allgather / reducescatter /
    # alltoall (n−1)/n, broadcast / reduce / sendrecv 1.
    ("all_reduce", 8, 1.75), ("all_reduce", 2, 1.0), ("all_reduce", 1, 0.0),
    ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75), ("all_to_all", 16, 15 / 16),
    ("gather", 2, 0.5), ("scatter", 4, 0.75),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("send", 2, 1.0), ("recv", 2, 1.0),
    ("send_recv", 8, 1.0),
])
def test_nccl_tests_bus_factors(op, n, factor):
    assert bf.bus_factor(op, n) == pytest.approx(factor)


def test_every_op_has_one_factor_class():
    classes = [{bf.ALL_REDUCE}, set(bf.N_MINUS_1_OVER_N), set(bf.FACTOR_ONE)]
    assert set().union(*classes) == set(bf.OPS)
    assert sum(len(c) for c in classes) == len(bf.OPS)


def test_bus_factor_refuses_what_it_cannot_define():
    with pytest.raises(ValueError, match="unknown collective 'barrier'"):
        bf.bus_factor("barrier", 4)
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):   # not canonical
        bf.bus_factor("allreduce", 4)
    with pytest.raises(ValueError, match="group size must be at least 1, got 0"):
        bf.bus_factor("all_reduce", 0)


def test_bandwidth_units():
    assert bf.algbw_gbps(1e9, 1e6) == pytest.approx(1.0)            # 1 GB in 1 s
    assert bf.busbw_gbps("all_reduce", 1e9, 1e6, 8) == pytest.approx(1.75)
    assert bf.busbw_gbps("send_recv", 2e9, 1e6, 2) == pytest.approx(2.0)
    assert math.isnan(bf.algbw_gbps(1, 0)) and math.isnan(bf.busbw_gbps("all_reduce", 1, 0, 4))


# -- parameters and FLOPs ---------------------------------------------------------------------
SMALL = DecoderShape(dim=4, n_layers=1, ffn_hidden=6, seq_len=3, vocab_size=10, n_heads=2)


def test_parameter_count_of_a_model_drawn_by_hand():
    # wq, wk, wv, wo 4×4 = 64; w1, w2, w3 4×6 = 72; two norms 8: a layer of 144;
    # embedding 10×4 = 40, head 40, final norm 4.
    assert params.layer_params(SMALL, 0) == 144
    assert params.n_params(SMALL) == 144 + 40 + 40 + 4
    tied = DecoderShape(**{**SMALL.__dict__, "tied_embeddings": True})
    assert params.n_params(tied) == 144 + 40 + 4
    # GQA, 1 key/value head of width 2: wk and wv become 2×4 (8 each instead of 16).
    gqa = DecoderShape(**{**SMALL.__dict__, "n_kv_heads": 1})
    assert params.attention_params(gqa) == 16 + 8 + 8 + 16


def test_moe_counts_all_experts_but_activates_top_k():
    moe = DecoderShape(**{**SMALL.__dict__, "moe_experts": 4, "moe_top_k": 1,
                          "moe_hidden": 6})
    # router 4×4 = 16, and 4 experts of 72 each; a token passes through the router and one.
    assert params.ffn_params(moe, 0) == 16 + 4 * 72
    assert params.ffn_params(moe, 0, active=True) == 16 + 72
    assert params.n_params(moe, active=True) == params.n_params(SMALL) + 16
    # one MoE layer in two (moe_every = 2) and a first dense layer (moe_first_dense = 2)
    every = DecoderShape(**{**moe.__dict__, "n_layers": 4, "moe_every": 2,
                            "moe_first_dense": 2})
    assert [every.is_moe_layer(i) for i in range(4)] == [False, False, False, True]


def test_training_flops_of_a_model_drawn_by_hand():
    # 6 × (228 − 40 embedding) + 12 · 1 · 4 · 3 attention.
    assert flops.training_flops_per_token(SMALL) == 6 * 188 + 144
    # GQA: 16 fewer weights a token meets; MoE top-1: 16 more (the router).
    gqa = DecoderShape(**{**SMALL.__dict__, "n_kv_heads": 1})
    moe = DecoderShape(**{**SMALL.__dict__, "moe_experts": 4, "moe_top_k": 1,
                          "moe_hidden": 6})
    assert flops.training_flops_per_token(gqa) == flops.training_flops_per_token(SMALL) - 6 * 16
    assert flops.training_flops_per_token(moe) == flops.training_flops_per_token(SMALL) + 6 * 16
    assert flops.layer_training_flops_per_token(SMALL, 0) == \
        3 * flops.layer_forward_flops_per_token(SMALL, 0)


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_counts_agree_with_a_real_torch_model(preset):
    """The runner's model as torch builds it: its parameters counted by torch, and the FLOPs
    of one real forward and backward counted by torch's ``FlopCounterMode`` — which counts
    the matmuls (6 per weight a token meets, top-k experts only for MoE, no embedding lookup)
    but not the norms (elementwise) and, depending on the build, not CPU SDPA's kernel."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from meshscope.parallel.config import PRESETS
    from meshscope.parallel.model import build_model

    cfg = PRESETS[preset]
    shape = cfg.shape
    model = build_model(cfg, 0)
    assert sum(p.numel() for p in model.parameters()) == params.n_params(shape)
    batch = 2
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    with FlopCounterMode(display=False) as counter:
        model(tokens).float().sum().backward()
    per_token = counter.get_total_flops() / (batch * cfg.seq_len)
    norms = 2 * cfg.dim * cfg.n_layers + cfg.dim
    attention_core = 12 * cfg.n_layers * cfg.dim * cfg.seq_len
    weights_only = flops.training_flops_per_token(shape) - 6 * norms - attention_core
    assert per_token - weights_only in (0, attention_core)
