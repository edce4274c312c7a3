"""The knobs ``meshscope plan`` searches for a GPU job when they are not given, pruned by
memory before any step is timed.

A team picking a layout turns more than the mesh: the micro-batch size, recomputation and
the data-parallel mode decide whether a layout fits and how fast it runs. A knob given on
the command line is pinned; every knob not given is searched, within each layout
(``SearchSpace``):

- **micro-batch size**: every size that divides the data-parallel rank's share of the global
  batch, from 1 up to the largest that fits (the microbatches follow: local batch / size);
- **recomputation**: none, selective, full (``op``-level selective for the FSDP style, as
  torchtitan names it) — for each micro-batch size and data-parallel mode only the least
  recomputation that fits is kept (more recomputes more, on the same memory it no longer
  needs);
- **data-parallel mode**: DDP, ZeRO-1, ZeRO-2, FSDP resharding after forward and FSDP
  keeping the stage gathered (``fsdp_noreshard``); the style narrows them coherently
  (``STYLE_DP_MODES``: ``--style fsdp`` is FSDP sharding only);
- the mesh (tensor, pipeline, context, expert sizes), the schedules and virtual stages are
  ``enumerate``'s, with the search's defaults (``SEARCHED_*``).

Memory first: a layout whose most frugal variant (the smallest micro-batch, full
recomputation, the most sharded mode) does not fit is dropped after one estimate; within a
layout, micro-batch sizes are tried from the smallest up and stop at the first that fits no
variant (memory grows with the micro-batch), and recomputation starts where the smaller
size needed it. Only what fits is timed. ``Searched`` says how many layouts fit and which
did not; when none fits, ``fit_advice`` names the changes that make one fit.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Callable

from meshscope.theory.schedules import idle_microbatches

from .candidate import DP_MODES, ZERO_STAGE, Candidate
from .devices import DeviceSpec
from .job_compute import TRAINING_DERATE, microbatch_work
from .job_memory import job_memory
from .job_step import JobOptions
from .planner import PlanRow, training_of
from .spec import ModelSpec
from .training import Training

# What is searched when not given.
SEARCHED_RECOMPUTE = ("none", "selective", "full")
FSDP_RECOMPUTE = ("none", "op", "full")        # torchtitan's selective is op-level
SEARCHED_SCHEDULES = ("1f1b", "interleaved-1f1b")
SEARCHED_VIRTUAL = (2, 4)                      # stages a rank, for interleaved schedules
# The data-parallel modes each style runs (None: no --style given, all of them).
STYLE_DP_MODES: dict[str | None, tuple[str, ...]] = {
    None: DP_MODES,
    "megatron": ("ddp", "zero1"),                   # DDP, the distributed optimizer
    "fsdp": ("fsdp", "fsdp_noreshard"),             # FSDP2 with / without resharding
    "deepspeed": ("ddp", "zero1", "zero2", "fsdp"),  # ZeRO stages 0-3
}
# Context parallelism is searched down to this many tokens a context-parallel rank (below
# it the ring's messages are too short to hide; long-sequence jobs are what cp is for).
MIN_CP_TOKENS = 4096


def searched_dims(spec: ModelSpec) -> tuple[str, ...]:
    """The mesh dimensions searched when ``--dims`` is not given: dp, tp, pp, cp where the
    sequence is long enough for it (``MIN_CP_TOKENS`` a rank at cp = 2), ep for a MoE."""
    dims = ["dp", "tp", "pp"]
    if spec.seq_len >= 2 * MIN_CP_TOKENS:
        dims.append("cp")
    if spec.moe_experts:
        dims.append("ep")
    return tuple(dims)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """Which knobs vary within a layout: True where the search chooses them, False where the
    command line pinned them (the base candidates carry the pinned values)."""
    micro_batch: bool
    dp_mode: bool
    recompute: bool

    @property
    def any(self) -> bool:
        return self.micro_batch or self.dp_mode or self.recompute


@dataclasses.dataclass
class Searched:
    """What the search kept: ``fitting`` (every variant that fits, each with the least
    recomputation that fits at its micro-batch size and mode), how many layouts were tried
    and how many fit no variant; ``frugal`` the most frugal variant of every layout with its
    peak bytes, the smallest first (what is shown, marked, when nothing fits), and
    ``memory_checked`` the number of memory estimates made."""
    fitting: list[Candidate]
    layouts: int
    layouts_over_memory: int
    frugal: list[tuple[float, Candidate]]
    memory_checked: int

    @property
    def smallest_peak_bytes(self) -> float | None:
        return self.frugal[0][0] if self.frugal else None


def _group_key(c: Candidate, knobs: Knobs) -> tuple:
    return (str(c.layout), c.schedule, c.virtual, c.stage_layer_counts, c.sp,
            None if knobs.micro_batch else c.microbatches,
            None if knobs.dp_mode else c.dp_mode)


def search(spec: ModelSpec, bases: list[Candidate], training: Training,
           memory_bytes: float, knobs: Knobs, dp_modes: tuple[str, ...],
           recomputes: tuple[str, ...], memory_only: bool = False) -> Searched:
    """Every variant of ``bases`` (one candidate per layout, schedule and microbatch count
    — all counts when the micro-batch size is searched —, with the pinned knobs' values)
    over the searched knobs, pruned by memory (the module docstring). ``memory_only``: each
    layout's most frugal variant alone (whether anything fits, and the smallest peak)."""
    checked = 0

    def peak(c: Candidate) -> float:
        # the first pipeline rank (the most microbatches in flight, the embedding) and the
        # last (the head, the logits) hold the most; the plan's rows count every rank
        nonlocal checked
        checked += 1
        return max(m.total_bytes for m in job_memory(spec, c, training_of(training, c),
                                                     pp_ranks=tuple({0, c.pp - 1})))

    groups: dict[tuple, list[Candidate]] = {}
    for c in bases:
        groups.setdefault(_group_key(c, knobs), []).append(c)
    rcs: tuple[str | None, ...] = recomputes if knobs.recompute else (None,)
    fitting: list[Candidate] = []
    frugal: list[tuple[float, Candidate]] = []
    over = 0
    for members in groups.values():
        # smallest micro-batch first: the most microbatches
        sizes = sorted({c.microbatches: c for c in members}.values(),
                       key=lambda c: -c.microbatches)
        first = sizes[0]
        modes = (dp_modes if first.dp_shards > 1 else ("ddp",)) if knobs.dp_mode \
            else (first.dp_mode,)
        modes = tuple(m for m in modes if m in ZERO_STAGE
                      and (training.offload != "all" or ZERO_STAGE[m] == 3))
        if not modes:           # --offload all: only layouts that shard their weights
            continue
        thrifty = max(modes, key=lambda m: (ZERO_STAGE[m], m == "fsdp"))
        least = dataclasses.replace(first, dp_mode=thrifty, recompute=rcs[-1])
        least_peak = peak(least)
        frugal.append((least_peak, least))
        if least_peak > memory_bytes:
            over += 1
            continue
        if memory_only:
            fitting.append(least)
            continue
        for mode in modes:
            level = 0
            for base in sizes:
                for i in range(level, len(rcs)):
                    c = dataclasses.replace(base, dp_mode=mode, recompute=rcs[i])
                    if c.name == least.name or peak(c) <= memory_bytes:
                        fitting.append(c)
                        level = i
                        break
                else:
                    break           # a larger micro-batch fits no better
    frugal.sort(key=lambda x: x[0])
    return Searched(fitting=fitting, layouts=len(groups), layouts_over_memory=over,
                    frugal=frugal, memory_checked=checked)


@dataclasses.dataclass(frozen=True)
class Change:
    """One change of the command line that makes a layout fit: the flag and value, the
    smallest peak memory a GPU after it, how much less that is than before, and the
    memory a GPU has after it (more than before for a larger device)."""
    flag: str
    value: str
    peak_bytes: float
    frees_bytes: float
    memory_bytes: float

    @property
    def text(self) -> str:
        return f"{self.flag} {self.value}".strip()


@dataclasses.dataclass(frozen=True)
class Try:
    """A change ``fit_advice`` tries: the flag and value, the search after it (None where
    it does not apply) and the device memory it gives; of the tries of one ``group`` (more
    GPUs, a larger device) only the first that fits is named."""
    flag: str
    value: str
    run: Callable[[], "Searched | None"]
    memory_bytes: float
    group: str = ""


def fit_advice(before_bytes: float, tries: list[Try]) -> list[Change]:
    """The changes among ``tries`` after which some layout fits, each with the memory it
    frees (the smallest peak before less after), in the order tried."""
    out = []
    done: set[str] = set()
    for t in tries:
        if t.group and t.group in done:
            continue
        s = t.run()
        if s is None or not s.fitting or s.smallest_peak_bytes is None:
            continue
        out.append(Change(t.flag, t.value, s.smallest_peak_bytes,
                          max(0.0, before_bytes - s.smallest_peak_bytes), t.memory_bytes))
        if t.group:
            done.add(t.group)
    return out


def step_lower_bound_us(spec: ModelSpec, c: Candidate, training: Training, device: DeviceSpec,
                        options: JobOptions) -> float:
    """A step time ``predict_job`` cannot undercut: the first and last pipeline ranks'
    microbatch compute (the slowest rank's is at least theirs; communication, contention,
    FSDP's copies and the optimizer only add) through the schedule's fill and drain, plus
    the fixed overhead. The same for every data-parallel mode of a layout."""
    t = training_of(training, c)
    derate = options.derate if options.derate is not None else TRAINING_DERATE
    mb = max(microbatch_work(spec, c, t, device, r, derate).compute_us
             for r in {0, c.pp - 1})
    p, m, v = c.pp, c.microbatches, c.v
    return mb * (m + idle_microbatches(c.schedule, p, m, v)) + options.step_overhead_us


def fastest(cands: list[Candidate], bound_us: Callable[[Candidate], float],
            time_one: Callable[[Candidate], PlanRow], keep: int, band: float
            ) -> tuple[list[PlanRow], int]:
    """(the rows of the fastest ``cands``, how many were left untimed): candidates are timed
    (``time_one``) in the order of their lower bound (``bound_us``) until the next bound
    exceeds both the ``keep``-th fastest step timed and the fastest × (1 + ``band``) —
    every layout that could rank in the first ``keep`` or tie the fastest is timed
    (branch and bound; the bound never exceeds the step)."""
    bounds = {c.name: bound_us(c) for c in cands}
    order = sorted(cands, key=lambda c: bounds[c.name])
    rows: list[PlanRow] = []
    steps: list[float] = []
    for i, c in enumerate(order):
        if len(steps) >= keep and bounds[c.name] > max(steps[keep - 1],
                                                       steps[0] * (1 + band)):
            return rows, len(order) - i
        row = time_one(c)
        rows.append(row)
        bisect.insort(steps, row.estimate.step_time_us if row.estimate else float("inf"))
    return rows, 0
