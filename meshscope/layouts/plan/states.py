"""Model states per rank, term by term: weights, gradients, master weights, optimizer moments.

Each framework keeps a different set of per-parameter buffers, and ZeRO shards each from a
different stage (Rajbhandari et al. 2020, §5: stage 1 the optimizer state, 2 the gradients,
3 the weights). ``state_terms`` lists them for a ``Training``; ``model_states_by_term`` gives
the bytes of each on one rank holding Ψ parameters with N_d ranks sharing ZeRO state.

Bytes a parameter (before sharding), ``mixed`` precision with Adam:

=========================  ========  =========  =========  ==========
term                       torch     megatron   deepspeed  sharded at
=========================  ========  =========  =========  ==========
16-bit weights             2         2          2          ZeRO-3
16-bit gradients           2         —          2 (≤ 2)    ZeRO-2 (DeepSpeed: never)
fp32 gradients             opt. 4    4          4          ZeRO-2 (DeepSpeed: ZeRO-1)
fp32 master weights        4         4          4          ZeRO-1
Adam moments (fp32)        8         8          8          ZeRO-1
=========================  ========  =========  =========  ==========

- torch without fp32 gradients is the ZeRO paper's 2 + 2 + K (K = 12; its Fig. 1); with them
  the Ultra-Scale Playbook's "BF16 w/ FP32 grad acc" 20 bytes a parameter.
- Megatron-LM (``theoretical_memory_usage.py``): 18 bytes, or 6 + 12/dp with the distributed
  optimizer (ZeRO-1: the fp32 main-gradient buffer stays whole; bf16 gradients are
  accumulated straight into it).
- DeepSpeed (``docs/code-docs/source/memory.rst``): ZeRO-2 4Ψ + 16Ψ/N (the 16-bit weights and
  gradients whole, the fp32 gradient partition with the optimizer's); ZeRO-3 18Ψ/N plus a
  buffer of 4 bytes per parameter of the largest layer (its 16-bit weights gathered and its
  16-bit gradients computed there); with the optimizer offloaded 2Ψ (ZeRO-2) or 2Ψ/N + buffer
  (ZeRO-3); with weights offloaded too, the buffer alone. Under ZeRO-1 with bf16 weights
  DeepSpeed runs its ``BF16_Optimizer`` instead, whose fp32 gradient accumulation buffer is
  whole on every rank (``grads_fp32_accumulation``; ``bf16_optimizer.py``
  ``fp32_groups_gradients_flat``) — only the master weights and moments are partitioned.

``fp32`` keeps 4-byte weights and gradients and no master copy; ``fp8`` keeps the 16-bit
weights (the GEMMs cast them), or with ``fp8_params`` one-byte weights beside the fp32 master
copy (Transformer Engine's fp8 model parameters); ``bf16`` 2-byte weights and gradients, no
master copy; the moments are fp32 (4 bytes each) or, with ``optimizer_states`` bf16, 2; SGD's
momentum is half Adam's moments and Adafactor's factored state is counted as none.
"""
from __future__ import annotations

import dataclasses

from .training import Training

NEVER = 99      # a term no ZeRO stage shards


@dataclasses.dataclass(frozen=True)
class StateTerm:
    name: str
    kind: str                 # params, grads or optimizer (the three columns users read)
    bytes_per_param: float
    shard_from_stage: int     # the ZeRO stage from which it is divided by N_d
    offloaded_by: tuple[str, ...] = ()   # offload settings that move it to CPU memory


def _moment_bytes(optimizer: str, state_bytes: int = 4) -> float:
    """Bytes of optimizer state a parameter: Adam's two moments, SGD's momentum."""
    return {"adam": 2.0, "sgd": 1.0, "adafactor": 0.0}[optimizer] * state_bytes


def state_terms(t: Training, zero_stage: int) -> list[StateTerm]:
    """The per-parameter buffers of ``t`` (see the module docstring's table)."""
    opt = ("optimizer", "all")
    moments = StateTerm(f"{t.optimizer}_state_{t.optimizer_states}", "optimizer",
                        _moment_bytes(t.optimizer, t.state_bytes), 1, opt)
    if t.precision == "fp32":
        return [StateTerm("weights_fp32", "params", 4, 3, ("all",)),
                StateTerm("grads_fp32", "grads", 4, 2, opt), moments]
    out = [StateTerm("weights_fp8", "params", 1, 3, ("all",)) if t.fp8_params else
           StateTerm("weights_16bit", "params", 2, 3, ("all",))]
    fp32_grads = t.main_grads_fp32
    if t.framework == "deepspeed":
        if zero_stage <= 2:
            out.append(StateTerm("grads_16bit", "grads", 2, NEVER, opt))
        if t.deepspeed_bf16_optimizer(zero_stage):
            out.append(StateTerm("grads_fp32_accumulation", "grads", 4, NEVER, opt))
        else:
            out.append(StateTerm("grads_fp32_partition", "grads", 4, 1, opt))
    else:
        if not (t.framework == "megatron" and fp32_grads):
            out.append(StateTerm("grads_16bit", "grads", 2, 2, opt))
        if fp32_grads:
            out.append(StateTerm("main_grads_fp32", "grads", 4, 2, opt))
    if t.precision in ("mixed", "fp8"):
        out.append(StateTerm("master_weights_fp32", "optimizer", 4, 1, opt))
    if moments.bytes_per_param:
        out.append(moments)
    return out


@dataclasses.dataclass(frozen=True)
class StatesByTerm:
    gpu_bytes: dict[str, float]       # term -> bytes on the device
    cpu_bytes: dict[str, float]       # term -> bytes offloaded to host memory
    kinds: dict[str, str]             # term -> params / grads / optimizer

    def kind_bytes(self, kind: str) -> float:
        return sum(b for n, b in self.gpu_bytes.items() if self.kinds[n] == kind)

    @property
    def total_gpu_bytes(self) -> float:
        return sum(self.gpu_bytes.values())


def model_states_by_term(n_params: float, zero_stage: int, n_d: int, t: Training
                         ) -> StatesByTerm:
    """Bytes of each model-state term on one rank holding ``n_params`` parameters."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0-3, got {zero_stage}")
    if t.offload == "all" and zero_stage < 3:
        raise ValueError("offloading the weights needs ZeRO-3 (fsdp)")
    gpu, cpu, kinds = {}, {}, {}
    for term in state_terms(t, zero_stage):
        b = n_params * term.bytes_per_param / (n_d if zero_stage >= term.shard_from_stage
                                               else 1)
        kinds[term.name] = term.kind
        (cpu if t.offload in term.offloaded_by else gpu)[term.name] = b
    return StatesByTerm(gpu_bytes=gpu, cpu_bytes=cpu, kinds=kinds)


def gather_buffer_bytes(largest_layer_params: float, zero_stage: int, t: Training) -> float:
    """ZeRO-3's temporary buffer as DeepSpeed counts it: the largest layer's 16-bit weights
    gathered and its 16-bit gradients (4 bytes a parameter; fp32: 8)."""
    if zero_stage < 3:
        return 0.0
    return largest_layer_params * 2 * t.weight_bytes
