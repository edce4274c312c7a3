"""How the job trains: the framework whose bookkeeping is planned, precision, optimizer,
recomputation, flash attention and CPU offload — everything besides the layout that changes
memory and time.

``framework`` names whose memory accounting and communication the plan follows:

- ``runner``    — ``meshscope run`` itself: fp32 AdamW, DDP/FSDP2 buffers, autograd's saved
                  tensors counted one by one for its Llama block (``memory.py``), traffic as
                  the runner issues it. The default for the runner's presets.
- ``megatron``  — Megatron-LM / Megatron-Core: bf16 weights with fp32 main gradients in the
                  DDP buffer and fp32 master weights (18 bytes a parameter; 6 + 12/dp with the
                  distributed optimizer, ZeRO-1), Korthikanti et al.'s activations, pipeline
                  sends scattered over tensor-parallel ranks. The default for ``--model-json``.
- ``deepspeed`` — DeepSpeed ZeRO as its own estimator counts it
                  (``estimate_zero2/zero3_model_states_mem_needs``): 16-bit weights and
                  gradients, fp32 master weights, gradients and Adam moments in the optimizer
                  partition, and a gather buffer of the largest layer under ZeRO-3.
- ``torch``     — FSDP2 / DDP with the ZeRO paper's mixed-precision counts (16-bit weights and
                  gradients, K = 12) and the Ultra-Scale Playbook's optional fp32 gradient
                  accumulation buffer (``fp32_grads``).

``precision``: ``fp32``; ``mixed`` (16-bit compute, fp32 master weights); ``bf16`` (bf16
weights and gradients, fp32 optimizer moments, no master copy); ``fp8`` (``mixed`` with the
weights held in fp8 beside the fp32 master copy, and fp8 GEMM inputs: the activations saved
for the linears' backward take one byte, as Transformer Engine's fp8 recipe keeps them, and
the GEMMs run at twice the bf16 rate).

``optimizer``: ``adam`` (two moments), ``sgd`` (momentum) or ``adafactor`` (a factored second
moment: one row and one column vector per matrix, no momentum — its state is counted as 0
bytes a parameter, which it is to within (rows + cols) / (rows · cols)).

``recompute``: ``none``, ``selective`` (Korthikanti et al. 2022, §4.2: the attention core is
recomputed) or ``full`` (only each layer's input is kept; the whole forward runs again in
backward). ``offload``: ``none``, ``optimizer`` (master weights, fp32 gradients and moments
live in CPU memory, the optimizer step runs there) or ``all`` (weights too; ZeRO-3).
"""
from __future__ import annotations

import dataclasses

FRAMEWORKS = ("runner", "megatron", "deepspeed", "torch")
PRECISION_NAMES = ("fp32", "mixed", "bf16", "fp8")
OPTIMIZERS = ("adam", "sgd", "adafactor")
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "all")
BLOCKS = ("llama", "gpt")


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

    def __post_init__(self):
        for name, allowed in (("framework", FRAMEWORKS), ("precision", PRECISION_NAMES),
                              ("optimizer", OPTIMIZERS), ("recompute", RECOMPUTE),
                              ("offload", OFFLOAD), ("block", BLOCKS)):
            if getattr(self, name) not in allowed:
                raise TrainingError(f"{name} {getattr(self, name)!r}: expected one of "
                                    f"{', '.join(allowed)}")
        if self.framework == "runner" and (self.precision != "fp32" or self.recompute != "none"
                                           or self.offload != "none"
                                           or self.optimizer != "adam"):
            raise TrainingError("the runner trains in fp32 with AdamW, no recomputation and no "
                                "offload; plan other settings with --framework megatron, "
                                "deepspeed or torch")

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
        """Bytes of a weight as the model holds it: fp8 keeps its weights in fp8 (Transformer
        Engine's fp8 model parameters; the fp32 master copy stays)."""
        return {"fp32": 4, "fp8": 1}.get(self.precision, 2)

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
        from .precision import Precision
        return Precision(self.precision, self.weight_bytes, self.grad_reduce_bytes, 0,
                         self.act_bytes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


RUNNER = Training()
