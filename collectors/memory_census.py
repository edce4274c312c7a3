"""The runner's own count of where its model states live, written into its trace.

A CPU trace cannot show the memory allocated before the profiler started: PyTorch's CPU
allocator reports to the profiler only while it records (``analysis/memory/series.py``), so
the parameters and the optimizer's state — made before the profiled steps — are in none of its
``[memory]`` events. So at the end of the first profiled step the runner counts them itself and
adds the count to its trace's metadata under ``meshscope_memory`` (``census``, ``record``):

```
{"step": 2, "device": "cpu" | "cuda:0",
 "params_bytes": …, "grads_bytes": …, "optimizer_bytes": …,
 "max_allocated_bytes": {"2": …}}        # CUDA only: torch.cuda.max_memory_allocated
```

Each is the bytes of the *distinct storages* the rank's tensors use — a parameter's local
shard under FSDP (``DTensor.to_local``), each gradient, every tensor of the optimizer's state
(Adam's two moments and its step counters) —, as the allocator was asked for them, each storage
once however many views share it. ``analysis/memory/terms.py`` reads it as the ``census``
source of ``memory_terms``; ``meshscope/layouts/memory_vs_plan.py`` holds it against the
planner's model states.
"""
from __future__ import annotations

import json

import torch

KEY = "meshscope_memory"


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages of ``tensors`` (DTensors by their local shard)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        s = _local(t).untyped_storage()
        key = (str(s.device), s.data_ptr())
        seen[key] = max(seen.get(key, 0), s.nbytes())
    return sum(seen.values())


def census(params: list, optimizer: torch.optim.Optimizer, step: int, device: torch.device,
           max_allocated_bytes: int | None = None) -> dict:
    """The count of the module docstring for ``params`` and ``optimizer`` at ``step``."""
    states = [v for st in optimizer.state.values() for v in st.values()
              if isinstance(v, torch.Tensor)]
    label = "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
    out = {"step": step, "device": label, "params_bytes": storage_bytes(params),
           "grads_bytes": storage_bytes(p.grad for p in params if p.grad is not None),
           "optimizer_bytes": storage_bytes(states)}
    if max_allocated_bytes is not None:
        out["max_allocated_bytes"] = {str(step): int(max_allocated_bytes)}
    return out


def record(prof, doc: dict) -> None:
    """Add ``doc`` to the trace the profiler ``prof`` is recording (it must be recording)."""
    prof.add_metadata_json(KEY, json.dumps(doc))
