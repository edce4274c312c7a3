"""The report's records that its writers and readers share, each defined once.

A finding is made by the analysers (``findings.py``, ``device_findings.py``,
``memory_findings.py``), written into summary.json by ``summary.py`` (``Finding.to_dict``) and
read back by every reader — the CLI text, ``--json``, compare, the static report, the dashboard
— through ``reader.read_summary`` (``Finding.read``): one class, so a field cannot mean one
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
============== ============================================================================
"""
from __future__ import annotations

import dataclasses
from typing import Any

from meshscope.vocabulary import FINDING_IDS, STEP_TIME_SOURCES, FindingId

#: Short labels of the step-time sources, for a table's column or a chart's axis.
SHORT = {"timer": "step timer", "replayed": "replayed", "window": "profiled window"}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x \
        else None


@dataclasses.dataclass
class Finding:
    """One finding (module docstring, field by field)."""
    id: FindingId | str
    severity: str
    dimension: str | None
    cost_us: float | None
    cost_pct: float | None
    title: str
    evidence: dict[str, Any]
    remedy: str
    what_if: dict[str, Any] = dataclasses.field(default_factory=dict)
    symptoms: list[Any] = dataclasses.field(default_factory=list)
    peak_saving_bytes: float | None = None

    def __post_init__(self) -> None:
        self.id = FindingId(self.id)          # ValueError for an id the vocabulary lacks

    def to_dict(self) -> dict[str, Any]:
        """The finding as summary.json holds it (the id as its string)."""
        return dataclasses.asdict(self) | {"id": str(self.id)}

    @classmethod
    def read(cls, d: Any) -> Finding | None:
        """A finding of a summary.json document, every field typed (None for an entry that is
        not a finding: not an object, no string id). An id this version does not know — a
        newer report's — is kept as its string."""
        if not isinstance(d, dict) or not isinstance(d.get("id"), str):
            return None
        fields = dict(
            severity=str(d.get("severity") or ""),
            dimension=d["dimension"] if isinstance(d.get("dimension"), str) else None,
            cost_us=_num(d.get("cost_us")), cost_pct=_num(d.get("cost_pct")),
            title=str(d.get("title") or d["id"]),
            evidence=d["evidence"] if isinstance(d.get("evidence"), dict) else {},
            remedy=str(d.get("remedy") or ""),
            what_if=d["what_if"] if isinstance(d.get("what_if"), dict) else {},
            symptoms=d["symptoms"] if isinstance(d.get("symptoms"), list) else [],
            peak_saving_bytes=_num(d.get("peak_saving_bytes")))
        if d["id"] in FINDING_IDS:
            return cls(id=d["id"], **fields)
        found = object.__new__(cls)
        for name, value in {"id": d["id"], **fields}.items():
            object.__setattr__(found, name, value)
        return found


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


# -- summary.json, typed (``reader.read_summary`` fills them) ---------------------------

@dataclasses.dataclass(frozen=True)
class StepTime:
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
class Straggler:
    """``cross_rank.straggler``: the rank whose own work, run at its reference pace (its
    stage peers' median), shortens the replayed step the most, above the run's noise."""
    rank: int
    saving_us: float | None          # what-if saving, ms per step × 1e3
    saving_pct: float | None         # of the replayed step
    reference: str | None            # "stage peers [0]"
    gate_us: float | None            # twice the what-if's resolution
    wait_caused_us: float | None     # older reports name the straggler by the wait it caused
    last_share: float | None         # share of its collectives it arrived last at
    evidence: dict[str, Any]                   # the scalar fields as written (the evidence sentence)


@dataclasses.dataclass(frozen=True)
class RankSaving:
    rank: int
    saving_us: float | None
    saving_pct: float | None
    reference: str | None
    wait_caused_us: float | None


@dataclasses.dataclass(frozen=True)
class CrossRank:
    """``cross_rank``: what the what-if replay of the matched steps says about each rank."""
    straggler: Straggler | None
    rank_savings: list[RankSaving]
    why_not: list[str]               # why collectives could not be matched, if they could not
    noise_us: float | None           # the step-to-step noise
    floor_us: float | None           # the what-if's own floor
    resolution_us: float | None

    def saving_of(self) -> dict[int, float]:
        """rank -> what-if saving (us) of every rank that has one."""
        return {r.rank: r.saving_us for r in self.rank_savings if r.saving_us is not None}

    def wait_caused_of(self) -> dict[int, float]:
        return {r.rank: r.wait_caused_us for r in self.rank_savings
                if r.wait_caused_us is not None}


@dataclasses.dataclass(frozen=True)
class Stage:
    """One row of ``pipeline_stages``: the share of the pipeline window the stage computes
    nothing, measured, replayed and in the schedule's closed form."""
    stage: int
    ranks: list[int]
    bubble_fraction: float | None
    replayed_bubble_fraction: float | None
    theory_fraction: float | None


@dataclasses.dataclass(frozen=True)
class RankMean:
    """One row of ``per_rank_mean``: a rank's step breakdown, mean over the profiled steps
    (``analysis/timeline/breakdown.py``). ``compute_us`` is all compute; the part not
    overlapped by communication is ``compute_without_overlap_us``."""
    rank: int
    window_us: float | None
    compute_us: float | None
    comm_us: float | None
    overlapped_comm_us: float | None
    exposed_comm_us: float | None
    exposed_by_dim_us: dict[str, float]     # dim -> exposed_comm_<dim>_us
    bubble_us: float | None
    other_us: float | None
    idle_us: float | None
    overlap_pct: float | None

    @property
    def compute_without_overlap_us(self) -> float | None:
        if self.compute_us is None or self.overlapped_comm_us is None:
            return None
        return self.compute_us - self.overlapped_comm_us


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
    last_seq_of_missing: str | None
    detail: str


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
    """One row of ``gpu_idle_per_rank_mean``: a rank's GPU idle per step and the part of it
    charged to each cause (``vocabulary.IDLE_CAUSES``' order, then causes a newer report
    adds; a cause an older report did not write is absent), mean over the profiled steps."""
    rank: int
    idle_us: float | None
    by_cause_us: dict[str, float | None]


@dataclasses.dataclass(frozen=True)
class TopKernel:
    """One row of ``top_kernels``: one of a rank's kernels with the most device time."""
    rank: int
    name: str
    category: str
    count: int
    total_us: float
    share_pct: float | None


@dataclasses.dataclass(frozen=True)
class MemoryDevice:
    """One row of ``memory.devices`` (``memory_devices.parquet``): a rank's device over its
    profiled steps (analysis/memory/rank_memory.py)."""
    rank: int
    device: str
    totals: str | None               # "absolute" | "since-start" | "rebuilt"
    stage: int | None
    peak_allocated_bytes: float | None
    peak_step: int | None
    peak_op: str | None
    peak_module: str | None
    peak_reserved_bytes: float | None
    fragmentation_bytes: float | None
    growth_per_step_bytes: float | None
    growth_monotone: bool
    device_total_bytes: float | None
    device_total_source: str | None


@dataclasses.dataclass(frozen=True)
class MemoryStage:
    """One row of ``memory.stages``: a pipeline stage's largest peak and the rank holding it."""
    stage: int
    ranks: list[int]
    peak_allocated_bytes: float | None
    peak_rank: int | None
    device: str | None


@dataclasses.dataclass(frozen=True)
class MemorySnapshot:
    """One row of ``memory.snapshots``: a memory snapshot's device (analysis/memory/
    snapshot.py); ``oom`` the out-of-memory record it holds, or None."""
    rank: int
    device: str
    source: str
    reserved_bytes: float | None
    allocated_bytes: float | None
    free_in_segments_bytes: float | None
    largest_allocated_bytes: float | None
    trace_entries: int | None
    oom: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class MemorySummary:
    """summary.json's ``memory``; empty lists for a report made before it existed."""
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
class Summary:
    """summary.json as typed fields, whatever its schema version (the fields a reader
    needs to show a run; ``raw`` keeps the document for the rest)."""
    schema_version: int
    generated: str | None
    source: str | None              # the run's folder (relative where it was analysed so)
    device: str | None              # "cpu" | "gpu"
    run: dict[str, Any]                       # from run.json; {} for a plain folder of traces
    ranks: list[int]
    steps: list[int]                # the profiled steps
    warmup_steps: list[int]
    missing_ranks: list[int]
    problems: list[str]
    notes: list[str]
    step_time: StepTime
    tokens_per_s: float | None      # the step timers': None unless the headline is the timer
    mfu_pct: float | None
    per_rank_mean: list[RankMean]
    pipeline_stages: list[Stage]
    stage_imbalance_measured: dict[str, Any] | None
    stage_imbalance_without_straggler: dict[str, Any] | None
    cross_rank: CrossRank
    hangs: list[Hang]               # Flight Recorder verdicts
    # Whether summary.json's ``hangs`` is the Flight Recorder verdict itself: schema 1 wrote
    # no flight_recorder table, so there its ``hangs`` (even empty: no hang) is the answer;
    # from schema 2 the table is, and ``hangs`` only repeats it.
    hangs_in_summary: bool
    bandwidth: list[BandwidthRow]   # bandwidth summary rows
    gpu_idle_per_rank_mean: list[GpuIdle]   # where the GPU's idle time goes, per rank
    top_kernels: list[TopKernel]
    findings: list[Finding]
    raw: dict[str, Any]
    memory: MemorySummary = MemorySummary([], [], [], None)

    @property
    def straggler(self) -> Straggler | None:
        return self.cross_rank.straggler

    @property
    def status(self) -> str | None:
        return self.run.get("status") if self.run else None

    def run_fact(self, key: str) -> Any:
        """A field of run.json's copy (``layout_str``, ``world_size``, ``schedule``…)."""
        return self.run.get(key)

    @property
    def model_preset(self) -> str | None:
        model = self.run.get("model")
        preset = model.get("preset") if isinstance(model, dict) else None
        return str(preset) if preset not in (None, "") else None


@dataclasses.dataclass(frozen=True)
class ClockOffset:
    """One row of ``clock_offsets.parquet``: a rank's clock against the reference rank's, the
    uncertainty of that estimate and the offset the analysis subtracted from its times
    (``applied_us``: 0 when the offset was within twice its uncertainty)."""
    rank: int
    offset_us: float | None
    uncertainty_us: float | None
    applied_us: float                # 0.0 where the table says nothing (null)
    source: str | None               # how it was estimated ("collectives", "p2p"…)


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
