"""Model shapes from a Hugging Face config.json: parameter counts against the counts the models'
publishers give, every field of the file honoured or refused, and the shapes the older
planner got wrong (GPT-3's two-matrix MLP, head_dim, a JSON without a sequence length).

The config.json files are the public ones, in bench/plan_references/models/ (the reference
jobs read the same files)."""
import json

import pytest

from conftest import ROOT, meshscope
from meshscope.layouts.plan import ModelSpec, SpecError
from meshscope.theory import flops, params

MODELS = ROOT / "bench" / "plan_references" / "models"


def spec(name: str, **kw) -> ModelSpec:
    return ModelSpec.from_json(MODELS / f"{name}.json", **kw)


# (model, published total, published active or None, relative tolerance, where published)
PUBLISHED = [
    ("gpt3-175b", 175.0e9, None, 0.005,
     "Brown et al. 2020, Table 2.1: 175.0B (GPT-2's config.json fields, the paper's sizes)"),
    ("llama-3-8b", 8.0e9, None, 0.01, "Meta Llama 3 model card: 8B"),
    ("llama-3-70b", 70.0e9, None, 0.01, "Meta Llama 3 model card: 70B"),
    ("llama-3.1-405b", 405.0e9, None, 0.005, "Llama 3 paper, Table 3: 405B"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.005,
     "Mistral AI, Mixtral of experts (2023): 46.7B total, 12.9B per token"),
    ("qwen3-8b", 8.2e9, None, 0.005, "Qwen3-8B model card: 8.2B (6.95B non-embedding)"),
    ("deepseek-v3", 671e9, 37e9, 0.02,
     "DeepSeek-V3 technical report, abstract: 671B total, 37B activated per token"),
]


@pytest.mark.parametrize("name,total,active,rel,source", PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_against_the_publishers(name, total, active, rel, source):
    s = spec(name)
    assert s.n_params() == pytest.approx(total, rel=rel), source
    if active:
        assert s.active_params() == pytest.approx(active, rel=rel), source


def test_config_json_reads_each_shape():
    """What each config.json says, read into the spec (the values as the files give them)."""
    gpt3 = spec("gpt3-175b")
    assert (gpt3.gated_mlp, gpt3.ffn_hidden, gpt3.position_embeddings, gpt3.tied_embeddings,
            gpt3.norm_bias, gpt3.qkv_bias) == (False, 4 * 12288, 2048, True, True, True)
    l8 = spec("llama-3-8b")
    assert (l8.gated_mlp, l8.kv_heads, l8.kv_dim, l8.tied_embeddings) == (True, 8, 1024, False)
    l405 = spec("llama-3.1-405b")
    assert (l405.dim, l405.n_layers, l405.kv_heads, l405.ffn_hidden) == (16384, 126, 8, 53248)
    mix = spec("mixtral-8x7b")
    assert (mix.moe_experts, mix.moe_top_k, mix.expert_hidden) == (8, 2, 14336)
    q3 = spec("qwen3-8b")
    assert (q3.head_width, q3.qk_norm, q3.sliding_layers) == (128, True, ())
    # Qwen3-8B's non-embedding count, as its card gives it: 6.95B
    assert (q3.n_params() - 2 * q3.vocab_size * q3.dim) / 1e9 == pytest.approx(6.95, abs=0.01)
    ds = spec("deepseek-v3")
    assert (ds.mla, ds.q_lora_rank, ds.kv_lora_rank, ds.head_width, ds.v_head_dim) == \
        (True, 1536, 512, 192, 128)
    assert (ds.moe_experts, ds.moe_top_k, ds.moe_first_dense, ds.moe_shared_hidden,
            ds.mtp_layers) == (256, 8, 3, 2048, 1)
    assert not ds.is_moe_layer(2) and ds.is_moe_layer(3)
    # its group-limited router: experts from 4 of 8 groups (n_group, topk_group)
    assert (ds.moe_groups, ds.moe_group_limit) == (8, 4)
    # the checkpoint's 685B = the main model + the MTP module (its layer, norms and projection)
    # + its own copies of the embedding and head (DeepSeek-V3's README: "685B ... 14B of MTP")
    assert (ds.n_params() + ds.mtp_params() + 2 * ds.vocab_size * ds.dim) / 1e9 == \
        pytest.approx(685, abs=1)


def test_gpt_oss_sliding_window_layers_and_biases():
    """GPT-OSS alternates sliding-window (128 tokens) and full attention (layer_types) and has
    attention and expert biases; its card's 116.8B total and 5.1B active (embedding excluded:
    the 6N rule's lookup)."""
    s = spec("gpt-oss-120b", seq_len=4096)
    assert s.sliding_layers == tuple(range(0, 36, 2)) and s.sliding_window == 128
    assert s.n_params() / 1e9 == pytest.approx(116.8, abs=0.1)
    assert (s.active_params() - s.vocab_size * s.dim) / 1e9 == pytest.approx(5.1, abs=0.05)
    full = flops.attention_core_forward_flops_per_token(s.shape, 1)
    window = flops.attention_core_forward_flops_per_token(s.shape, 0)
    assert window * 4096 == full * 128       # a window layer attends to 128 tokens, not 4096


def test_gpt_block_has_a_two_matrix_mlp():
    """Issue 34: `--block gpt` counted a SwiGLU MLP — GPT-3 175B planned as 233.2B. A plain
    GeLU MLP of width f is two h × f matrices: 12h² a layer with attention."""
    shape = params.DecoderShape(dim=12288, n_layers=1, ffn_hidden=4 * 12288, seq_len=2048,
                                gated_mlp=False)
    assert params.layer_params(shape, 0) == 12 * 12288 ** 2 + 2 * 12288


def test_head_dim_is_honoured(tmp_path):
    """Issue 34: head_dim in a model JSON was ignored — 32 heads × 128 on a 2048 hidden counted
    as 2.89B instead of 3.34B. Here the attention is 2048 × 4096 (q, o) and 2048 × 1024 × 2 (k,
    v with 8 key/value heads), counted as such."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"dim": 2048, "n_layers": 2, "n_heads": 32, "n_kv_heads": 8,
                                "head_dim": 128, "ffn_hidden": 8192, "vocab_size": 1000,
                                "seq_len": 1024}))
    s = ModelSpec.from_json(path)
    assert params.attention_params(s.shape) == 2 * 2048 * 4096 + 2 * 2048 * 1024
    tensors = [p for g in s.stage_params([0, 1], first=True, last=True) for p in g]
    assert sum(p.numel for p in tensors) == s.n_params()


def test_a_field_the_planner_cannot_honour_is_refused(tmp_path):
    """A key that is neither read nor known to leave the cost unchanged stops the plan with one
    line naming it (exit 2); so does an unknown model_type and an encoder."""
    base = json.loads((MODELS / "llama-3-8b.json").read_text())
    path = tmp_path / "m.json"
    for data, message in (({**base, "attn_logit_softcapping": 50.0},
                           "field attn_logit_softcapping"),
                          ({**base, "model_type": "gemma2"}, "field model_type: 'gemma2'"),
                          ({**base, "is_encoder_decoder": True}, "field is_encoder_decoder"),
                          ({**base, "mlp_only_layers": [3, 7]}, "field mlp_only_layers")):
        path.write_text(json.dumps(data))
        with pytest.raises(SpecError, match=message):
            ModelSpec.from_json(path)
        proc = meshscope("plan", "--model-json", path, "--world", 8)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1
        assert message in proc.stderr
    # the same config without the extra key plans
    path.write_text(json.dumps(base))
    assert ModelSpec.from_json(path).n_params() == 8_030_261_248


def test_a_json_without_sequence_length_needs_seq_len(tmp_path):
    """A model JSON with no sequence length is refused naming --seq-len, and accepted with
    it; HF's max_position_embeddings is taken (with a note) when --seq-len is not given."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"dim": 1024, "n_layers": 4, "n_heads": 8, "ffn_hidden": 4096,
                                "vocab_size": 32000}))
    with pytest.raises(SpecError, match=r"missing field seq_len \(or --seq-len\)"):
        ModelSpec.from_json(path)
    assert ModelSpec.from_json(path, seq_len=2048).seq_len == 2048
    proc = meshscope("plan", "--model-json", path, "--world", 8, "--seq-len", 2048,
                     "--device", "H100", "--json", check=True)
    assert json.loads(proc.stdout)["model"]["seq_len"] == 2048
    notes = []
    assert ModelSpec.from_json(MODELS / "llama-3-8b.json", notes=notes).seq_len == 8192
    assert any("max_position_embeddings" in n for n in notes)


def test_block_gpt_contradicting_a_gated_config_is_refused():
    proc = meshscope("plan", "--model-json", MODELS / "llama-3-8b.json", "--world", 8,
                     "--block", "gpt")
    assert proc.returncode == 2 and "contradicts" in proc.stderr
