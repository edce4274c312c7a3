"""The model the planner reasons about: a Llama-style decoder described by its sizes alone.

``ModelSpec`` holds what the memory and traffic formulas need — hidden size h, layers L, heads
a, key/value heads (grouped-query attention; a = kv for plain multi-head attention), FFN width
f, vocabulary V, sequence length s, and for a mixture of experts the expert count E, top-k,
expert width and which layers are MoE — and lists the model's weight matrices
(``layer_params``, ``stage_params``) with their shapes and how tensor parallelism splits each.

It is built from one of the runner's presets (``from_config``: the model ``meshscope run``
trains) or from a JSON file (``from_json``) in either this project's field names or Hugging
Face's ``config.json`` names, so that a 7B or 70B plan needs nothing but the model's
config.json::

    {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
     "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
     "max_position_embeddings": 4096}

torch-free: planning a 70B job on a laptop imports neither torch nor the runner's model.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

from meshscope.parallel.config import ModelConfig
from meshscope.theory.flops import training_flops_per_token
from meshscope.theory.params import DecoderShape, n_params


class SpecError(ValueError):
    """A model description that cannot be planned; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One weight tensor: ``shape`` (rows, cols) as torch stores it (``nn.Linear``: out × in),
    and how tensor parallelism splits it: ``"col"`` (output features, dim 0: q/k/v, w1, w3,
    the output head, the embedding's vocabulary rows), ``"row"`` (input features, dim 1: wo,
    w2) or ``"rep"`` (replicated: norms, the router, experts)."""
    name: str
    shape: tuple[int, ...]
    tp_split: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def local_numel(self, tp: int) -> int:
        n = 1
        for d in self.local_shape(tp):
            n *= d
        return n

    def local_shape(self, tp: int) -> tuple[int, ...]:
        """This tensor's shape on one tensor-parallel rank (DTensor's even split; the runner
        refuses layouts where tp does not divide heads or FFN width)."""
        if tp == 1 or self.tp_split == "rep":
            return self.shape
        dim = 0 if self.tp_split == "col" else 1
        shape = list(self.shape)
        shape[dim] = -(-shape[dim] // tp)
        return tuple(shape)


# Field names accepted in a JSON model description: ours (ModelConfig) and Hugging Face's.
_ALIASES = {
    "dim": ("dim", "hidden_size", "d_model", "n_embd"),
    "n_layers": ("n_layers", "num_hidden_layers", "num_layers", "n_layer"),
    "n_heads": ("n_heads", "num_attention_heads", "n_head"),
    "n_kv_heads": ("n_kv_heads", "num_key_value_heads"),
    "ffn_hidden": ("ffn_hidden", "intermediate_size", "ffn_dim"),
    "vocab_size": ("vocab_size",),
    "seq_len": ("seq_len", "seq_length", "max_position_embeddings", "max_seq_len"),
    "moe_experts": ("moe_experts", "num_local_experts", "num_experts", "n_routed_experts"),
    "moe_top_k": ("moe_top_k", "num_experts_per_tok", "top_k"),
    "moe_every": ("moe_every", "moe_layer_freq", "decoder_sparse_step"),
    "moe_hidden": ("moe_hidden", "moe_intermediate_size"),
    "tied_embeddings": ("tied_embeddings", "tie_word_embeddings"),
    "moe_shared_hidden": ("moe_shared_hidden", "shared_expert_intermediate_size",
                          "moe_shared_expert_intermediate_size"),
    "moe_first_dense": ("moe_first_dense", "first_k_dense_replace"),
}
_REQUIRED = ("dim", "n_layers", "n_heads", "ffn_hidden", "vocab_size", "seq_len")


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
    name: str = "model"

    def __post_init__(self):
        for field in _REQUIRED:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"model field {field}: expected a positive integer, "
                                f"got {value!r}")
        if self.dim % self.n_heads:
            raise SpecError(f"model field n_heads: {self.n_heads} heads do not divide the "
                            f"hidden size {self.dim}")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise SpecError(f"model field n_kv_heads: {self.n_kv_heads} must divide the "
                            f"{self.n_heads} attention heads")
        if self.moe_experts < 0 or (self.moe_experts and not
                                    1 <= self.moe_top_k <= self.moe_experts):
            raise SpecError(f"model field moe_top_k: {self.moe_top_k} must be between 1 and "
                            f"the {self.moe_experts} experts")
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
    def from_dict(cls, data: dict, *, where: str = "model", name: str | None = None
                  ) -> "ModelSpec":
        """From a mapping in this project's or Hugging Face's field names (see ``_ALIASES``);
        unknown keys are ignored. ``seq_len`` may be overridden by the caller afterwards
        (``dataclasses.replace``): HF's ``max_position_embeddings`` is the longest sequence the
        model supports, not necessarily the one trained."""
        if not isinstance(data, dict):
            raise SpecError(f"{where}: expected a JSON object")
        values = {}
        if data.get("n_shared_experts") and data.get("moe_intermediate_size"):
            # DeepSeek: n shared experts of the routed experts' width, fused into one MLP
            values["moe_shared_hidden"] = data["n_shared_experts"] * data["moe_intermediate_size"]
        for field, names in _ALIASES.items():
            for n in names:
                if n in data and data[n] is not None:
                    values[field] = data[n]
                    break
        missing = [f for f in _REQUIRED if f not in values]
        if missing:
            raise SpecError(f"{where}: missing field {missing[0]} (also accepted as "
                            f"{' or '.join(_ALIASES[missing[0]][1:]) or 'nothing else'})")
        for field, value in values.items():
            if field == "tied_embeddings":
                if not isinstance(value, bool):
                    raise SpecError(f"{where}: field {field} must be true or false")
            elif not isinstance(value, int) or isinstance(value, bool):
                raise SpecError(f"{where}: field {field} must be an integer, got {value!r}")
        try:
            return cls(**values, name=name or str(data.get("name") or data.get("model_type")
                                                  or "model"))
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None

    @classmethod
    def from_json(cls, path: pathlib.Path) -> "ModelSpec":
        path = pathlib.Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SpecError(f"{path}: not a readable JSON model description ({e})") from None
        return cls.from_dict(data, where=str(path), name=path.stem)

    # -- sizes -------------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def expert_hidden(self) -> int:
        return self.moe_hidden or self.ffn_hidden

    def is_moe_layer(self, i: int) -> bool:
        """The runner's rule (``ModelConfig.is_moe_layer``): every ``moe_every``-th layer,
        after the first ``moe_first_dense`` layers (which keep a dense MLP):
        ``meshscope.theory.params.DecoderShape.is_moe_layer``."""
        return self.shape.is_moe_layer(i)

    def layer_params(self, i: int) -> list[Param]:
        """Layer ``i``'s weights, in the order the runner registers them (``parallel.model``:
        attention_norm, wq, wk, wv, wo, ffn_norm, then the FFN or the MoE's router and
        experts)."""
        h, kv = self.dim, self.kv_dim
        out = [Param("attention_norm", (h,), "rep"),
               Param("wq", (h, h), "col"), Param("wk", (kv, h), "col"),
               Param("wv", (kv, h), "col"), Param("wo", (h, h), "row"),
               Param("ffn_norm", (h,), "rep")]
        if self.is_moe_layer(i):
            eh = self.expert_hidden
            out.append(Param("router", (self.moe_experts, h), "rep"))
            for e in range(self.moe_experts):
                out += [Param(f"expert{e}.w1", (eh, h), "rep"),
                        Param(f"expert{e}.w2", (h, eh), "rep"),
                        Param(f"expert{e}.w3", (eh, h), "rep")]
            if self.moe_shared_hidden:
                fs = self.moe_shared_hidden
                out += [Param("shared.w1", (fs, h), "col"), Param("shared.w2", (h, fs), "row"),
                        Param("shared.w3", (fs, h), "col")]
        else:
            f = self.ffn_hidden
            out += [Param("w1", (f, h), "col"), Param("w2", (h, f), "row"),
                    Param("w3", (f, h), "col")]
        return out

    def stage_params(self, layers: list[int], *, first: bool, last: bool) -> list[list[Param]]:
        """The weights of a pipeline stage holding ``layers`` (the first stage also owns the
        embedding, the last the final norm and output head), grouped as FSDP shards them:
        one group per layer, then the stage's own weights (its root group)."""
        groups = [self.layer_params(i) for i in layers]
        root = []
        if first:
            root.append(Param("tok_embeddings", (self.vocab_size, self.dim), "col"))
        if last:
            root.append(Param("norm", (self.dim,), "rep"))
            if not (self.tied_embeddings and first):
                root.append(Param("output", (self.vocab_size, self.dim), "col"))
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
                            tied_embeddings=self.tied_embeddings)

    def n_params(self) -> int:
        """All parameters (embedding and head counted separately unless tied) — the sum of
        ``stage_params`` over the whole model, as ``meshscope.theory.params.n_params`` counts."""
        return n_params(self.shape)

    def active_params(self) -> int:
        """Parameters a token passes through: every dense weight, the router and ``top_k``
        experts of each MoE layer."""
        return n_params(self.shape, active=True)

    def flops_per_token(self) -> int:
        """Training FLOPs per token, the runner's definition
        (``meshscope.theory.flops.training_flops_per_token``): 6 × active parameters without
        the embedding lookup, plus attention's score and value products 12 · L · h · s."""
        return training_flops_per_token(self.shape)

    def as_config(self) -> ModelConfig:
        """The runner's ``ModelConfig`` of the same sizes — what ``parallel.layout.validate``
        checks a layout against (key/value heads and tied embeddings have no counterpart
        there: the planner drops layouts whose tp does not divide the key/value heads)."""
        return ModelConfig(vocab_size=self.vocab_size, dim=self.dim, n_layers=self.n_layers,
                           n_heads=self.n_heads, ffn_hidden=self.ffn_hidden,
                           seq_len=self.seq_len, moe_experts=self.moe_experts,
                           moe_top_k=self.moe_top_k, moe_every=self.moe_every,
                           moe_hidden=self.expert_hidden)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
