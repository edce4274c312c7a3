"""The PyTorch profiler set up for a run: which steps are traced, and where the trace goes.

Profiled steps are given as an inclusive range ``(first, last)`` of 0-based step indices; the
step before ``first`` (when there is one) is the profiler's warm-up, which is not recorded. The
trace of rank R is written to ``traces/rank{R}.json.gz`` with the run's metadata embedded under
the key ``meshscope``; the profiler itself adds ``distributedInfo`` (rank, world size, backend).

Shapes without values. Analysis needs ``record_shapes`` (on CPU the ``Input Dims`` and
``Input type`` of ``gloo:*`` ranges are the only source of message bytes), but with it torch
2.13 also records each op's "Concrete Inputs", and that distorts the profiled steps: measured on
this project's CPU runs, resident memory grew by roughly a step's activations per profiled step
(pytorch/pytorch#133444 describes inputs held until the profiler stops), the profiled steps ran
about 10% slower than the unprofiled ones, and once a VM's host-backed memory ran out the later
profiled steps ran 1.7× slower. ``shapes_without_values`` turns the concrete-input recording
off; shapes, strides and dtypes are still recorded, memory grows no more than with
``record_shapes=False`` (tests/test_profiling.py), and profiled steps take as long as the
others to within a few percent.

A resident heap. Even without input values the profiler's event storage grows with every op,
so each profiled step lifts the process's memory peak into fresh pages, and where fresh pages
are expensive (a VM whose host reclaims free memory) the step's memory peak runs slower than
the rest of it. ``at_step_start`` grows and keeps the heap before the window (``heap.reserve``,
``HEAP_RESERVE_PER_STEP_BYTES`` per profiled step), so the profiled steps grow into pages the
process already holds. Writing those pages takes time (on a VM whose free memory is all
host-reclaimed, about 2.4 s for 768 MiB), and ranks finish it at different moments; the ranks
then meet (``rendezvous.meet_all_ranks``, which is not a collective of the job) before the
step's timer starts, so no step's wall time holds the reserve or another rank's wait for it
(otherwise the step before the window shows up as a slow step).
A window that starts at step 0 has no step before it: there is no reserve, and its steps pay
the faults (as the first step pays its warm-up anyway).

Memory. The profiler records the allocator's ``[memory]`` events (``profile_memory``, on by
default; ``meshscope run --no-profile-memory`` turns it off): one instant event per allocation
and free. Measured on this project's CPU runs (``bench/memory_overhead.py``, docs/
benchmarks.md, a pp=2 tiny run, 3 runs each side by side): the traces 25% larger, the profiled
steps' median 9% longer (44.0 against 40.3 ms; the runs' own spread is larger) and
``meshscope analyze`` 7% longer.
"""
from __future__ import annotations

import gzip
import json
import os
import pathlib
import shutil

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from . import heap, rendezvous
from .run_dir import trace_path

# Heap kept resident for each profiled step: the profiler's storage grew 100–220 MB per step on
# this project's CPU runs (13–26k ops per step).
HEAP_RESERVE_PER_STEP_BYTES = 256 << 20
# The trace's gzip level. torch's ``export_chrome_trace`` to a ``.gz`` path compresses at level
# 9, line by line; level 6 in 1 MiB blocks took a fifth of the time on this project's traces
# (0.08 s against 0.39 s for 6 MB of JSON) for files about 15% larger.
TRACE_GZIP_LEVEL = 6


def shapes_without_values() -> bool:
    """Stop the profiler from recording op input values (the memory growth described above);
    keep shapes.

    Process-wide. Returns False where this torch has no such switch (then the growth
    described above applies).
    """
    switch = getattr(torch._C._profiler, "_set_record_concrete_inputs_enabled_val", None)
    if switch is None:
        return False
    switch(False)
    return True


def write_trace(prof: profile, out: pathlib.Path) -> None:
    """The profiler's Chrome trace as ``out`` (gzipped at ``TRACE_GZIP_LEVEL``). It appears
    whole or not at all: the JSON and the compressed file have hidden names beside it, which no
    reader takes for a trace (they do not end in .json or .json.gz), until the rename."""
    raw = out.with_name(f".{out.name}.{os.getpid()}.raw")
    packed = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as fin, \
                gzip.open(packed, "wb", compresslevel=TRACE_GZIP_LEVEL) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        os.replace(packed, out)
    finally:
        raw.unlink(missing_ok=True)
        packed.unlink(missing_ok=True)


def make_profiler(run_dir: pathlib.Path, rank: int, steps: tuple[int, int],
                  device: torch.device, meta: dict, profile_memory: bool = True) -> profile:
    """The profiler of ``steps`` for rank ``rank``; ``profile_memory``: the allocator's
    ``[memory]`` events too (every allocation and free, with the allocator's totals; the
    analysis' memory tables, docs/memory.md)."""
    first, last = steps
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    out = trace_path(run_dir, rank)

    def on_trace_ready(prof: profile) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_trace(prof, out)

    shapes_without_values()
    prof = profile(
        activities=activities,
        schedule=schedule(wait=max(first - 1, 0), warmup=1 if first >= 1 else 0,
                          active=last - first + 1, repeat=1),
        on_trace_ready=on_trace_ready,
        record_shapes=True,
        profile_memory=profile_memory,
    )
    # Metadata only reaches the trace when it is added while the profiler records; the first
    # profiled step is the first such moment (see ``at_step_start``).
    prof.meshscope_meta = meta
    return prof


def _available_bytes() -> int:
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def heap_reserve_bytes(steps: tuple[int, int]) -> int:
    """The heap to keep for the profiled ``steps``: ``HEAP_RESERVE_PER_STEP_BYTES`` each, but no
    more than a quarter of the available memory shared among this host's ranks."""
    first, last = steps
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return min(HEAP_RESERVE_PER_STEP_BYTES * (last - first + 1),
               _available_bytes() // (4 * ranks_here))


def at_step_start(prof: profile, step: int, steps: tuple[int, int]) -> None:
    """Call at the start of every step, before its timer starts, on every rank. In the step
    before the profiled window it reserves the heap and waits for the other ranks to do the
    same (see the module doc); once recording has begun it adds the run metadata."""
    first, _ = steps
    if step == first - 1:
        heap.reserve(heap_reserve_bytes(steps))
        rendezvous.meet_all_ranks()
    if step == first:
        prof.add_metadata_json("meshscope", json.dumps(prof.meshscope_meta))
