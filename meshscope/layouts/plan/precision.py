"""Bytes per element of each kind of training state.

``fp32`` is what ``meshscope run`` does: fp32 weights, gradients and activations, AdamW with two
fp32 moments (K = 8 bytes of optimizer state per parameter). ``mixed`` is the ZeRO paper's
mixed-precision Adam (Rajbhandari et al., 2020, §3.1): 16-bit weights and gradients (2 + 2
bytes) and K = 12 bytes of fp32 master weights, momentum and variance, with 16-bit
activations and 16-bit collectives — the usual setting of a GPU job.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Precision:
    name: str
    param_bytes: int        # a weight as the model computes with it
    grad_bytes: int         # its gradient (and what data parallelism reduces)
    optimizer_bytes: int    # K: optimizer state per parameter
    act_bytes: int          # an activation element (and what tp/pp/cp/ep move)


PRECISIONS = {
    "fp32": Precision("fp32", 4, 4, 8, 4),
    "mixed": Precision("mixed", 2, 2, 12, 2),
}


def precision_of(p: "Precision | str") -> Precision:
    """A ``Precision`` from itself or its name (``fp32``, ``mixed``)."""
    return PRECISIONS[p] if isinstance(p, str) else p
