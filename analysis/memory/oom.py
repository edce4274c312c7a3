"""An out-of-memory error explained, from the memory snapshot taken at it (issue 48).

A snapshot whose log ends with an ``oom`` action (``snapshot.py``) knows the failing request,
what the device still had free, and every block live at that moment with the stack that
allocated it. ``explain(summary)`` says what the device held then, by kind — told by the
blocks' stacks, innermost frame first, the first rule that matches:

============== =============================================================================
kind           a frame of its stack
============== =============================================================================
optimizer      in ``torch/optim/`` (Adam's moments are made at the optimizer's first step)
gradients      of the backward pass (``backward``, ``autograd``)
weights        loading or placing parameters (``load_state_dict``, ``from_pretrained``,
               ``nn/parameter.py``, ``reset_parameters``, a module's ``_apply`` / ``to`` /
               ``cuda``, safetensors, a checkpoint loader)
activations    a module's ``forward`` (what the forward keeps, or makes, beside the weights)
other          none of these, or no stack (the snapshot recorded none)
============== =============================================================================

and the allocator's cache (reserved but not allocated); the largest sites (the innermost
frame outside torch); how far the request was from fitting (what it asked for less what was
free); and which kinds, freed or shrunk, would cover that — each with the change an engineer
makes for it (``REMEDIES``), in numbers.
"""
from __future__ import annotations

import dataclasses
import re

from .snapshot import Frame, Snapshot, _live_after, _replay, _site, summarise

KINDS = ("optimizer", "gradients", "weights", "activations", "other")
_RULES = (
    ("optimizer", re.compile(r"torch/optim/")),
    ("gradients", re.compile(r"\bbackward\b|autograd")),
    ("weights", re.compile(r"load_state_dict|_load_from_state_dict|from_pretrained|"
                           r"nn/parameter\.py|reset_parameters|safetensors|load_checkpoint|"
                           r"module\.py:\d+ in (?:_apply|to|cuda)\b")),
    ("activations", re.compile(r" in forward$")),
)
REMEDIES = {
    "optimizer": "shard the optimizer state (ZeRO-1/FSDP) or keep it in lower precision",
    "gradients": "shard the gradients (ZeRO-2/FSDP), or accumulate over smaller microbatches",
    "weights": "shard the weights (FSDP, tensor parallelism), offload them, or load them in "
               "lower precision",
    "activations": "recompute activations, a smaller microbatch, sequence or context "
                   "parallelism; fused attention never keeps the attention scores",
    "other": "find what the largest site keeps (the stacks below)",
    "allocator cache": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the allocator "
                       "reuse what it holds cached",
}


def kind_of(frames: list[Frame]) -> str:
    """The kind of a block (module docstring) from the stack that allocated it."""
    lines = [f"{f.filename}:{f.line} in {f.name}" for f in frames]
    for kind, rule in _RULES:
        if any(rule.search(line) for line in lines):
            return kind
    return "other"


@dataclasses.dataclass(frozen=True)
class OomExplained:
    """What an out-of-memory error's snapshot says (module docstring)."""
    requested_bytes: int
    device_free_bytes: int | None
    shortfall_bytes: int | None          # requested less free: how far from fitting
    held_bytes: dict[str, int]           # kind (and "allocator cache") -> bytes held then
    sites: list[tuple[str, str, int]]    # (site, kind, bytes), largest first (5 at most)
    fits_if: list[str]                   # the changes that would cover the shortfall
    capacity_bytes: int | None = None    # reserved + free at the error: what this process saw

    def text(self) -> str:
        """One paragraph: what was held, by kind, and what would make it fit."""
        held = ", ".join(f"{k} {_mib(v)}" for k, v in self.held_bytes.items() if v)
        if self.capacity_bytes:
            held += (f" (of about {_mib(self.capacity_bytes)}: reserved and free at the "
                     f"error; other processes' memory is not seen)")
        far = "" if self.shortfall_bytes is None else \
            f"; it was {_mib(self.shortfall_bytes)} from fitting"
        fits = f"; it fits if: {'; or '.join(self.fits_if)}" if self.fits_if else ""
        return f"the device held {held or 'nothing the snapshot shows'}{far}{fits}"


def _mib(n: int | float) -> str:
    return f"{n / (1 << 30):,.2f} GiB" if abs(n) >= 1 << 30 else f"{n / (1 << 20):,.2f} MiB"


def explain(snap: Snapshot, device: int) -> OomExplained | None:
    """The explanation of the device's last ``oom`` action (module docstring), from the
    blocks live at that moment (``snapshot._live_after``); None without one."""
    o = summarise(snap, device).oom
    if o is None:
        return None
    log, _, _, end_live = _replay(snap, device)
    oom_index = max(i for i, e in enumerate(log) if e.action == "oom")
    live = _live_after(log, oom_index, end_live)
    held = {k: 0 for k in KINDS}
    by_site: dict[tuple[str, str], int] = {}
    for size, frames in live.values():
        kind = kind_of(frames)
        held[kind] += size
        key = (_site(frames), kind)
        by_site[key] = by_site.get(key, 0) + size
    held["allocator cache"] = max(o.reserved_bytes - o.allocated_bytes, 0)
    shortfall = None if o.device_free_bytes is None else \
        max(o.requested_bytes - o.device_free_bytes, 0)
    fits = []
    if shortfall is not None:
        for kind, nbytes in sorted(held.items(), key=lambda kv: -kv[1]):
            if nbytes >= shortfall and nbytes > 0:
                fits.append(f"{kind} ({_mib(nbytes)} held) shrink by {_mib(shortfall)}: "
                            f"{REMEDIES[kind]}")
    sites = sorted(((s, k, b) for (s, k), b in by_site.items()), key=lambda t: -t[2])[:5]
    capacity = None if o.device_free_bytes is None else o.reserved_bytes + o.device_free_bytes
    return OomExplained(o.requested_bytes, o.device_free_bytes, shortfall, held, sites, fits,
                        capacity)
