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
