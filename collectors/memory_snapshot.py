"""A memory snapshot per rank, on request (``meshscope run --memory-snapshot``): CUDA only.

At the start of the first profiled step the rank asks the caching allocator to record its
history (``torch.cuda.memory._record_memory_history``: a stack trace per block and a log of
its last ``MAX_ENTRIES`` actions); at the end of the last profiled step it dumps a snapshot
(``torch.cuda.memory._dump_snapshot``) to ``memory/rank{R}.pickle`` (``run_dir.snapshot_path``)
and stops recording. ``meshscope analyze`` reads it (``analysis/memory/snapshot.py``): the
segments, the blocks live at the largest moment with their stacks, the free memory held in
segments, and an out-of-memory record if one happened.

The CPU has no caching allocator and PyTorch records no history for it: on a CPU run the rank
says so once on its stderr and writes nothing (the traces' ``[memory]`` events still are).
"""
from __future__ import annotations

import sys

import torch

from .run_dir import snapshot_path

MAX_ENTRIES = 100_000


def at_step_start(step: int, steps: tuple[int, int], device: torch.device) -> None:
    if step != steps[0]:
        return
    if device.type != "cuda":
        print("meshscope: --memory-snapshot needs CUDA (torch.cuda.memory."
              "_record_memory_history); no snapshot is written on this CPU run", file=sys.stderr)
        return
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)


def at_step_end(run_dir, rank: int, step: int, steps: tuple[int, int],
                device: torch.device) -> None:
    if step != steps[1] or device.type != "cuda":
        return
    out = snapshot_path(run_dir, rank)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f".{out.name}.part")
    torch.cuda.memory._dump_snapshot(str(part))
    part.replace(out)
    torch.cuda.memory._record_memory_history(enabled=None)
