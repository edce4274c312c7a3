"""Reading a model description: a Hugging Face ``config.json`` or the same sizes in meshscope's
field names (docs/layouts.md lists both), into the fields of ``spec.ModelSpec``.

Every key of the file is honoured (``ALIASES``; a model_type's MLP, norm and biases from
``MODEL_TYPES``), known not to change the cost (``_NO_COST``: token ids, dropout rates, RoPE's
base …) or refused with the key's name (``SpecError``) — never silently ignored.
"""
from __future__ import annotations

import json


class SpecError(ValueError):
    """A model description that cannot be planned; the message names the field."""


# Our field names and the Hugging Face (and Megatron) names accepted for each; the first
# present, non-null one is read, and two present with different values are refused.
ALIASES = {
    "dim": ("dim", "hidden_size", "d_model", "n_embd"),
    "n_layers": ("n_layers", "num_hidden_layers", "num_layers", "n_layer"),
    "n_heads": ("n_heads", "num_attention_heads", "n_head"),
    "n_kv_heads": ("n_kv_heads", "num_key_value_heads", "num_query_groups"),
    "ffn_hidden": ("ffn_hidden", "intermediate_size", "ffn_hidden_size", "ffn_dim", "n_inner"),
    "vocab_size": ("vocab_size",),
    "seq_len": ("seq_len", "seq_length", "max_position_embeddings", "max_seq_len",
                "n_positions"),
    "head_dim": ("head_dim", "kv_channels"),
    "moe_experts": ("moe_experts", "num_local_experts", "num_experts", "n_routed_experts"),
    "moe_top_k": ("moe_top_k", "num_experts_per_tok", "experts_per_token"),
    "moe_every": ("moe_every", "moe_layer_freq", "decoder_sparse_step"),
    "moe_hidden": ("moe_hidden", "moe_intermediate_size"),
    "tied_embeddings": ("tied_embeddings", "tie_word_embeddings"),
    "moe_shared_hidden": ("moe_shared_hidden", "shared_expert_intermediate_size",
                          "moe_shared_expert_intermediate_size"),
    "moe_first_dense": ("moe_first_dense", "first_k_dense_replace"),
    "moe_groups": ("moe_groups", "n_group"),
    "moe_group_limit": ("moe_group_limit", "topk_group"),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "mtp_layers": ("mtp_layers", "num_nextn_predict_layers"),
    "qkv_bias": ("qkv_bias",),
    "out_bias": ("out_bias",),
    "mlp_bias": ("mlp_bias",),
    "qk_norm": ("qk_norm",),
    "position_embeddings": ("position_embeddings",),
    "embedding_norm": ("embedding_norm",),
    "sliding_window": ("sliding_window",),
}
REQUIRED = ("dim", "n_layers", "n_heads", "ffn_hidden", "vocab_size", "seq_len")
_BOOL_FIELDS = ("tied_embeddings", "qkv_bias", "out_bias", "mlp_bias", "qk_norm",
                "embedding_norm")

# Each Hugging Face model_type the planner knows: its MLP, norm and biases, and the default
# of tie_word_embeddings (transformers' own config class default).
MODEL_TYPES = {
    "llama": dict(gated=True, norm_bias=False, tied=False),
    "mistral": dict(gated=True, norm_bias=False, tied=False),
    "mixtral": dict(gated=True, norm_bias=False, tied=False),
    "qwen2": dict(gated=True, norm_bias=False, tied=False, qkv_bias=True),
    "qwen2_moe": dict(gated=True, norm_bias=False, tied=False, qkv_bias=True),
    "qwen3": dict(gated=True, norm_bias=False, tied=False, qk_norm=True),
    "qwen3_moe": dict(gated=True, norm_bias=False, tied=False, qk_norm=True),
    "deepseek_v2": dict(gated=True, norm_bias=False, tied=False),
    "deepseek_v3": dict(gated=True, norm_bias=False, tied=False),
    "gpt_oss": dict(gated=True, norm_bias=False, tied=False, qkv_bias=True, out_bias=True,
                    mlp_bias=True),
    "gpt2": dict(gated=False, norm_bias=True, tied=True, qkv_bias=True, out_bias=True,
                 mlp_bias=True, learned_positions=True),
}

# Keys that do not change memory, traffic or time (metadata, token ids, initialisation,
# dropout, RoPE's parameters, norms' epsilon, routing details that keep top-k of E, ...).
_NO_COST = frozenset((
    "model_type", "architectures", "name", "_name_or_path", "torch_dtype", "dtype",
    "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache",
    "initializer_range", "initializer_factor", "rms_norm_eps", "layer_norm_eps",
    "layer_norm_epsilon", "norm_eps", "hidden_act", "activation_function", "rope_theta",
    "rope_scaling", "rope_parameters", "rope_interleave", "partial_rotary_factor",
    "pretraining_tp", "attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop",
    "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "task_specific_params",
    "scale_attn_weights", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx",
    "n_ctx", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "router_z_loss_coef", "norm_topk_prob", "scoring_func", "topk_method",
    "routed_scaling_factor", "aux_loss_alpha", "seq_aux", "ep_size",
    "use_bfloat16", "auto_map", "swiglu_limit", "attention_sink", "initial_context_length",
    "max_window_layers", "use_sliding_window", "layer_types", "tie_word_embeddings",
    "n_shared_experts", "mlp_only_layers", "attention_bias", "mlp", "norm", "sliding_layers",
    "rope_ntk_alpha", "router_bias",
))


def _refuse(where: str, key: str, why: str):
    raise SpecError(f"{where}: field {key}: {why}")


def _read_fields(data: dict, where: str) -> tuple[dict, set]:
    values, consumed = {}, set()
    for field, names in ALIASES.items():
        present = [n for n in names if n in data and data[n] is not None]
        consumed.update(n for n in names if n in data)
        if not present:
            continue
        distinct = {json.dumps(data[n]) for n in present}
        if len(distinct) > 1 and field not in ("seq_len",):
            _refuse(where, present[1], f"{data[present[1]]!r} disagrees with {present[0]} "
                    f"{data[present[0]]!r}; keep one")
        values[field] = data[present[0]]
    return values, consumed


def _model_kind(data: dict, where: str) -> dict:
    """The MLP, norm, biases and tie default: the model_type's, or this project's format (a
    gated MLP and RMSNorm unless "mlp": "plain" / "norm": "layernorm")."""
    mt = data.get("model_type")
    if mt is not None:
        if mt not in MODEL_TYPES:
            _refuse(where, "model_type", f"{mt!r} is not a model the planner knows "
                    f"({', '.join(sorted(MODEL_TYPES))}); describe its shape in meshscope's "
                    f"field names instead (docs/layouts.md)")
        kind = dict(MODEL_TYPES[mt])
    else:
        kind = dict(gated=True, norm_bias=False, tied=False)
    if "mlp" in data:
        if data["mlp"] not in ("gated", "plain"):
            _refuse(where, "mlp", f"{data['mlp']!r}: expected gated (SwiGLU) or plain (GeLU)")
        kind["gated"] = data["mlp"] == "gated"
    if "norm" in data:
        if data["norm"] not in ("rmsnorm", "layernorm"):
            _refuse(where, "norm", f"{data['norm']!r}: expected rmsnorm or layernorm")
        kind["norm_bias"] = data["norm"] == "layernorm"
    if data.get("attention_bias") is not None:
        if not isinstance(data["attention_bias"], bool):
            _refuse(where, "attention_bias", "expected true or false")
        kind["qkv_bias"] = kind["out_bias"] = data["attention_bias"]
    return kind


def _sliding_layers(data: dict, n_layers: int, where: str) -> tuple[int, ...]:
    """Which layers attend to a sliding window (transformers' rules: ``layer_types``, or
    every layer from ``max_window_layers`` on when ``use_sliding_window``)."""
    window = data.get("sliding_window")
    if "sliding_layers" in data:
        layers = data["sliding_layers"]
        if not isinstance(layers, list) or not all(isinstance(i, int) and 0 <= i < n_layers
                                                   for i in layers):
            _refuse(where, "sliding_layers", f"expected a list of layer indices below "
                    f"{n_layers}")
        return tuple(layers)
    types = data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers or not set(types) <= {
                "sliding_attention", "full_attention"}:
            _refuse(where, "layer_types", f"expected {n_layers} of sliding_attention / "
                    f"full_attention")
        return tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if not window or data.get("use_sliding_window") is False:
        return ()
    start = (data.get("max_window_layers") or 0) if data.get("use_sliding_window") else 0
    return tuple(range(min(start, n_layers), n_layers))


def read_model_fields(data: dict, *, where: str = "model", seq_len: int | None = None,
                      notes: list[str] | None = None) -> tuple[dict, dict]:
    """(values, kind) of a model description: ``values`` the ``ModelSpec`` fields read (every
    one checked for its type), ``kind`` the MLP and norm (``gated``, ``norm_bias``). ``seq_len``
    (``--seq-len``) overrides the file's; what the user should know (the sequence length taken,
    a checkpoint's quantization) is appended to ``notes``."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a JSON object")
    for key in ("text_config", "vision_config", "encoder", "is_encoder_decoder",
                "add_cross_attention"):
        if data.get(key):
            _refuse(where, key, "an encoder or a multimodal model: plan its text decoder "
                    "alone (its text_config, with a model_type)")
    notes = notes if notes is not None else []
    if data.get("quantization_config"):
        notes.append(f"{where}: quantization_config describes how the checkpoint is "
                     f"stored; training is planned in --precision")
    kind = _model_kind(data, where)
    values, consumed = _read_fields(data, where)
    for key in ("n_shared_experts", "mlp_only_layers", "quantization_config"):
        consumed.add(key)
    if seq_len is not None:
        values["seq_len"] = seq_len
    elif "seq_len" in values and not any(k in data for k in ("seq_len", "seq_length")):
        notes.append(f"{where}: sequence length {values['seq_len']} from "
                     f"max_position_embeddings, the longest the model supports "
                     f"(--seq-len sets the one trained)")
    if data.get("model_type") == "gpt2":
        values.setdefault("position_embeddings", data.get("n_positions") or
                          data.get("max_position_embeddings") or 1024)
        if values.get("ffn_hidden") is None and isinstance(values.get("dim"), int):
            values["ffn_hidden"] = 4 * values["dim"]          # n_inner null: 4h
    if data.get("n_shared_experts"):
        width = data.get("moe_intermediate_size")
        if not isinstance(width, int) or not isinstance(data["n_shared_experts"], int):
            _refuse(where, "n_shared_experts", "needs an integer moe_intermediate_size "
                    "(the shared experts' width)")
        values["moe_shared_hidden"] = data["n_shared_experts"] * width
    dense = data.get("mlp_only_layers")
    if dense:
        if not isinstance(dense, list) or dense != list(range(len(dense))):
            _refuse(where, "mlp_only_layers", f"{dense!r}: only a run of dense layers at "
                    f"the start is planned (first_k_dense_replace)")
        values["moe_first_dense"] = len(dense)
    missing = [f for f in REQUIRED if f not in values]
    if missing:
        extra = " (or --seq-len)" if missing[0] == "seq_len" else ""
        raise SpecError(f"{where}: missing field {missing[0]}{extra} (also accepted as "
                        f"{' or '.join(ALIASES[missing[0]][1:]) or 'nothing else'})")
    unknown = sorted(k for k, v in data.items() if k not in consumed and k not in _NO_COST
                     and v is not None)
    if unknown:
        _refuse(where, unknown[0], "not a field the planner knows, so it cannot honour "
                "it; remove it if it does not change the model's shape, memory or "
                "compute (docs/layouts.md lists the fields read)")
    for field, value in values.items():
        if field in _BOOL_FIELDS:
            if not isinstance(value, bool):
                _refuse(where, field, "must be true or false")
        elif not isinstance(value, int) or isinstance(value, bool):
            _refuse(where, field, f"must be an integer, got {value!r}")
    values.setdefault("tied_embeddings", kind["tied"])
    for flag in ("qkv_bias", "out_bias", "mlp_bias", "qk_norm"):
        values.setdefault(flag, kind.get(flag, False))
    if data.get("mlp_bias") is not None:
        values["mlp_bias"] = data["mlp_bias"]
    if data.get("model_type") == "gpt_oss" or data.get("router_bias"):
        values["mlp_bias"] = True
    values["sliding_layers"] = _sliding_layers(data, values["n_layers"], where)
    if not values["sliding_layers"]:
        values.pop("sliding_window", None)
    return values, kind
