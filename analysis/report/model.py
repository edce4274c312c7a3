"""The report's records that its writers and readers share, each defined once.

A finding is made by the analysers (``findings.py``, ``device_findings.py``,
``memory_findings.py``), written into summary.json by ``summary.py`` (``codec.encode``) and
read back by every reader — the CLI text, ``--json``, compare, the static report, the dashboard
— through ``reader.read_summary`` (``codec.decode``): one class, so a field cannot mean one
thing where it is made and another where it is shown. Its ``id`` is a ``vocabulary.FindingId``:
an analyser cannot make a finding of an id the vocabulary does not hold (``ValueError``); a
report written by another version that holds one is still read (the id kept as its string).

============== ============================================================================
field          meaning
============== ============================================================================
id             ``FindingId`` (its string in summary.json)
severity       ``high`` (≥ 10% of the step), ``medium`` (≥ 3%) or ``low``
dimension      the communication dimension it concerns, ``all``, or None
cost_us        the what-if saving per step (µs); None for hangs, desyncs and memory
cost_pct       cost_us over the report's headline step time × 100
title          one line
evidence       the numbers and the ranks, group, step behind it
remedy         what to change
what_if        ``step_time_us`` after the remedy and the ``assumption`` it rests on
symptoms       other observations this finding explains (the waits of the straggler's peers)
peak_saving_   memory findings: by how much the remedy lowers the memory peak (bytes)
bytes
cites          the report tables and rows the finding rests on (``Citation``)
caveats        the trust checks that failed on the numbers it rests on (``TrustCheck.check``:
               ``analysis/trust/``); empty when they all passed
============== ============================================================================
"""
from __future__ import annotations

import dataclasses
from typing import Any

from meshscope.vocabulary import (IDLE_CAUSES, STEP_TIME_SOURCES, TRUST_VERDICTS, FindingId,
                                  TrustCheckId)

#: summary.json's schema version: 5 adds ``trust`` (the evidence's verdict, docs/metrics.md
#: "Trust") and each finding's ``cites`` and ``caveats``; 4 writes every record's every field (null where unknown) and
#: no longer ``gpu_idle_per_rank_mean[].idle_us`` (the breakdown's ``per_rank_mean[].idle_us`` is
#: the one idle total); 3 named the three step times apart; 2 wrote the replayed makespan as
#: ``step_time_us``; 1 had no flight_recorder table. ``reader.read_summary`` reads them all.
REPORT_SCHEMA_VERSION = 5

#: Short labels of the step-time sources, for a table's column or a chart's axis.
SHORT = {"timer": "step timer", "replayed": "replayed", "window": "profiled window"}


@dataclasses.dataclass(frozen=True)
class Citation:
    """One piece of the evidence a finding rests on: rows of one report table. ``table`` is a
    table of the registry (``tables.COLUMNS``: ``rank_waits``, ``breakdown``, ``kernels``…) or
    ``summary`` for a field of summary.json; the rows are those whose ``rank`` and ``step``
    (where given) and every column of ``keys`` equal the values given. ``page`` is the dashboard
    page that shows them (``dashboard/state.PAGES``)."""
    table: str
    rank: int | None
    step: int | None
    keys: dict[str, Any]
    page: str | None


@dataclasses.dataclass
class Finding:
    """One finding (module docstring, field by field)."""
    id: FindingId
    severity: str
    dimension: str | None
    cost_us: float | None
    cost_pct: float | None
    title: str
    evidence: dict[str, Any]         # name -> number, text or list: what the finding rests on
    remedy: str
    what_if: dict[str, Any] = dataclasses.field(default_factory=dict)
    symptoms: list[Any] = dataclasses.field(default_factory=list)
    peak_saving_bytes: float | None = None
    cites: list[Citation] = dataclasses.field(default_factory=list)
    caveats: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.id = FindingId(self.id)          # ValueError for an id the vocabulary lacks


# -- the headline step time --------------------------------------------------------------

#: The headline step time is the first known of these, measured before modelled: the step
#: timers (every non-warm-up step), else the profiled window, else the replayed makespan.
HEADLINE_ORDER = ("timer", "window", "replayed")


def choose_headline(timer: float | None, replayed: float | None, window: float | None
                    ) -> tuple[float | None, str | None]:
    """(the headline step time, its source) — the one place it is chosen (``HEADLINE_ORDER``):
    ``analysis/report/summary.py`` writes it, this reader reads every report with it, and the
    findings' cost % is taken against it (``analyze``)."""
    known = {"timer": timer, "window": window, "replayed": replayed}
    return next(((known[k], k) for k in HEADLINE_ORDER if known[k] is not None), (None, None))


# -- summary.json, typed: the analysis builds these (``summary.py``), ``codec.encode`` writes
# them, ``reader.read_summary`` reads every schema into them (``codec.decode``). Each record's
# fields are summary.json's keys in the order written; the JSON Schema is generated from them
# (``summary_schema``). A row of a report table carries that table's registered columns
# (``tables.COLUMNS``; tests/test_summary_schema.py holds the two equal).

@dataclasses.dataclass(frozen=True)
class StepTime:
    """The headline step time and the three it was chosen from (``choose_headline``), as
    summary.json's ``step_time_*`` fields hold them."""
    us: float | None                 # the headline: timer, else window, else replayed
    source: str | None               # "timer" | "replayed" | "window" | None
    timer_us: float | None
    replayed_us: float | None
    window_us: float | None

    @property
    def label(self) -> str:
        """What the headline is, in words (a tooltip or a footnote)."""
        labels: dict[str, str] = {str(k): v for k, v in STEP_TIME_SOURCES.items()}
        return labels.get(self.source or "", "unknown")

    @property
    def short(self) -> str:
        return SHORT.get(self.source or "", "-")

    @property
    def ms(self) -> float | None:
        return None if self.us is None else self.us / 1e3

    def text(self) -> str:
        """``"202.84 ms (step timer)"``, or ``"-"``."""
        return "-" if self.us is None else f"{self.us / 1e3:.2f} ms ({self.short})"


@dataclasses.dataclass(frozen=True)
class RunDevice:
    """``run.device``: the device run.json names and its dense peak FLOP/s where known."""
    type: str | None
    name: str | None
    peak_flops: float | None


@dataclasses.dataclass(frozen=True)
class RunModel:
    """``run.model``: the model's preset, parameters and FLOPs per token (run.json)."""
    preset: str | None
    n_params: int | None
    flops_per_token: float | None


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """``run``: what run.json says of the run (null for a plain folder of traces)."""
    run_id: str | None
    layout_str: str | None
    layout: dict[str, int]           # dimension -> size
    world_size: int | None
    schedule: str | None
    microbatches: int | None
    virtual_stages: int | None
    steps: int | None
    profile_steps: list[int] | None
    status: str | None
    device: RunDevice
    model: RunModel


@dataclasses.dataclass(frozen=True)
class Environment:
    """``environment``: what the run ran on and how it was recorded, as the traces and
    run.json say — each the distinct values over the ranks, sorted (two values: the ranks
    disagree; empty: nothing says). Two runs compare like for like only where these agree
    (``analysis/compare/alike.py``)."""
    devices: list[str]                   # deviceProperties' first device ("NVIDIA A100 …")
    device_counts: list[int]             # the devices each trace's deviceProperties lists
    world_sizes: list[int]               # distributedInfo.world_size, else run.json's
    backends: list[str]                  # distributedInfo.backend: nccl, gloo …
    nccl_versions: list[str]             # distributedInfo.nccl_version
    cuda_runtime_versions: list[str]     # "12.4" (the trace's cuda_runtime_version)
    cuda_driver_versions: list[str]
    torch_versions: list[str]            # run.json's versions.torch (traces do not say)
    profiler_settings: list[str]         # "record_shapes profile_memory …" per rank
    step_definitions: list[str]          # "ProfilerStep", "annotation", "whole trace"


@dataclasses.dataclass(frozen=True)
class Throughput:
    """``throughput``: the step timers' medians over the non-warm-up ``steps``
    (``records/steps.throughput_summary``); null without step timers."""
    step_time_us: float | None
    tokens_per_s: float | None
    mfu_pct: float | None
    steps: list[int]


@dataclasses.dataclass(frozen=True)
class RankMean:
    """One row of ``per_rank_mean``: a rank's step breakdown (``breakdown.parquet``'s columns
    but ``step``), mean over the profiled steps (``analysis/timeline/breakdown.py``).
    ``compute_us`` is all compute; the part not overlapped by communication is
    ``compute_without_overlap_us``."""
    rank: int
    window_us: float | None
    compute_us: float | None
    comm_us: float | None
    overlapped_comm_us: float | None
    exposed_comm_us: float | None
    bubble_us: float | None
    other_us: float | None
    idle_us: float | None
    overlap_pct: float | None
    exposed_comm_pp_us: float | None
    exposed_comm_tp_us: float | None
    exposed_comm_cp_us: float | None
    exposed_comm_ep_us: float | None
    exposed_comm_dp_us: float | None
    exposed_comm_unknown_us: float | None

    @property
    def exposed_by_dim_us(self) -> dict[str, float]:
        """dimension (and ``unknown``) -> exposed communication, where known."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name.startswith("exposed_comm_") and f.name != "exposed_comm_us" \
                    and v is not None:
                out[f.name[len("exposed_comm_"):-3]] = float(v)
        return out

    @property
    def compute_without_overlap_us(self) -> float | None:
        if self.compute_us is None or self.overlapped_comm_us is None:
            return None
        return self.compute_us - self.overlapped_comm_us


@dataclasses.dataclass(frozen=True)
class TraceOverlap:
    """One row of ``trace_overlap``: a rank's compute, communication and their overlap over
    its whole trace (not only the profiled steps)."""
    rank: int
    compute_us: float | None
    comm_us: float | None
    overlapped_comm_us: float | None
    overlap_pct: float | None


@dataclasses.dataclass(frozen=True)
class Stage:
    """One row of ``pipeline_stages``: the share of the pipeline window the stage computes
    nothing, measured, in the schedule's closed form and replayed."""
    stage: int
    bubble_fraction: float | None
    theory_fraction: float | None
    ranks: list[int]
    replayed_bubble_fraction: float | None


@dataclasses.dataclass(frozen=True)
class StageImbalance:
    """``stage_imbalance_measured``: the stages' compute per microbatch, max over mean, and
    the slowest stage (``stage_imbalance.parquet``)."""
    max_over_mean: float
    slowest_stage: int
    slowest_compute_per_mb_us: float | None


@dataclasses.dataclass(frozen=True)
class ReplayedImbalance:
    """``stage_imbalance_without_straggler``: the stage balance replayed with the straggler at
    its peers' pace (``crossrank/whatif.py``): the saving of balancing the stages, max over
    mean of the stages' own work, the slowest stage, each stage's work (stage -> µs)."""
    saving_us: float | None
    max_over_mean: float
    slowest_stage: int
    stage_work_us: dict[str, float]


@dataclasses.dataclass(frozen=True)
class ClockOffset:
    """One row of ``clock_offsets`` (``clock_offsets.parquet``): a rank's clock against the
    reference rank's, the uncertainty of that estimate, the matched operations it rests on
    (``n``), how it was estimated, and the offset the analysis subtracted from its times
    (``applied_us``: 0 when the offset was within twice its uncertainty)."""
    rank: int
    offset_us: float | None
    uncertainty_us: float | None
    n: int | None
    source: str | None               # "reference", "collectives", "send/recv"…
    applied_us: float | None


@dataclasses.dataclass(frozen=True)
class Straggler:
    """``cross_rank.straggler``: the rank whose own work, run at its reference pace (its
    stage peers' median), shortens the replayed step the most, above the run's noise."""
    rank: int
    saving_us: float | None          # what-if saving per step
    saving_pct: float | None         # of the replayed step
    reference: str | None            # "stage peers [0]"
    peers: list[int]
    noise_us: float | None
    floor_us: float | None
    gate_us: float | None            # twice the what-if's resolution
    stage: int | None
    critical_path_share: float | None
    wait_caused_us: float | None

    @property
    def evidence(self) -> dict[str, Any]:
        """Its scalar fields, as written (the evidence sentence)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not isinstance(getattr(self, f.name), (list, dict))}


@dataclasses.dataclass(frozen=True)
class RankSaving:
    """One row of ``cross_rank.rank_savings``: a rank's what-if saving, the wait it spent and
    the wait it caused its peers."""
    rank: int
    saving_us: float | None
    saving_pct: float | None
    reference: str | None
    wait_us: float | None
    wait_caused_us: float | None


@dataclasses.dataclass(frozen=True)
class CrossRank:
    """``cross_rank``: whether the collectives matched across ranks (and on what), why not,
    the run's noise, the what-if's floor and resolution, the straggler and each rank's
    saving."""
    matchable: bool
    why_not: list[str]               # why collectives could not be matched, if they could not
    matched_on: str | None
    noise_us: float | None           # the step-to-step noise
    floor_us: float | None           # the what-if's own floor
    resolution_us: float | None
    straggler: Straggler | None
    rank_savings: list[RankSaving]

    def saving_of(self) -> dict[int, float]:
        """rank -> what-if saving (us) of every rank that has one."""
        return {r.rank: r.saving_us for r in self.rank_savings if r.saving_us is not None}

    def wait_caused_of(self) -> dict[int, float]:
        return {r.rank: r.wait_caused_us for r in self.rank_savings
                if r.wait_caused_us is not None}


@dataclasses.dataclass(frozen=True)
class Hang:
    """One Flight Recorder verdict (``hangs``; a row of ``flight_recorder.parquet``): a group's
    operation that some ranks never reached (``missing``) or disagreed on (``mismatch``)."""
    process_group: str | None
    group_desc: str | None
    seq: int | None
    kind: str | None
    op: str | None
    verdict: str | None
    ranks_present: list[int]
    ranks_missing: list[int]
    last_seq_of_missing: dict[str, int]   # missing rank -> the last sequence number it reached
    detail: str


@dataclasses.dataclass(frozen=True)
class HangCause:
    """One row of ``hang_causes`` (``hang_causes.parquet``; ``records/hang_causes.py``): why
    ranks stopped, in words, with the collective it concerns as torch's analyser shows it."""
    cause: str                       # host-stopped, device-stopped, transport-stalled, …
    ranks: list[int]
    process_group: str
    group_desc: str
    seq: int                         # -1: not about one collective (no-dump, exited)
    op: str
    collective: str                  # op, group, description, #seq, sizes and dtypes
    evidence: str
    remedy: str


@dataclasses.dataclass(frozen=True)
class BandwidthRow:
    """One row of ``bandwidth`` (``bandwidth_summary.parquet``'s medians per dimension, op,
    group size and size bucket)."""
    dim: str
    op: str
    group_size: int | None
    size_bucket: int | None
    instances: int | None
    msg_bytes: float | None
    transfer_us: float | None
    busbw_gbps: float | None
    busbw_max_gbps: float | None
    baseline_busbw_gbps: float | None
    efficiency: float | None        # busbw / the baseline's, where a baseline was given


@dataclasses.dataclass(frozen=True)
class GpuIdle:
    """One row of ``gpu_idle_per_rank_mean`` (``idle.parquet``'s columns but ``step``, mean
    over the profiled steps) but ``idle_us``: the part of a rank's GPU idle per step charged
    to each cause (``vocabulary.IDLE_CAUSES``), and the launch time of slow launches. The idle
    total is the breakdown's (``RankMean.idle_us``; ``Summary.rank_mean``): the idle table's
    own ``idle_us`` is the same number (tests/test_summary_schema.py holds them equal)."""
    rank: int
    idle_dataloader_us: float | None
    idle_sync_us: float | None
    idle_wait_rank_us: float | None
    idle_startup_us: float | None
    idle_launch_us: float | None
    idle_cpu_us: float | None
    idle_queued_us: float | None
    idle_other_us: float | None
    slow_launch_us: float | None

    @property
    def by_cause_us(self) -> dict[str, float | None]:
        """cause -> idle charged to it, in ``IDLE_CAUSES``' order."""
        return {str(c): getattr(self, f"idle_{c}_us") for c in IDLE_CAUSES}


@dataclasses.dataclass(frozen=True)
class TopKernel:
    """One row of ``top_kernels``: one of a rank's five kernels with the most device time
    (``kernels.parquet``'s columns)."""
    rank: int
    name: str
    category: str | None
    count: int
    total_us: float
    mean_us: float | None
    share_pct: float | None
    graph: bool | None


@dataclasses.dataclass(frozen=True)
class MemoryDevice:
    """One row of ``memory.devices`` (``memory_devices.parquet``): a rank's device over its
    profiled steps (analysis/memory/rank_memory.py)."""
    rank: int
    device: str
    totals: str | None               # "absolute" | "since-start" | "rebuilt"
    events: int | None
    steps: int | None
    peak_allocated_bytes: float | None
    peak_step: int | None
    peak_us: float | None
    peak_op: str | None
    peak_module: str | None
    peak_annotation: str | None
    peak_reserved_bytes: float | None
    reserved_at_peak_bytes: float | None
    fragmentation_bytes: float | None
    growth_per_step_bytes: float | None
    growth_steps: int | None
    growth_monotone: bool | None
    device_total_bytes: float | None
    device_total_source: str | None
    stage: int | None


@dataclasses.dataclass(frozen=True)
class MemoryStage:
    """One row of ``memory.stages``: a pipeline stage's largest peak and the rank holding it."""
    stage: int
    ranks: list[int]
    peak_allocated_bytes: float | None
    peak_rank: int | None
    device: str | None


@dataclasses.dataclass(frozen=True)
class Oom:
    """A snapshot's out-of-memory record: what was asked, what the device had free, what the
    allocator held then, when and where."""
    requested_bytes: int | None
    device_free_bytes: int | None
    allocated_bytes: int | None
    reserved_bytes: int | None
    time_us: int | None
    site: str | None
    # What the device held then and what would make the request fit (analysis/memory/oom.py):
    # the whole in words; what each kind held (optimizer, gradients, weights, activations,
    # other, allocator cache); requested less free; the changes that cover it; the largest
    # sites. Null / empty in a report written before them.
    explained: str | None = None
    held_bytes: dict[str, float] | None = None
    shortfall_bytes: int | None = None
    fits_if: list[str] = dataclasses.field(default_factory=list)
    sites: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class MemorySnapshot:
    """One row of ``memory.snapshots``: a memory snapshot's device (analysis/memory/
    snapshot.py); ``oom`` the out-of-memory record it holds, or null."""
    rank: int
    device: str
    source: str
    reserved_bytes: float | None
    allocated_bytes: float | None
    free_in_segments_bytes: float | None
    largest_allocated_bytes: float | None
    largest_reserved_bytes: float | None
    largest_at_us: float | None
    trace_entries: int | None
    oom: Oom | None
    active_bytes: float | None = None      # the segments' active_size (allocated + freeing)
    requested_bytes: float | None = None   # what the live blocks' callers asked for
    # Where the blocks in use and the allocator's segment totals disagree: what was reported
    # (the totals) and by how much (``analysis/memory/snapshot._allocated``); null: they agree.
    caveat: str | None = None


@dataclasses.dataclass(frozen=True)
class MemorySummary:
    """``memory``: per rank and device, per pipeline stage, per snapshot, and the device
    memory given (``--device-memory``); empty for a report made before it existed."""
    devices: list[MemoryDevice]
    stages: list[MemoryStage]
    snapshots: list[MemorySnapshot]
    device_memory_bytes: float | None

    def main(self) -> list[MemoryDevice]:
        """Each rank's main device: its accelerator with the largest peak, else its CPU
        (analysis/memory/gather.main_devices)."""
        best: dict[int, MemoryDevice] = {}
        for d in self.devices:
            key = (d.device != "cpu", d.peak_allocated_bytes or 0.0)
            old = best.get(d.rank)
            if old is None or key > (old.device != "cpu", old.peak_allocated_bytes or 0.0):
                best[d.rank] = d
        return [best[r] for r in sorted(best)]


@dataclasses.dataclass(frozen=True)
class TrustCheck:
    """One check of the evidence that did not pass (``trust.caveats``; ``analysis/trust/``
    defines each, docs/metrics.md "Trust" its threshold and why): what it counted, on which
    ranks and steps, its size, and the numbers that rest on it."""
    check: str                       # ``vocabulary.TrustCheckId``
    severity: str                    # "caveat" | "untrustworthy"
    ranks: list[int]                 # the ranks it concerns (empty: the run as a whole)
    count: int                       # events, operations, steps or ranks counted
    of: int | None                   # out of how many
    size_us: float | None            # its size, where it has one (largest skew, excess…)
    share_pct: float | None          # its share of what it rests on (events, step time…)
    steps: list[int]                 # the profiled steps concerned (empty: all or none)
    affects: list[str]               # the numbers resting on it (``vocabulary.TRUST_NUMBERS``)
    text: str                        # one sentence: what was seen and what it means


@dataclasses.dataclass(frozen=True)
class RankTrust:
    """One rank's verdict (``trust.ranks``) and the checks that did not pass on it."""
    rank: int
    verdict: str                     # ``vocabulary.TRUST_VERDICTS``
    checks: list[str]


@dataclasses.dataclass(frozen=True)
class Trust:
    """``trust``: what the report's numbers rest on — the verdict of the run (the worst of its
    ranks' and its own checks, docs/metrics.md "Trust"), each rank's, the checks that did not
    pass and every check that was run (``checked``)."""
    verdict: str                     # "trusted" | "usable with caveats" | "not trustworthy"
    ranks: list[RankTrust]
    caveats: list[TrustCheck]
    checked: list[str]

    def of_rank(self, rank: int) -> RankTrust | None:
        return next((r for r in self.ranks if r.rank == rank), None)


# -- the verdict in words, as every view shows it (CLI text, compare, dashboard, static report)

_RUN_CHECKS = frozenset({TrustCheckId.MISSING_RANKS.value, TrustCheckId.DIFFERENT_STEPS.value,
                         TrustCheckId.COLLECTIVE_COUNTS.value, TrustCheckId.CLOCK_OFFSETS.value})


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8])) + ("…" if len(ranks) > 8 else "")
    return f"rank{'s' * (len(ranks) != 1)} {shown}"


#: The first summary schema whose reports carry a trust verdict wherever they have traces.
TRUST_SINCE = 5


def trust_headline(t: Trust | None, schema_version: int | None = None) -> str:
    """The verdict in one line, as every view shows it first: the run's, and which ranks
    are not trusted; for a report without one, why — written before the checks existed, or
    (``schema_version`` of today's) made without a trace to check."""
    if t is None:
        if schema_version is not None and schema_version >= TRUST_SINCE:
            return ("no trace to check: the numbers come from the step timers, the Flight "
                    "Recorder or a memory snapshot alone, which the trust checks do not cover")
        return ("evidence not checked: this report was written before meshscope checked its "
                "evidence (meshscope analyze --no-cache checks it)")
    if t.verdict == TRUST_VERDICTS[0]:
        return (f"trusted — every check passed on {len(t.ranks)} "
                f"rank{'s' * (len(t.ranks) != 1)} ({len(t.checked)} checks)")
    parts = []
    for v in reversed(TRUST_VERDICTS[1:]):          # the worst first
        rs = [r for r in t.ranks if r.verdict == v]
        if rs:
            checks = sorted({c for r in rs for c in r.checks})
            parts.append(("" if v == t.verdict else f"{v}: ")
                         + f"{_ranks_text([r.rank for r in rs])} ({', '.join(checks)})")
    run_only = [c.check for c in t.caveats if not c.ranks or c.check in _RUN_CHECKS]
    if run_only:
        parts.append(f"across ranks: {', '.join(run_only)}")
    return f"{t.verdict} — {'; '.join(parts)}"


def trust_caveat_lines(t: Trust | None) -> list[str]:
    """One line per failed check: its severity, id, what it saw, the numbers it affects."""
    if t is None:
        return []
    return [f"[{c.severity}] {c.check}: {c.text} — affects {', '.join(c.affects)}"
            for c in t.caveats]


def trust_marks(t: Trust | None) -> dict[int, str]:
    """rank -> the mark its numbers carry wherever they are shown: ``†`` usable with caveats,
    ``‡`` not trustworthy; trusted ranks carry none."""
    if t is None:
        return {}
    sign = {TRUST_VERDICTS[1]: "†", TRUST_VERDICTS[2]: "‡"}
    return {r.rank: sign[r.verdict] for r in t.ranks if r.verdict in sign}


@dataclasses.dataclass(frozen=True)
class Summary:
    """summary.json: what a report says, in one document (docs/report-format.md). The
    analysis builds it (``analysis/report/summary.py``), ``codec.encode`` writes it, every
    reader reads it through ``reader.read_summary``; the step time is chosen once, when it is
    built (``choose_headline``), and read as written."""
    schema_version: int
    generated: str | None
    source: str | None              # the run's folder (relative where it was analysed so)
    run: RunFacts | None            # from run.json; null for a plain folder of traces
    device: str | None              # "cpu" | "gpu"
    environment: Environment
    ranks: list[int]
    missing_ranks: list[int]
    problems: list[str]
    notes: list[str]
    steps: list[int]                # the profiled steps
    step_time_us: float | None      # the headline (``step_time``)
    step_time_source: str | None
    step_time_timer_us: float | None
    step_time_replayed_us: float | None
    window_us: float | None
    throughput: Throughput
    per_rank_mean: list[RankMean]
    trace_overlap: list[TraceOverlap]
    pipeline_stages: list[Stage]
    stage_imbalance_measured: StageImbalance | None
    stage_imbalance_without_straggler: ReplayedImbalance | None
    clock_offsets: list[ClockOffset]
    table_clocks: dict[str, str]    # table -> the clock its points in time are on
    cross_rank: CrossRank
    warmup_steps: list[int]
    slow_steps: list[int]
    hangs: list[Hang] | None        # Flight Recorder verdicts; null: not said (schema 1)
    # The ranks whose Flight Recorder dump was read: empty, there is no record to judge hangs
    # and desyncs by; null, the report does not say (written before schema 4).
    flight_recorder_ranks: list[int] | None
    # Why ranks stopped (``HangCause``): empty for a healthy job; null before schema 5.
    hang_causes: list[HangCause] | None
    findings: list[Finding]
    bandwidth: list[BandwidthRow]   # bandwidth summary rows
    gpu_idle_per_rank_mean: list[GpuIdle]   # where the GPU's idle time goes, per rank
    top_kernels: list[TopKernel]
    memory: MemorySummary
    # What the numbers rest on (``Trust``); null: the report does not say (before schema 5).
    trust: Trust | None = None

    @property
    def step_time(self) -> StepTime:
        """The headline step time and its inputs, as written."""
        return StepTime(self.step_time_us, self.step_time_source, self.step_time_timer_us,
                        self.step_time_replayed_us, self.window_us)

    @property
    def tokens_per_s(self) -> float | None:
        """The step timers' tokens/s: None unless the headline is the step timer's (they were
        computed from it)."""
        return self.throughput.tokens_per_s if self.step_time_source == "timer" else None

    @property
    def mfu_pct(self) -> float | None:
        return self.throughput.mfu_pct if self.step_time_source == "timer" else None

    @property
    def hangs_in_summary(self) -> bool:
        """Whether ``hangs`` is the Flight Recorder verdict itself: schema 1 wrote no
        flight_recorder table, so there its ``hangs`` (even empty: no hang) is the answer;
        from schema 2 the table is, and ``hangs`` only repeats it."""
        return self.hangs is not None and (self.schema_version < 2 or bool(self.hangs))

    @property
    def straggler(self) -> Straggler | None:
        return self.cross_rank.straggler

    @property
    def hangs_judged(self) -> bool | None:
        """Whether Flight Recorder records were read, so that "no hang" is a verdict: False
        when the report says none were, None when it does not say (an older report)."""
        if self.flight_recorder_ranks is None:
            return None
        return bool(self.flight_recorder_ranks)

    def rank_mean(self, rank: int) -> RankMean | None:
        """``rank``'s row of ``per_rank_mean`` (None when it has none)."""
        return next((m for m in self.per_rank_mean if m.rank == rank), None)

    @property
    def status(self) -> str | None:
        return self.run.status if self.run else None

    def run_fact(self, key: str) -> Any:
        """A field of run.json's copy (``layout_str``, ``world_size``, ``schedule``…)."""
        return getattr(self.run, key, None) if self.run else None

    @property
    def model_preset(self) -> str | None:
        preset = self.run.model.preset if self.run else None
        return preset if preset not in (None, "") else None


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One row of ``kernels.parquet``: a kernel name's time on one rank over the profiled
    steps."""
    rank: int
    name: str
    category: str | None
    count: int
    total_us: float
    mean_us: float | None
    share_pct: float | None          # of the rank's device time in the profiled steps
    graph: bool                      # launched from a CUDA graph


@dataclasses.dataclass(frozen=True)
class Gemm:
    """One row of ``gemms.parquet``: a matrix-multiplication op, its input shapes and type on
    one rank, the FLOPs it did and the time of the kernels it launched."""
    rank: int
    op: str
    shapes: str | None               # JSON text of the inputs' dims
    dtype: str | None
    calls: int
    flops: float
    kernel_us: float
    tflops: float | None             # achieved
    peak_tflops: float | None        # the device's dense peak for the type, where known
    efficiency: float | None         # tflops / peak_tflops, a fraction


@dataclasses.dataclass(frozen=True)
class StreamIdle:
    """One row of ``stream_idle.parquet``: HTA's idle breakdown of one stream of one rank."""
    rank: int
    stream: str
    idle_us: float | None
    host_wait_us: float | None
    kernel_wait_us: float | None
    other_us: float | None


@dataclasses.dataclass(frozen=True)
class StageCompute:
    """One row of ``stage_imbalance.parquet``: a pipeline stage's compute per microbatch and
    its ratio to the stages' mean (the measured stage imbalance)."""
    stage: int
    compute_per_mb_us: float | None
    ratio_to_mean: float | None


def human_bytes(n: float | None) -> str:
    """A byte count in binary units, as every view writes one (``1.50 GiB``; ``-`` unknown)."""
    if n is None or n != n:
        return "-"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
