"""How the job trains: the framework whose bookkeeping is planned, how it runs (its style),
precision per operation, optimizer, recomputation, flash attention, offload and the knobs
that change memory — everything besides the layout that changes memory and time.

``framework`` names whose memory accounting and communication the plan follows:

- ``runner``    — ``meshscope run`` itself: fp32 AdamW, DDP/FSDP2 buffers, autograd's saved
                  tensors counted one by one for its Llama block (``memory.py``), traffic as
                  the runner issues it. The default for the runner's presets.
- ``megatron``  — Megatron-LM / Megatron-Core / NeMo: bf16 weights with fp32 main gradients in
                  the DDP buffer and fp32 master weights (18 bytes a parameter; 6 + 12/dp with
                  the distributed optimizer, ZeRO-1), Korthikanti et al.'s activations,
                  pipeline sends scattered over tensor-parallel ranks. The default for
                  ``--model-json``.
- ``deepspeed`` — DeepSpeed ZeRO as its own estimator counts it
                  (``estimate_zero2/zero3_model_states_mem_needs``) plus its communication
                  buckets: 16-bit weights and gradients, fp32 master weights, gradients and
                  Adam moments in the optimizer partition, a gather buffer of the largest layer
                  under ZeRO-3.
- ``torch``     — FSDP2 / DDP (torchtitan, NeMo AutoModel, llm-foundry) with the ZeRO paper's
                  mixed-precision counts (16-bit weights and gradients, K = 12), the
                  unsharded working set FSDP gathers, and the Ultra-Scale Playbook's optional
                  fp32 gradient accumulation buffer (``fp32_grads``).

``style`` (``megatron``, ``fsdp``, ``deepspeed``; default: the framework's) sets how each
dimension's communication overlaps compute (``overlap_defaults``).

``precision``: ``fp32``; ``mixed`` (16-bit compute, fp32 master weights); ``bf16`` (bf16
weights and gradients, fp32 optimizer moments, no master copy); ``fp8`` (``mixed`` with the
GEMMs of ``fp8_ops`` in fp8 — the transformer blocks' linear layers by default, as Transformer
Engine and torchao's Float8Linear do; attention, norms, the output head and the optimizer
stay in bf16/fp32 unless named — and their saved inputs in one byte; ``fp8_params`` keeps the
weights themselves in fp8 beside the fp32 master copy). ``fp8_recipe``: ``delayed`` (scales
from past steps: one cast pass), ``current`` (per-tensor scales of this step: an amax pass
more) or ``mx`` (block scales, MXFP8: as current).

``optimizer``: ``adam`` (two moments), ``sgd`` (momentum) or ``adafactor`` (a factored second
moment, counted as 0 bytes a parameter); ``optimizer_states``: the moments in ``fp32`` or
``bf16``.

``recompute``: ``none``, ``selective`` (the attention core, Korthikanti et al. 2022 §4.2 —
Megatron's), ``op`` (torchtitan's op-level selective checkpointing: every other matmul's
output kept, everything else recomputed) or ``full`` (only each layer's input is kept; the
whole forward runs again in backward). ``offload``: ``none``, ``optimizer`` (master weights, fp32 gradients and moments
live in CPU memory, the optimizer step runs there) or ``all`` (weights too; ZeRO-3).

``fused``: the elementwise kernels fused (Megatron / Transformer Engine, ``torch.compile``) or
PyTorch's eager ops (the FSDP style's default), which read and write each tensor more often
(``job_compute.EAGER_ELEMENTWISE``).

MoE: ``ep_dispatcher`` — ``alltoall`` (an NCCL all-to-all: every routed copy its own
message; Megatron's default) or ``deepep`` (DeepEP / HybridEP: one network copy a remote node,
forwarded over NVLink; ``moe_dispatch.py``); ``moe_routing`` — ``model`` (the config's router,
group-limited where it says so) or ``uniform`` (benchmarks' force-balanced gates).

Memory knobs: ``fsdp_prefetch`` (layers FSDP gathers ahead: 1, torch's default), the caching
allocator's ``allocator_reserve`` (reserved memory above what is allocated, a fraction),
``capacity_factor`` (MoE: tokens an expert takes, over the balanced share; None = dropless),
DeepSpeed's ``reduce_bucket`` / ``allgather_bucket`` / ``prefetch_bucket`` (elements, its
defaults).
"""
from __future__ import annotations

import dataclasses

from .precision import Precision

FRAMEWORKS = ("runner", "megatron", "deepspeed", "torch")
STYLES = ("megatron", "fsdp", "deepspeed")
PRECISION_NAMES = ("fp32", "mixed", "bf16", "fp8")
OPTIMIZERS = ("adam", "sgd", "adafactor")
STATE_DTYPES = ("fp32", "bf16")
RECOMPUTE = ("none", "selective", "op", "full")
OFFLOAD = ("none", "optimizer", "all")
BLOCKS = ("llama", "gpt")
FP8_OPS = ("qkv", "proj", "fc1", "fc2", "experts", "head", "attention")
DEFAULT_FP8_OPS = ("qkv", "proj", "fc1", "fc2", "experts")
FP8_RECIPES = ("delayed", "current", "mx")
OVERLAP_DIMS = ("tp", "cp", "ep", "pp", "dp")
EP_DISPATCHERS = ("alltoall", "deepep")
MOE_ROUTINGS = ("model", "uniform")

# The caching allocator's reserve above the allocated peak (PyTorch's allocator rounds blocks
# and keeps freed ones; what a framework's "reserved" figure shows beyond "allocated"). An
# assumption: small, as torchtitan's and NeMo's launch scripts turn on expandable segments
# (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which keep fragmentation low.
ALLOCATOR_RESERVE = 0.05

# Fraction of each dimension's communication that the style hides behind compute (the rest is
# exposed). tp: Megatron without --tp-comm-overlap and FSDP+TP without async TP expose it all;
# cp: the ring overlaps the attention it feeds (up to the attention's time); ep: the
# all-to-alls block the experts; pp: Megatron overlaps the sends of the interleaved schedule
# (overlap_p2p_comm), others wait on them; dp: gradient reduction and weight gathers hidden
# behind backward (Megatron's --overlap-grad-reduce/--overlap-param-gather, FSDP's prefetch,
# DeepSpeed's overlap_comm) up to the compute they can hide behind.
_OVERLAP = {
    "megatron": {"tp": 0.0, "cp": 1.0, "ep": 0.0, "pp": 0.0, "dp": 1.0},
    "fsdp": {"tp": 0.0, "cp": 1.0, "ep": 0.0, "pp": 0.0, "dp": 1.0},
    "deepspeed": {"tp": 0.0, "cp": 1.0, "ep": 0.0, "pp": 0.0, "dp": 0.8},
}


def overlap_defaults(style: str) -> dict[str, float]:
    return dict(_OVERLAP[style])


class TrainingError(ValueError):
    """A combination of training options that cannot be planned; the message names them."""


@dataclasses.dataclass(frozen=True)
class Training:
    framework: str = "runner"
    precision: str = "fp32"
    optimizer: str = "adam"
    recompute: str = "none"
    flash_attention: bool = True
    offload: str = "none"
    fp32_grads: bool | None = None      # None: the framework's default (megatron: yes)
    block: str = "llama"                # llama (RMSNorm, SwiGLU, no dropout) or gpt
    style: str | None = None            # None: the framework's (torch -> fsdp)
    fp8_ops: tuple[str, ...] = DEFAULT_FP8_OPS
    fp8_recipe: str = "delayed"
    fp8_params: bool = False
    optimizer_states: str = "fp32"
    overlap: tuple[tuple[str, float], ...] = ()     # (dim, fraction) over the style's
    fsdp_prefetch: int = 1
    allocator_reserve: float = ALLOCATOR_RESERVE
    capacity_factor: float | None = None
    reduce_bucket: float = 5e8          # DeepSpeed ZeRO-1/2 reduce_bucket_size (elements)
    allgather_bucket: float = 5e8       # DeepSpeed ZeRO-1/2 allgather_bucket_size
    prefetch_bucket: float = 5e7        # DeepSpeed ZeRO-3 stage3_prefetch_bucket_size
    fused: bool | None = None           # elementwise kernels fused (TE, torch.compile);
                                        # None: the style's (fsdp: eager)
    ep_dispatcher: str = "alltoall"     # alltoall (NCCL) or deepep (one copy a node)
    moe_routing: str = "model"          # the config's router, or uniform (force-balanced)

    def __post_init__(self):
        for name, allowed in (("framework", FRAMEWORKS), ("precision", PRECISION_NAMES),
                              ("optimizer", OPTIMIZERS), ("recompute", RECOMPUTE),
                              ("offload", OFFLOAD), ("block", BLOCKS),
                              ("fp8_recipe", FP8_RECIPES),
                              ("optimizer_states", STATE_DTYPES),
                              ("ep_dispatcher", EP_DISPATCHERS),
                              ("moe_routing", MOE_ROUTINGS)):
            if getattr(self, name) not in allowed:
                raise TrainingError(f"{name} {getattr(self, name)!r}: expected one of "
                                    f"{', '.join(allowed)}")
        if self.style is not None and self.style not in STYLES:
            raise TrainingError(f"style {self.style!r}: expected one of {', '.join(STYLES)}")
        bad = [op for op in self.fp8_ops if op not in FP8_OPS]
        if bad:
            raise TrainingError(f"--fp8-ops {bad[0]!r}: expected any of {', '.join(FP8_OPS)}")
        for dim, frac in self.overlap:
            if dim not in OVERLAP_DIMS:
                raise TrainingError(f"--overlap {dim}: expected one of "
                                    f"{', '.join(OVERLAP_DIMS)}")
            if not 0.0 <= frac <= 1.0:
                raise TrainingError(f"--overlap {dim}={frac:g}: a fraction between 0 and 1")
        if not 0.0 <= self.allocator_reserve < 1.0:
            raise TrainingError(f"--allocator-reserve {self.allocator_reserve:g}: a fraction "
                                f"between 0 and 1")
        if self.fsdp_prefetch < 0:
            raise TrainingError(f"--fsdp-prefetch {self.fsdp_prefetch}: 0 or more layers")
        if self.capacity_factor is not None and self.capacity_factor < 1.0:
            raise TrainingError(f"--capacity-factor {self.capacity_factor:g}: at least 1 "
                                f"(tokens over an expert's balanced share)")
        if self.framework == "runner" and (self.precision != "fp32" or self.recompute != "none"
                                           or self.offload != "none"
                                           or self.optimizer != "adam"):
            raise TrainingError("the runner trains in fp32 with AdamW, no recomputation and no "
                                "offload; plan other settings with --framework megatron, "
                                "deepspeed or torch")
        if self.fp8_params and self.precision != "fp8":
            raise TrainingError("--fp8-params keeps the weights in fp8: it needs --precision "
                                "fp8")

    @property
    def job_style(self) -> str:
        """How the job runs: the style given, or the framework's."""
        if self.style:
            return self.style
        return {"torch": "fsdp", "deepspeed": "deepspeed"}.get(self.framework, "megatron")

    @property
    def fused_kernels(self) -> bool:
        """Whether norms, activations and residual adds run as fused kernels (Megatron's and
        Transformer Engine's, or torch.compile's) rather than PyTorch's eager ops."""
        if self.fused is not None:
            return self.fused
        return self.job_style != "fsdp"

    def overlap_of(self, dim: str) -> float:
        """The fraction of ``dim``'s communication hidden behind compute."""
        given = dict(self.overlap)
        return given.get(dim, overlap_defaults(self.job_style)[dim])

    def uses_fp8(self, op: str) -> bool:
        return self.precision == "fp8" and op in self.fp8_ops

    @property
    def act_bytes(self) -> int:
        """Bytes of an activation element (fp8's one-byte GEMM inputs are handled where they
        are saved, ``activations.py``)."""
        return 4 if self.precision == "fp32" else 2

    @property
    def wire_bytes(self) -> int:
        """Bytes of an activation on the wire (tp, pp, cp, ep)."""
        return self.act_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of a weight as the model holds it: fp8 parameters (``fp8_params``: TE's fp8
        model weights) one byte, the fp32 master copy beside them."""
        if self.precision == "fp32":
            return 4
        return 1 if self.fp8_params else 2

    @property
    def state_bytes(self) -> int:
        """Bytes of one optimizer moment."""
        return 2 if self.optimizer_states == "bf16" else 4

    def deepspeed_bf16_optimizer(self, zero_stage: int) -> bool:
        """Whether DeepSpeed runs its ``BF16_Optimizer``: bf16 weights with fp32 gradient
        accumulation under ZeRO-1 without offload (``engine._do_optimizer_sanity_check``). It
        accumulates every local gradient in one whole fp32 buffer (``bf16_optimizer.py``:
        ``fp32_groups_gradients_flat``, not partitioned), all-reduces it, and updates and
        all-gathers only the master-weight partition."""
        return (self.framework == "deepspeed" and zero_stage == 1 and self.offload == "none"
                and self.precision == "mixed" and self.main_grads_fp32)

    @property
    def main_grads_fp32(self) -> bool:
        """Whether gradients accumulate in an fp32 buffer: always in fp32 training; by default
        under Megatron (``--accumulate-allreduce-grads-in-fp32``) and DeepSpeed (its fp32
        gradient partition); with ``fp32_grads`` otherwise."""
        if self.precision == "fp32":
            return False     # the 4-byte gradients are the fp32 ones
        if self.fp32_grads is not None:
            return self.fp32_grads
        return self.framework in ("megatron", "deepspeed")

    @property
    def grad_reduce_bytes(self) -> int:
        """Bytes a gradient element takes on the wire in the data-parallel reduction."""
        return 4 if (self.precision == "fp32" or self.main_grads_fp32) else 2

    def as_precision(self):
        """The ``Precision`` (bytes of a weight, a reduced gradient, an activation) the
        traffic formulas read."""
        return Precision(self.precision, self.weight_bytes, self.grad_reduce_bytes, 0,
                         self.act_bytes)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["style"] = self.job_style
        d["overlap"] = {dim: self.overlap_of(dim) for dim in OVERLAP_DIMS}
        d["fp8_ops"] = list(self.fp8_ops)
        return d


RUNNER = Training()
