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

from .model_file import REQUIRED, SpecError, read_model_fields

__all__ = ["ModelSpec", "Param", "SpecError", "is_expert"]


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
        for field in REQUIRED:
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
        """From a mapping in this project's or Hugging Face's field names (``model_file.ALIASES``;
        docs/layouts.md). ``seq_len`` (``--seq-len``) is the sequence trained, and is needed
        when the file has none; without it HF's ``max_position_embeddings`` — the longest
        sequence the model supports — is taken. A key that is neither read nor known to leave
        the cost unchanged is refused (``SpecError`` naming it); what was read that the user
        should know (the sequence length taken, a checkpoint's quantization) is appended to
        ``notes``."""
        values, kind = read_model_fields(data, where=where, seq_len=seq_len, notes=notes)
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

    @functools.lru_cache(maxsize=8)
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
