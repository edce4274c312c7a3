"""The model the planner reasons about: a decoder described by its sizes alone.

``ModelSpec`` holds what the memory, traffic and time formulas need — hidden size h, layers L,
heads a of width d, key/value heads (grouped-query attention) or multi-head latent attention's
ranks, the MLP's kind (gated SwiGLU or a plain two-matrix GeLU MLP) and width f, biases and
norms, vocabulary V, learned positions, sequence length s, sliding-window layers, and for a
mixture of experts the expert count E, top-k, expert and shared-expert widths, which layers
are MoE and DeepSeek's multi-token-prediction modules — and lists the model's weight matrices
(``layer_params``, ``stage_params``) with their shapes and how tensor parallelism splits each.

It is built from one of the runner's presets (``from_config``: the model ``meshscope run``
trains) or from a JSON file (``from_json``): a Hugging Face ``config.json`` or the same sizes
in this project's field names (docs/layouts.md lists both). Every key of the file is either
honoured, known not to change the cost (token ids, dropout rates, RoPE's base…) or refused
with the key's name — never silently ignored::

    {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
     "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
     "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": false}

torch-free: planning a 70B job on a laptop imports neither torch nor the runner's model.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

from meshscope.parallel.config import ModelConfig
from meshscope.theory.flops import training_flops_per_token
from meshscope.theory.params import DecoderShape, mtp_params, n_params


class SpecError(ValueError):
    """A model description that cannot be planned; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One weight tensor, or ``count`` tensors of one shape (a MoE layer's E experts' w1):
    ``shape`` (rows, cols) as torch stores it (``nn.Linear``: out × in), and how tensor
    parallelism splits it: ``"col"`` (output features, dim 0: q/k/v, w1, w3, the output head,
    the embedding's vocabulary rows, their biases), ``"row"`` (input features, dim 1: wo, w2)
    or ``"rep"`` (replicated: norms, row-parallel biases, the router, experts, MLA's
    down-projections)."""
    name: str
    shape: tuple[int, ...]
    tp_split: str
    count: int = 1

    @property
    def numel(self) -> int:
        n = self.count
        for d in self.shape:
            n *= d
        return n

    @property
    def tensor_numel(self) -> int:
        """Elements of one of the ``count`` tensors."""
        return self.numel // self.count

    def local_numel(self, tp: int) -> int:
        n = self.count
        for d in self.local_shape(tp):
            n *= d
        return n

    def local_shape(self, tp: int) -> tuple[int, ...]:
        """One tensor's shape on one tensor-parallel rank (DTensor's even split; the runner
        refuses layouts where tp does not divide heads or FFN width)."""
        if tp == 1 or self.tp_split == "rep":
            return self.shape
        dim = 0 if self.tp_split == "col" or len(self.shape) == 1 else 1
        shape = list(self.shape)
        shape[dim] = -(-shape[dim] // tp)
        return tuple(shape)


def is_expert(p: Param) -> bool:
    return p.name.startswith("expert")


# -- reading a model description ---------------------------------------------------------------

# Our field names and the Hugging Face (and Megatron) names accepted for each; the first
# present, non-null one is read, and two present with different values are refused.
_ALIASES = {
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
_REQUIRED = ("dim", "n_layers", "n_heads", "ffn_hidden", "vocab_size", "seq_len")
_BOOL_FIELDS = ("tied_embeddings", "qkv_bias", "out_bias", "mlp_bias", "qk_norm",
                "embedding_norm")

# Each Hugging Face model_type the planner knows: its MLP, norm and biases, and the default
# of tie_word_embeddings (transformers' own config class default).
_MODEL_TYPES = {
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
    for field, names in _ALIASES.items():
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
        if mt not in _MODEL_TYPES:
            _refuse(where, "model_type", f"{mt!r} is not a model the planner knows "
                    f"({', '.join(sorted(_MODEL_TYPES))}); describe its shape in meshscope's "
                    f"field names instead (docs/layouts.md)")
        kind = dict(_MODEL_TYPES[mt])
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


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    dim: int
    n_layers: int
    n_heads: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    n_kv_heads: int | None = None   # None: as many as n_heads (multi-head attention)
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_every: int = 1
    moe_hidden: int | None = None   # None: ffn_hidden
    tied_embeddings: bool = False
    moe_shared_hidden: int = 0      # a shared expert's MLP width (0: none)
    moe_first_dense: int = 0        # the first layers keep a dense MLP (DeepSeek's first_k_dense)
    moe_groups: int = 0             # expert groups of a group-limited router (n_group; 0: none)
    moe_group_limit: int = 0        # groups a token's experts come from (topk_group)
    name: str = "model"
    head_dim: int | None = None     # None: dim / n_heads
    gated_mlp: bool = True          # SwiGLU (3 matrices); False: a plain GeLU MLP (2)
    norm_bias: bool = False         # LayerNorm (weight and bias) rather than RMSNorm
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    position_embeddings: int = 0    # learned absolute positions (rows of h)
    embedding_norm: bool = False
    q_lora_rank: int = 0            # multi-head latent attention (kv_lora_rank > 0)
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    mtp_layers: int = 0             # DeepSeek-V3's multi-token-prediction modules

    def __post_init__(self):
        for field in _REQUIRED:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"model field {field}: expected a positive integer, "
                                f"got {value!r}")
        for field in ("head_dim", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                      "qk_rope_head_dim", "v_head_dim", "sliding_window", "mtp_layers",
                      "position_embeddings", "moe_shared_hidden", "moe_first_dense",
                      "moe_groups", "moe_group_limit"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise SpecError(f"model field {field}: expected a non-negative integer, "
                                f"got {value!r}")
        if self.kv_lora_rank:
            if not (self.qk_nope_head_dim and self.qk_rope_head_dim and self.v_head_dim):
                raise SpecError("model field kv_lora_rank: multi-head latent attention needs "
                                "qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
        elif not self.head_dim and self.dim % self.n_heads:
            raise SpecError(f"model field n_heads: {self.n_heads} heads do not divide the "
                            f"hidden size {self.dim} (give head_dim)")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise SpecError(f"model field n_kv_heads: {self.n_kv_heads} must divide the "
                            f"{self.n_heads} attention heads")
        if self.moe_experts < 0 or (self.moe_experts and not
                                    1 <= self.moe_top_k <= self.moe_experts):
            raise SpecError(f"model field moe_top_k: {self.moe_top_k} must be between 1 and "
                            f"the {self.moe_experts} experts")
        if self.moe_group_limit and not (self.moe_groups and
                                         self.moe_group_limit <= self.moe_groups):
            raise SpecError(f"model field moe_group_limit: {self.moe_group_limit} groups "
                            f"of {self.moe_groups} (moe_groups)")
        if self.moe_every < 1:
            raise SpecError(f"model field moe_every: expected a positive integer, got "
                            f"{self.moe_every!r}")

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: ModelConfig, name: str = "model") -> "ModelSpec":
        """The runner's model (``parallel.config.ModelConfig``, e.g. a preset)."""
        return cls(dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                   ffn_hidden=cfg.ffn_hidden, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len,
                   moe_experts=cfg.moe_experts, moe_top_k=cfg.moe_top_k,
                   moe_every=cfg.moe_every, moe_hidden=cfg.moe_hidden, name=name)

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "model", name: str | None = None,
                  seq_len: int | None = None, notes: list[str] | None = None
                  ) -> "ModelSpec":
        """From a mapping in this project's or Hugging Face's field names (``_ALIASES``;
        docs/layouts.md). ``seq_len`` (``--seq-len``) is the sequence trained, and is needed
        when the file has none; without it HF's ``max_position_embeddings`` — the longest
        sequence the model supports — is taken. A key that is neither read nor known to leave
        the cost unchanged is refused (``SpecError`` naming it); what was read that the user
        should know (the sequence length taken, a checkpoint's quantization) is appended to
        ``notes``."""
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
        missing = [f for f in _REQUIRED if f not in values]
        if missing:
            extra = " (or --seq-len)" if missing[0] == "seq_len" else ""
            raise SpecError(f"{where}: missing field {missing[0]}{extra} (also accepted as "
                            f"{' or '.join(_ALIASES[missing[0]][1:]) or 'nothing else'})")
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
        try:
            return cls(**values, gated_mlp=kind["gated"], norm_bias=kind["norm_bias"],
                       name=name or str(data.get("name") or data.get("model_type")
                                        or "model"))
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
        except TypeError as e:
            raise SpecError(f"{where}: {e}") from None

    @classmethod
    def from_json(cls, path: pathlib.Path, seq_len: int | None = None,
                  notes: list[str] | None = None) -> "ModelSpec":
        path = pathlib.Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SpecError(f"{path}: not a readable JSON model description ({e})") from None
        return cls.from_dict(data, where=str(path), name=path.stem, seq_len=seq_len,
                             notes=notes)

    # -- sizes -------------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def head_width(self) -> int:
        """d: one query/key head's width (``DecoderShape.head_width``)."""
        return self.shape.head_width

    @property
    def q_dim(self) -> int:
        return self.shape.q_dim

    @property
    def kv_dim(self) -> int:
        return self.shape.kv_dim

    @property
    def expert_hidden(self) -> int:
        return self.moe_hidden or self.ffn_hidden

    def is_moe_layer(self, i: int) -> bool:
        """The runner's rule (``ModelConfig.is_moe_layer``): every ``moe_every``-th layer,
        after the first ``moe_first_dense`` layers (which keep a dense MLP):
        ``meshscope.theory.params.DecoderShape.is_moe_layer``."""
        return self.shape.is_moe_layer(i)

    def _mlp(self, prefix: str, width: int, split: bool, count: int = 1) -> list[Param]:
        """One MLP's weights (w1, w2 and SwiGLU's w3) and biases, split col/row by tensor
        parallelism when ``split`` (else replicated, as experts are)."""
        h = self.dim
        col, row = ("col", "row") if split else ("rep", "rep")
        out = [Param(f"{prefix}w1", (width, h), col, count),
               Param(f"{prefix}w2", (h, width), row, count)]
        if self.gated_mlp:
            out.append(Param(f"{prefix}w3", (width, h), col, count))
        if self.mlp_bias:
            out += [Param(f"{prefix}b1", (width,), col, count),
                    Param(f"{prefix}b2", (h,), "rep", count)]
            if self.gated_mlp:
                out.append(Param(f"{prefix}b3", (width,), col, count))
        return out

    def _norm(self, name: str, width: int) -> list[Param]:
        return [Param(name, (width,), "rep")] + (
            [Param(f"{name}.bias", (width,), "rep")] if self.norm_bias else [])

    def _attention(self) -> list[Param]:
        h, a = self.dim, self.n_heads
        if self.mla:
            qk, v = self.head_width, self.v_head_dim
            out = []
            if self.q_lora_rank:
                out += [Param("wq_a", (self.q_lora_rank, h), "rep"),
                        Param("q_norm", (self.q_lora_rank,), "rep"),
                        Param("wq_b", (a * qk, self.q_lora_rank), "col")]
            else:
                out.append(Param("wq", (a * qk, h), "col"))
            out += [Param("wkv_a", (self.kv_lora_rank + self.qk_rope_head_dim, h), "rep"),
                    Param("kv_norm", (self.kv_lora_rank,), "rep"),
                    Param("wkv_b", (a * (self.qk_nope_head_dim + v), self.kv_lora_rank),
                          "col"),
                    Param("wo", (h, a * v), "row")]
            if self.out_bias:
                out.append(Param("bo", (h,), "rep"))
            return out
        q, kv = self.q_dim, self.kv_dim
        out = [Param("wq", (q, h), "col"), Param("wk", (kv, h), "col"),
               Param("wv", (kv, h), "col"), Param("wo", (h, q), "row")]
        if self.qkv_bias:
            out += [Param("bq", (q,), "col"), Param("bk", (kv,), "col"),
                    Param("bv", (kv,), "col")]
        if self.out_bias:
            out.append(Param("bo", (h,), "rep"))
        if self.qk_norm:
            out += [Param("q_norm", (self.head_width,), "rep"),
                    Param("k_norm", (self.head_width,), "rep")]
        return out

    @functools.lru_cache(maxsize=4)
    def _layer_params(self, moe: bool) -> tuple[Param, ...]:
        h = self.dim
        out = self._norm("attention_norm", h) + self._attention() + self._norm("ffn_norm", h)
        if moe:
            out.append(Param("router", (self.moe_experts, h), "rep"))
            if self.mlp_bias:
                out.append(Param("router.bias", (self.moe_experts,), "rep"))
            out += self._mlp("experts.", self.expert_hidden, split=False,
                             count=self.moe_experts)
            if self.moe_shared_hidden:
                out += self._mlp("shared.", self.moe_shared_hidden, split=True)
        else:
            out += self._mlp("", self.ffn_hidden, split=True)
        return tuple(out)

    def layer_params(self, i: int) -> list[Param]:
        """Layer ``i``'s weights: its norms, attention (MHA/GQA or MLA), and the FFN — a dense
        MLP, or the MoE's router, experts (one ``Param`` per matrix, ``count`` = E) and
        shared expert."""
        return list(self._layer_params(self.is_moe_layer(i)))

    def mtp_module_params(self) -> list[Param]:
        """One multi-token-prediction module: two norms, the 2h → h projection, a layer like
        the last one, and the norm before the shared output head."""
        h = self.dim
        return (self._norm("mtp.enorm", h) + self._norm("mtp.hnorm", h)
                + [Param("mtp.eh_proj", (h, 2 * h), "col")]
                + self.layer_params(self.n_layers - 1) + self._norm("mtp.head_norm", h))

    def stage_params(self, layers: list[int], *, first: bool, last: bool) -> list[list[Param]]:
        """The weights of a pipeline stage holding ``layers`` (the first stage also owns the
        embedding and positions, the last the final norm, output head and MTP modules),
        grouped as FSDP shards them: one group per layer, then the stage's own weights (its
        root group)."""
        groups = [self.layer_params(i) for i in layers]
        root = []
        if first:
            root.append(Param("tok_embeddings", (self.vocab_size, self.dim), "col"))
            if self.position_embeddings:
                root.append(Param("pos_embeddings", (self.position_embeddings, self.dim),
                                  "rep"))
            if self.embedding_norm:
                root += self._norm("embedding_norm", self.dim)
        if last:
            root += self._norm("norm", self.dim)
            if not (self.tied_embeddings and first):
                root.append(Param("output", (self.vocab_size, self.dim), "col"))
            for _ in range(self.mtp_layers):
                root += self.mtp_module_params()
        return groups + [root]

    @functools.cached_property
    def shape(self) -> DecoderShape:
        """These sizes as ``meshscope.theory`` counts them."""
        return DecoderShape(dim=self.dim, n_layers=self.n_layers, ffn_hidden=self.ffn_hidden,
                            seq_len=self.seq_len, vocab_size=self.vocab_size,
                            n_heads=self.n_heads, n_kv_heads=self.kv_heads,
                            moe_experts=self.moe_experts, moe_top_k=self.moe_top_k,
                            moe_every=self.moe_every, moe_first_dense=self.moe_first_dense,
                            moe_hidden=self.moe_hidden,
                            moe_shared_hidden=self.moe_shared_hidden,
                            tied_embeddings=self.tied_embeddings, head_dim=self.head_dim,
                            gated_mlp=self.gated_mlp, qkv_bias=self.qkv_bias,
                            out_bias=self.out_bias, mlp_bias=self.mlp_bias,
                            norm_bias=self.norm_bias, qk_norm=self.qk_norm,
                            position_embeddings=self.position_embeddings,
                            embedding_norm=self.embedding_norm,
                            q_lora_rank=self.q_lora_rank, kv_lora_rank=self.kv_lora_rank,
                            qk_nope_head_dim=self.qk_nope_head_dim,
                            qk_rope_head_dim=self.qk_rope_head_dim,
                            v_head_dim=self.v_head_dim, sliding_window=self.sliding_window,
                            sliding_layers=self.sliding_layers, mtp_layers=self.mtp_layers)

    def n_params(self) -> int:
        """All parameters of the main model (embedding and head counted separately unless
        tied; multi-token-prediction modules apart: ``mtp_params``) — the sum of
        ``stage_params`` less the MTP modules, as ``meshscope.theory.params.n_params``
        counts."""
        return n_params(self.shape)

    def active_params(self) -> int:
        """Parameters a token passes through: every dense weight, the router and ``top_k``
        experts of each MoE layer."""
        return n_params(self.shape, active=True)

    def mtp_params(self) -> int:
        return mtp_params(self.shape)

    def flops_per_token(self) -> int:
        """Training FLOPs per token, the runner's definition
        (``meshscope.theory.flops.training_flops_per_token``): 6 × active parameters without
        the lookups, plus attention's products (12 · L · h · s for plain attention)."""
        return training_flops_per_token(self.shape)

    def as_config(self) -> ModelConfig:
        """The runner's ``ModelConfig`` of the same sizes — what ``parallel.layout.validate``
        checks a layout against (key/value heads and tied embeddings have no counterpart
        there: the planner drops layouts whose tp does not divide the key/value heads)."""
        return ModelConfig(vocab_size=self.vocab_size, dim=self.q_dim, n_layers=self.n_layers,
                           n_heads=self.n_heads, ffn_hidden=self.ffn_hidden,
                           seq_len=self.seq_len, moe_experts=self.moe_experts,
                           moe_top_k=self.moe_top_k, moe_every=self.moe_every,
                           moe_hidden=self.expert_hidden)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["sliding_layers"] = list(self.sliding_layers)
        return d
