"""The planner's memory terms (``layouts/plan/memory.py``) term by term, against what is known by
construction (issue 52 item 1: the module had not been mutation-scored).

- Model states: the ZeRO paper's table (Rajbhandari et al., 2020, §5) for Ψ = 1,000 parameters
  on N_d = 4 ranks — which of the three terms each stage divides by N_d.
- The parameter count Ψ of a small Llama model is ``meshscope.theory.params``'s closed form
  (held to the planner's tensor list in ``test_plan.py``), so each state is Ψ × its bytes.
- Runtime buffers: DDP copies every gradient into its buckets (Ψ·g); FSDP2 under ``zero2``
  holds the gathered Ψ·p, under ``fsdp`` its two largest units (two layers here: the
  embedding and head group is smaller), and unsharded gradients (Ψ·g) with more than one
  microbatch; one data-parallel rank holds none.
- Activations: linear in the tokens (no s × s score matrix is kept), in the bytes of an
  element (fp32 4, mixed 2), plus the first stage's token ids at 8 bytes a token; a pipeline
  rank holds its schedule's microbatches in flight (1F1B: p − r; GPipe: every microbatch).
"""
from __future__ import annotations

import pytest

from meshscope.layouts.plan import Candidate, ModelSpec, memory, model_states
from meshscope.layouts.plan.memory import head_activation_elements, layer_activation_elements
from meshscope.parallel.layout import parse_layout
from meshscope.theory import params as theory_params

SPEC = ModelSpec(dim=64, n_layers=4, n_heads=8, ffn_hidden=160, vocab_size=300, seq_len=32)
PSI = theory_params.n_params(SPEC.shape)
LAYER = theory_params.layer_params(SPEC.shape, 0)


@pytest.mark.parametrize("stage,expected", [
    (0, (4000, 4000, 8000)), (1, (4000, 4000, 2000)), (2, (4000, 1000, 2000)),
    (3, (1000, 1000, 2000))])
def test_each_zero_stage_shards_its_own_terms(stage, expected):
    """fp32 AdamW: p = g = 4 bytes, K = 8; stage 1 shards the optimizer state, 2 the
    gradients too, 3 the parameters too."""
    s = model_states(1000, stage, 4, "fp32")
    assert (s.params_bytes, s.grads_bytes, s.optimizer_bytes) == pytest.approx(expected)
    assert s.total_bytes == pytest.approx(sum(expected))


def test_mixed_precision_states_and_an_unknown_stage():
    s = model_states(1000, 1, 4, "mixed")          # 2, 2, 12 / 4
    assert (s.params_bytes, s.grads_bytes, s.optimizer_bytes) == pytest.approx((2000, 2000,
                                                                                3000))
    for bad in (4, -1):
        with pytest.raises(ValueError, match="ZeRO stage must be 0-3"):
            model_states(1000, bad, 4, "fp32")


def _one(layout: str, dp_mode: str = "ddp", microbatches: int = 1, global_batch: int = 2,
         precision: str = "fp32", **kw):
    (est,) = memory(SPEC, Candidate(parse_layout(layout), dp_mode=dp_mode,
                                    microbatches=microbatches, global_batch=global_batch, **kw),
                    precision)
    return est


def test_ddp_holds_the_states_whole_and_a_bucket_copy_of_the_gradients():
    est = _one("dp=2")
    assert (est.params_bytes, est.grads_bytes, est.optimizer_bytes, est.buffers_bytes) == \
        pytest.approx((4 * PSI, 4 * PSI, 8 * PSI, 4 * PSI))
    assert est.terms == pytest.approx({"weights": 4 * PSI, "grads": 4 * PSI,
                                       "optimizer_state": 8 * PSI, "runtime_buffers": 4 * PSI,
                                       "activations": est.activations_bytes})
    assert est.total_bytes == pytest.approx(20 * PSI + est.activations_bytes)
    # one data-parallel rank: nothing to reduce, no buckets
    assert _one("dp=1", global_batch=1).buffers_bytes == 0
    # ZeRO-1: the optimizer state sharded, no buffers
    z1 = _one("dp=2", "zero1")
    assert (z1.params_bytes, z1.optimizer_bytes, z1.buffers_bytes) == \
        pytest.approx((4 * PSI, 4 * PSI, 0.0))


def test_fsdp2_buffers_the_gathered_parameters_and_accumulated_gradients():
    z2 = _one("dp=2", "zero2")
    # stored sharded as under fsdp, the whole Ψ·p gathered from forward to backward
    assert (z2.params_bytes, z2.grads_bytes, z2.optimizer_bytes, z2.buffers_bytes) == \
        pytest.approx((2 * PSI, 2 * PSI, 4 * PSI, 4 * PSI))
    fsdp = _one("dp=2", "fsdp")
    assert (fsdp.params_bytes, fsdp.grads_bytes, fsdp.optimizer_bytes) == \
        pytest.approx((2 * PSI, 2 * PSI, 4 * PSI))
    assert fsdp.buffers_bytes == pytest.approx(4 * 2 * LAYER)       # two layers gathered
    assert LAYER > SPEC.vocab_size * SPEC.dim * 2 + SPEC.dim       # the head group is smaller
    # two microbatches: unsharded gradients accumulate until the last one's reduce-scatter
    assert _one("dp=2", "zero2", microbatches=2, global_batch=4).buffers_bytes == \
        pytest.approx(4 * PSI + 4 * PSI)
    assert _one("dp=2", "fsdp", microbatches=2, global_batch=4).buffers_bytes == \
        pytest.approx(4 * 2 * LAYER + 4 * PSI)
    noreshard = _one("dp=2", "fsdp_noreshard")
    assert noreshard.buffers_bytes == pytest.approx(4 * PSI)
    assert noreshard.params_bytes == pytest.approx(2 * PSI)


def test_activations_are_linear_in_tokens_and_element_bytes():
    """One rank holds every layer, the head and the token ids: T tokens a microbatch cost
    E·T·b + 8·T bytes for some E per token, with b = 4 (fp32) or 2 (mixed)."""
    one = _one("dp=1", global_batch=1)                     # one sequence: 32 tokens
    two = _one("dp=1", global_batch=2)                     # two sequences a microbatch
    assert two.activations_bytes == pytest.approx(2 * one.activations_bytes)
    mixed = _one("dp=1", global_batch=1, precision="mixed")
    tokens = SPEC.seq_len
    # fp32 − 2 × mixed = 8T − 2 × 8T: the token ids are 8 bytes whatever the precision
    assert one.activations_bytes - 2 * mixed.activations_bytes == pytest.approx(-8 * tokens)
    per_token = (one.activations_bytes - 8 * tokens) / (4 * tokens)
    assert per_token == pytest.approx(
        sum(layer_activation_elements(SPEC, i, 1, False, 1) for i in range(4))
        + head_activation_elements(SPEC, 1, False))
    assert one.microbatches_in_flight == 1


def test_a_pipeline_rank_holds_its_schedules_microbatches_in_flight():
    """pp=2, four microbatches, two layers a stage: under 1F1B stage 0 holds p = 2 in flight,
    stage 1 one; under GPipe each all four. Stage 0 holds the token ids, stage 1 the head."""
    f1b = memory(SPEC, Candidate(parse_layout("pp=2"), schedule="1f1b", microbatches=4,
                                 global_batch=4))
    gpipe = memory(SPEC, Candidate(parse_layout("pp=2"), schedule="gpipe", microbatches=4,
                                   global_batch=4))
    assert [e.pp_rank for e in f1b] == [0, 1]
    assert [e.microbatches_in_flight for e in f1b] == [2, 1]
    assert [e.microbatches_in_flight for e in gpipe] == [4, 4]
    for a, b in zip(f1b, gpipe):
        assert a.activations_bytes / a.microbatches_in_flight == \
            pytest.approx(b.activations_bytes / 4)
    tokens = SPEC.seq_len                                   # one sequence a microbatch
    layers = 2 * layer_activation_elements(SPEC, 0, 1, True, 1)
    assert f1b[0].activations_bytes == pytest.approx(2 * (layers * tokens * 4 + 8 * tokens))
    assert f1b[1].activations_bytes == pytest.approx(
        1 * (layers + head_activation_elements(SPEC, 1, True)) * tokens * 4)
    # the printed term is every microbatch in flight, not one
    assert f1b[0].terms["activations"] == pytest.approx(2 * (layers * tokens * 4 + 8 * tokens))
    # the embedding on stage 0, the final norm and head on stage 1, the layers split evenly
    emb = SPEC.vocab_size * SPEC.dim
    assert f1b[0].params_bytes == pytest.approx(4 * (2 * LAYER + emb))
    assert f1b[1].params_bytes == pytest.approx(4 * (2 * LAYER + emb + SPEC.dim))


def test_sequence_parallelism_splits_the_norms_only_with_tensor_parallelism():
    """With tp = 1 there is nothing to split: sp changes no count; with tp = 2 it keeps the
    norms' own tensors at 1/t of the tokens, so a layer saves less than without it."""
    for i in range(2):
        assert layer_activation_elements(SPEC, i, 1, True, 1) == \
            layer_activation_elements(SPEC, i, 1, False, 1)
    assert head_activation_elements(SPEC, 1, True) == head_activation_elements(SPEC, 1, False)
    assert layer_activation_elements(SPEC, 0, 2, True, 1) < \
        layer_activation_elements(SPEC, 0, 2, False, 1) < \
        layer_activation_elements(SPEC, 0, 1, False, 1)
    assert head_activation_elements(SPEC, 2, True) < head_activation_elements(SPEC, 2, False)


# -- the activation count, tensor by tensor (the module docstring's list) ----------------------
#
# Each term is checked by what one more of something adds: a query head one logsumexp, a
# key/value element two (k after RoPE, v), an FFN unit four (w1·x, silu, w3·x and
# the product), a vocabulary entry two (logits and log-softmax) — and sequence parallelism keeps
# each norm's two h-wide tensors at 1/t of the tokens. (The bytes against measured traces are
# ``tests/test_sweep.py``'s, a slow suite.)

def _spec(**kw) -> ModelSpec:
    return ModelSpec(**{"dim": 64, "n_layers": 2, "n_heads": 8, "ffn_hidden": 160,
                        "vocab_size": 300, "seq_len": 32, **kw})


def _layer(spec, tp=1, sp=False, ep=1, i=0):
    return layer_activation_elements(spec, i, tp, sp, ep)


def test_one_more_of_each_dense_tensor_adds_its_elements():
    # 16 heads instead of 8 at the same width (and key/value width): 8 more logsumexps
    assert _layer(_spec(n_heads=16)) - _layer(_spec()) == 8
    # grouped-query attention: 2 key/value heads of 8 dims instead of 8 — 48 fewer elements
    # of k and v each, kept twice (k after RoPE, v)
    assert _layer(_spec()) - _layer(_spec(n_kv_heads=2)) == 2 * 48
    assert _layer(_spec(ffn_hidden=170)) - _layer(_spec()) == 4 * 10
    # with tp = 2 the attention and FFN tensors are split: half as many more per step
    assert _layer(_spec(ffn_hidden=170), tp=2) - _layer(_spec(), tp=2) == 2 * 10
    assert head_activation_elements(_spec(vocab_size=400), 1, False) - \
        head_activation_elements(_spec(), 1, False) == 2 * 100
    # with tp the local logits shard before the all-gather too: V/t more
    assert head_activation_elements(_spec(vocab_size=400), 2, False) - \
        head_activation_elements(_spec(), 2, False) == 2 * 100 + 100 / 2


@pytest.mark.parametrize("dim,heads,ffn", [(64, 8, 160), (128, 8, 160), (64, 16, 96)])
def test_a_dense_layer_holds_what_autograd_saves(dim, heads, ffn):
    """The absolute count, against torch rather than against the list above: one block of the
    runner's own model (``parallel/model.py``) run forward, every tensor autograd saves for
    backward collected by ``saved_tensors_hooks``, counted once per storage (q, k and v views
    of one linear output, say), less the parameters and the RoPE tables (not per token). What
    the planner charges a token of a layer is that, to the element."""
    torch = pytest.importorskip("torch")
    from meshscope.parallel.config import ModelConfig
    from meshscope.parallel.model import Block, rope_tables

    batch, seq = 2, 32
    cfg = ModelConfig(dim=dim, n_heads=heads, ffn_hidden=ffn, seq_len=seq, n_layers=1)
    block = Block(cfg, 0)
    cos, sin = rope_tables(cfg)
    not_activations = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    saved: dict[int, int] = {}

    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in not_activations:
            saved[storage.data_ptr()] = storage.nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = block(torch.randn(batch, seq, dim, requires_grad=True), cos, sin)
    per_token = sum(saved.values()) / (batch * seq)
    spec = ModelSpec(dim=dim, n_layers=1, n_heads=heads, ffn_hidden=ffn, vocab_size=300,
                     seq_len=seq)
    assert per_token == layer_activation_elements(spec, 0, 1, False, 1)
    assert out.grad_fn is not None                     # the graph (and its saved tensors) lived


def test_sequence_parallelism_keeps_each_norms_two_wide_tensors_at_one_tth():
    """At t = 2 each norm keeps its input and normalised copy for half the tokens: h fewer
    elements a norm, two norms a layer, one on the head."""
    h = 64
    assert _layer(_spec(), tp=2) - _layer(_spec(), tp=2, sp=True) == 2 * h
    assert _layer(_spec(), tp=4) - _layer(_spec(), tp=4, sp=True) == 2 * (2 * h - 2 * h / 4)
    assert head_activation_elements(_spec(), 2, False) - \
        head_activation_elements(_spec(), 2, True) == h


def test_an_moe_layers_tokens_go_through_k_experts():
    """One more expert adds the router's two probabilities a token; one more of the top-k a
    copy of the token through an expert (4·f_e + 3h) and, with ep > 1, its two all-to-all
    buffers (2h)."""
    moe = {"moe_experts": 4, "moe_top_k": 2, "moe_hidden": 96}
    base = _layer(_spec(**moe))
    assert _layer(_spec(**{**moe, "moe_experts": 5})) - base == 2
    assert _layer(_spec(**{**moe, "moe_top_k": 3})) - base == 4 * 96 + 3 * 64
    assert _layer(_spec(**moe), ep=2) - base == 2 * 2 * 64
    assert _layer(_spec(**{**moe, "moe_top_k": 3}), ep=2) - _layer(_spec(**moe), ep=2) == \
        4 * 96 + 3 * 64 + 2 * 64


def test_experts_are_split_over_ep_and_not_sharded_by_zero():
    """dp=4 with ep=2 under FSDP: the dense weights sharded over the 4 data-parallel ranks, the
    experts split over ep (half of them on each rank), their states whole (ZeRO leaves them
    out)."""
    spec = _spec(moe_experts=4, moe_top_k=2, moe_hidden=96)
    experts = sum(p.numel for i in range(2) for p in spec.layer_params(i)
                  if p.name.startswith("expert"))
    dense = theory_params.n_params(spec.shape) - experts
    assert experts == 2 * 3 * 4 * 64 * 96                  # two layers of 4 SwiGLU experts
    (est,) = memory(spec, Candidate(parse_layout("dp=4,ep=2"), dp_mode="fsdp", microbatches=1,
                                    global_batch=4))
    assert est.params_bytes == pytest.approx(4 * dense / 4 + 4 * experts / 2)
    assert est.grads_bytes == pytest.approx(4 * dense / 4 + 4 * experts / 2)
    assert est.optimizer_bytes == pytest.approx(8 * dense / 4 + 8 * experts / 2)
    # the terms the table prints: the same bytes, the experts added to the dense shards
    assert est.terms["weights"] == pytest.approx(4 * dense / 4 + 4 * experts / 2)
    assert est.terms["grads"] == pytest.approx(4 * dense / 4 + 4 * experts / 2)
    assert est.terms["optimizer_state"] == pytest.approx(8 * dense / 4 + 8 * experts / 2)


def test_another_frameworks_training_is_its_published_bookkeeping():
    from meshscope.layouts.plan.job_memory import job_memory
    from meshscope.layouts.plan.training import Training

    cand = Candidate(parse_layout("dp=2"), dp_mode="ddp", microbatches=1, global_batch=2)
    runner = memory(SPEC, cand, "fp32")
    assert memory(SPEC, cand, "fp32", Training(framework="runner")) == runner
    megatron = Training(framework="megatron", precision="mixed")
    assert memory(SPEC, cand, "fp32", megatron) == job_memory(SPEC, cand, megatron)
    assert memory(SPEC, cand, "fp32", megatron) != runner


def test_fp8_gemms_keep_a_transposed_fp8_copy_of_each_weight():
    """Megatron with Transformer Engine, fp8 GEMMs: a 16-bit weight is cast to fp8 and
    transposed for the backward (2 bytes a parameter of the fp8 linears); fp8 weights
    (``fp8_params``, TE's Float8Tensor) need no cast but still keep the transpose
    (``update_usage(columnwise_usage=True)`` creates ``_transpose``): 1 byte. The fp8 linears
    of this model are each layer's q, k, v, o (4·h² — as many key/value heads as heads) and
    its SwiGLU's three (3·h·f); a bf16 job keeps neither copy."""
    from meshscope.layouts.plan.training import Training
    h, f, layers = SPEC.dim, SPEC.ffn_hidden, SPEC.n_layers
    fp8_linear = layers * (4 * h * h + 3 * h * f)
    cand = Candidate(parse_layout("dp=2"), microbatches=1, dp_mode="zero1", global_batch=2)

    def terms(**kw):
        t = Training(framework="megatron", **kw)
        return memory(SPEC, cand, training=t)[0].terms

    cast = terms(precision="fp8")
    assert cast["fp8_weight_copies"] == pytest.approx(2 * fp8_linear)
    assert "fp8_weight_transposes" not in cast
    held = terms(precision="fp8", fp8_params=True)
    assert held["fp8_weight_transposes"] == pytest.approx(fp8_linear)
    assert "fp8_weight_copies" not in held
    plain = terms(precision="mixed")
    assert "fp8_weight_copies" not in plain and "fp8_weight_transposes" not in plain
