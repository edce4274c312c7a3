"""The words meshscope's tables, reports and pages share — each defined here once.

A value that crosses a module boundary as a string (a column's value, a summary field, a CLI
choice) has its allowed set here, as a ``Literal`` type for annotations and a tuple of the same
names for checks and loops; modules import these rather than spelling the tuple again. This
module sits at the bottom of the layers (docs/architecture.md) beside ``meshscope.theory``:
standard library only, importable by everything.

- ``Dim`` / ``PARALLEL_DIMS``: the five parallel dimensions of a layout (``dp=2,tp=2,pp=2``),
  in the order a layout is written.
- ``CommDim`` / ``COMM_DIMS``: the dimension a communication operation is attributed to —
  the five, plus ``ep_replica`` (the data-parallel replicas of one expert: MoE gradients reduced
  across the ranks that hold the same expert) and ``unknown``.
- ``DimSource`` / ``DIM_SOURCES``: which evidence decided an operation's dimension, most direct
  first (``analysis/comm/dims.py`` explains each).
- ``Op`` / ``OPS``: the canonical names of communication operations, as ``meshscope.theory``'s
  bus factors and the report's ``op`` columns spell them.
- ``FindingId`` (an Enum whose members are their id strings) / ``FINDING_IDS``: every finding
  a report can hold (``analysis/report/findings.py``, ``device_findings.py`` and
  ``memory_findings.py`` define when each fires); the exposed-communication finding is one id
  per dimension, ``exposed_comm_id(dim)``.
- ``StepTimeSource`` / ``STEP_TIME_SOURCES``: what a report's headline step time is, with the
  label every reader shows beside it.
- ``IdleCause`` / ``IDLE_CAUSES``: what a GPU's idle time is charged to, in the order the
  analysis charges it (``analysis/gpu/idle.py``; the report's ``idle_<cause>_us`` columns).
- ``Severity`` / ``SEVERITIES``, ``Device`` / ``DEVICES``.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

Dim = Literal["dp", "tp", "pp", "cp", "ep"]
PARALLEL_DIMS: tuple[Dim, ...] = get_args(Dim)

# The runner's device mesh, outermost dimension first (pipeline outermost, as torchtitan lays it
# out; tp innermost, on the closest devices); a rank's coordinates are written in this order, ep
# (which lives inside dp × cp) last.
MESH_ORDER: tuple[Dim, ...] = ("pp", "dp", "cp", "tp")
COORDINATE_ORDER: tuple[Dim, ...] = (*MESH_ORDER, "ep")

CommDim = Literal["dp", "tp", "pp", "cp", "ep", "ep_replica", "unknown"]
COMM_DIMS: tuple[CommDim, ...] = get_args(CommDim)
UNKNOWN_DIM: CommDim = "unknown"
# The order in which overlapping communication of several dimensions is credited as exposed
# (the report's ``exposed_comm_<dim>_us`` columns, in this order; what no listed dimension
# claims, ``ep_replica`` included, is ``unknown``).
EXPOSED_COMM_ORDER: tuple[CommDim, ...] = ("pp", "tp", "cp", "ep", "dp", "unknown")

DimSource = Literal["trace", "run.json", "flight_recorder", "--layout", "scope", "layout",
                    "world", "unknown"]
DIM_SOURCES: tuple[DimSource, ...] = get_args(DimSource)

Op = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
             "send", "recv", "send_recv", "gather", "scatter"]
OPS: tuple[Op, ...] = get_args(Op)

IdleCause = Literal["dataloader", "sync", "wait_rank", "startup", "launch", "cpu", "queued",
                    "other"]
IDLE_CAUSES: tuple[IdleCause, ...] = get_args(IdleCause)

Severity = Literal["high", "medium", "low"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)

Device = Literal["cpu", "gpu"]
DEVICES: tuple[Device, ...] = get_args(Device)

StepTimeSource = Literal["timer", "replayed", "window"]
STEP_TIME_SOURCES: dict[StepTimeSource, str] = {
    "timer": "step timer: the slowest rank's step, median over the non-warm-up steps",
    "replayed": "replayed makespan of the profiled steps across ranks (mean)",
    "window": "the longest rank's profiled step window (mean over profiled steps)",
}

#: What a memory block was made in (``memory_live.phase``, ``analysis/memory/rank_memory.py``):
#: the forward (a module or a forward range), the backward (the autograd engine's functions),
#: the optimizer (its step or zero_grad); a block made elsewhere in a step has none.
MemoryPhase = Literal["forward", "backward", "optimizer"]
MEMORY_PHASES: tuple[MemoryPhase, ...] = get_args(MemoryPhase)


class FindingId(StrEnum):
    """Every finding a report can hold, by its id (``analysis/report/findings.py``,
    ``device_findings.py`` and ``memory_findings.py`` define when each fires). A member is its
    id string (``FindingId.HANG == "hang"``), as summary.json writes it; the exposed-
    communication finding is one id per dimension of ``COMM_DIMS`` (``exposed_comm_id``)."""
    HANG = "hang"
    DESYNC = "desync"
    STRAGGLER = "straggler"
    HOST_BOUND = "host-bound"
    STAGE_IMBALANCE = "stage-imbalance"
    PIPELINE_BUBBLE = "pipeline-bubble"
    SLOW_STEPS = "slow-steps"
    DATA_LOADING_STALL = "data-loading-stall"
    SYNC_STALL = "sync-stall"
    LAUNCH_BOUND = "launch-bound"
    MEMCPY_ON_CRITICAL_PATH = "memcpy-on-critical-path"
    ARRIVAL_JITTER = "arrival-jitter"
    LOW_GEMM_EFFICIENCY = "low-gemm-efficiency"
    GPU_IDLE = "gpu-idle"
    NEAR_OOM = "near-oom"
    MEMORY_IMBALANCE = "memory-imbalance"
    MEMORY_GROWTH = "memory-growth"
    MEMORY_FRAGMENTATION = "memory-fragmentation"
    LARGEST_ALLOCATOR = "largest-allocator"
    EXPOSED_COMM_DP = "exposed-comm-dp"
    EXPOSED_COMM_TP = "exposed-comm-tp"
    EXPOSED_COMM_PP = "exposed-comm-pp"
    EXPOSED_COMM_CP = "exposed-comm-cp"
    EXPOSED_COMM_EP = "exposed-comm-ep"
    EXPOSED_COMM_EP_REPLICA = "exposed-comm-ep_replica"
    EXPOSED_COMM_UNKNOWN = "exposed-comm-unknown"


EXPOSED_COMM_PREFIX = "exposed-comm-"
FINDING_IDS: tuple[str, ...] = tuple(f.value for f in FindingId)


def exposed_comm_id(dim: str) -> FindingId:
    """The id of the exposed-communication finding of ``dim`` (``exposed-comm-pp``)."""
    if dim not in COMM_DIMS:
        raise ValueError(f"unknown communication dimension {dim!r}; one of {COMM_DIMS}")
    return FindingId(EXPOSED_COMM_PREFIX + dim)


# -- trust: what a report's numbers rest on (analysis/trust/, docs/metrics.md "Trust") -------

TrustVerdict = Literal["trusted", "usable with caveats", "not trustworthy"]
TRUST_VERDICTS: tuple[TrustVerdict, ...] = get_args(TrustVerdict)

#: A failed check's severity, and the verdict it gives its rank (or the run).
TRUST_SEVERITIES: dict[str, TrustVerdict] = {"caveat": "usable with caveats",
                                             "untrustworthy": "not trustworthy"}


class TrustCheckId(StrEnum):
    """Every check of the evidence (``analysis/trust/rank_checks.py`` per rank,
    ``analysis/trust/run_checks.py`` across ranks; docs/metrics.md "Trust")."""
    BAD_DURATIONS = "bad-durations"
    ZERO_DURATIONS = "zero-durations"
    OVER_LONG = "over-long"
    LAUNCH_SKEW = "launch-skew"
    STREAM_OVERLAP = "stream-overlap"
    DROPPED_ACTIVITY = "dropped-activity"
    CUT_SHORT = "cut-short"
    TIMESTAMP_PRECISION = "timestamp-precision"
    MISSING_RANKS = "missing-ranks"
    DIFFERENT_STEPS = "different-steps"
    COLLECTIVE_COUNTS = "collective-counts"
    CLOCK_OFFSETS = "clock-offsets"


TRUST_CHECK_IDS: tuple[str, ...] = tuple(c.value for c in TrustCheckId)

#: The numbers a failed check can affect, as a caveat names them (``TrustCheck.affects``) and
#: a finding's ``caveats`` are matched against them.
TrustNumber = Literal["step breakdown", "kernel times", "GPU idle", "launch latency",
                      "operators", "exposed communication", "waits and straggler",
                      "pipeline bubble", "bandwidth", "step time", "memory"]
TRUST_NUMBERS: tuple[TrustNumber, ...] = get_args(TrustNumber)
