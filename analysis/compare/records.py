"""The records of a comparison (``diff.diff`` makes them; ``story``, ``gate``, ``outputs``, the
dashboard and ``--json`` read them): a quantity before and after (``Change``), the parts of the
step-time difference (``Part``, with the ``Item`` behind each), every kernel, operator,
collective, bandwidth bucket, finding, rank and memory peak before and after, and the whole
(``RunDiff``). Data only: what each field means is in ``diff.py``'s docstring.
"""
from __future__ import annotations

import dataclasses
import math

from meshscope.analysis.report.summary import clean as _clean

#: How many kernels / operators / collectives a part lists under it.
ITEMS_PER_PART = 5
#: A change stands out of the noise when it is more than this many times the noise of the
#: difference (about 95% for normally spread step times): twice, as a straggler's saving must
#: stand at twice the what-if's floor.
NOISE_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class Change:
    """One quantity before and after: ``delta = after − before``, ``rel = delta / |before|``,
    ``noise`` the two sides' noises added in quadrature (None where either is unknown) and
    ``within_noise`` whether |delta| ≤ ``NOISE_FACTOR`` × noise (None where the noise is
    unknown)."""
    name: str
    unit: str
    before: float | None
    after: float | None
    noise_before: float | None = None
    noise_after: float | None = None

    @property
    def delta(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def rel(self) -> float | None:
        d = self.delta
        return None if d is None or not self.before else d / abs(self.before)

    @property
    def noise(self) -> float | None:
        if self.noise_before is None or self.noise_after is None:
            return None
        return math.hypot(self.noise_before, self.noise_after)

    @property
    def within_noise(self) -> bool | None:
        d, n = self.delta, self.noise
        return None if d is None or n is None else abs(d) <= NOISE_FACTOR * n

    def to_dict(self) -> dict:
        return {"name": self.name, "unit": self.unit, "before": self.before,
                "after": self.after, "delta": self.delta, "rel": self.rel,
                "noise": self.noise, "within_noise": self.within_noise}


@dataclasses.dataclass(frozen=True)
class Item:
    """A kernel, operator or collective behind a part: per step, before and after."""
    name: str
    before_us: float
    after_us: float
    count_before: float
    count_after: float

    @property
    def delta_us(self) -> float:
        return self.after_us - self.before_us


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the window's difference (module docstring): its ``Change`` (µs per step),
    its share of the whole difference, the operations inside it (``sub``: exposed
    communication per op) and what is behind it (``items``)."""
    change: Change
    label: str
    share: float | None
    sub: tuple["Part", ...] = ()
    items: tuple[Item, ...] = ()
    items_are: str = ""              # "kernels", "operators", "collectives" or "copies"

    @property
    def name(self) -> str:
        return self.change.name

    @property
    def delta_us(self) -> float:
        return self.change.delta or 0.0

    def to_dict(self) -> dict:
        return {**self.change.to_dict(), "label": self.label, "share": self.share,
                "items_are": self.items_are,
                "sub": [s.to_dict() for s in self.sub],
                "items": [dataclasses.asdict(i) | {"delta_us": i.delta_us}
                          for i in self.items]}


@dataclasses.dataclass(frozen=True)
class KernelDiff:
    """A kernel (``names.kernel_key``) before and after, per step (mean over ranks):
    ``status`` is ``new`` (only after), ``gone`` (only before) or ``both``."""
    key: str
    category: str
    count_before: float
    count_after: float
    total_before_us: float
    total_after_us: float
    names_before: tuple[str, ...]
    names_after: tuple[str, ...]

    @property
    def delta_us(self) -> float:
        return self.total_after_us - self.total_before_us

    @property
    def mean_before_us(self) -> float | None:
        return self.total_before_us / self.count_before if self.count_before else None

    @property
    def mean_after_us(self) -> float | None:
        return self.total_after_us / self.count_after if self.count_after else None

    @property
    def status(self) -> str:
        return "new" if not self.count_before else "gone" if not self.count_after else "both"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {
            "delta_us": self.delta_us, "mean_before_us": self.mean_before_us,
            "mean_after_us": self.mean_after_us, "status": self.status,
            "names_before": list(self.names_before), "names_after": list(self.names_after)}


@dataclasses.dataclass(frozen=True)
class OperatorDiff:
    """A host operator whose launches per step changed (mean over ranks)."""
    name: str
    count_before: float
    count_after: float
    total_before_us: float
    total_after_us: float

    @property
    def status(self) -> str:
        return "new" if not self.count_before else "gone" if not self.count_after else "both"


@dataclasses.dataclass(frozen=True)
class CollectiveDiff:
    """Collectives and point-to-point operations of one (dimension, op): operations and bytes
    per step and rank (``instances.parquet``), before and after."""
    dim: str
    op: str
    count_before: float
    count_after: float
    bytes_before: float | None
    bytes_after: float | None

    @property
    def status(self) -> str:
        return "new" if not self.count_before else "gone" if not self.count_after else "both"


@dataclasses.dataclass(frozen=True)
class BandwidthDiff:
    """Median bus bandwidth of one (dimension, op, size bucket), before and after."""
    dim: str
    op: str
    size_bucket: int                 # bytes, the bucket's lower bound (a power of two)
    busbw_before_gbps: float | None
    busbw_after_gbps: float | None
    transfer_before_us: float | None
    transfer_after_us: float | None


@dataclasses.dataclass(frozen=True)
class FindingChange:
    """A finding of either run: ``new``, ``gone`` or ``both`` (with both costs)."""
    id: str
    title: str
    status: str
    cost_before_us: float | None
    cost_after_us: float | None
    cost_before_pct: float | None
    cost_after_pct: float | None


@dataclasses.dataclass(frozen=True)
class RankDelta:
    """One matched rank pair (``rank_before`` of the first run, ``rank_after`` of the second):
    each breakdown part per step, before and after (µs, mean over profiled steps)."""
    rank_before: int
    rank_after: int
    before: dict[str, float]
    after: dict[str, float]

    def delta(self, part: str) -> float:
        return self.after.get(part, 0.0) - self.before.get(part, 0.0)


@dataclasses.dataclass(frozen=True)
class MemoryDiff:
    """One matched rank's allocator peaks on its main device (``quantities.main_device_steps``),
    the largest over its profiled steps, before and after (None where a run's traces recorded
    no memory)."""
    rank_before: int | None
    rank_after: int | None
    device: str
    allocated_before_bytes: float | None
    allocated_after_bytes: float | None
    reserved_before_bytes: float | None
    reserved_after_bytes: float | None

    @property
    def allocated_delta_bytes(self) -> float | None:
        a, b = self.allocated_before_bytes, self.allocated_after_bytes
        return None if a is None or b is None else b - a


@dataclasses.dataclass(frozen=True)
class SideInfo:
    """What the comparison says of each run."""
    name: str
    path: str
    report_dir: str
    device: str | None
    ranks: list[int]
    steps: list[int]
    layout: str | None
    step_time_source: str | None
    # What the run's numbers rest on (``analysis/trust/``): its verdict (None: the report
    # predates the checks) and the line every view shows.
    trust_verdict: str | None = None
    evidence: str = ""


@dataclasses.dataclass
class RunDiff:
    """``diff(before, after)`` (module docstring)."""
    before: SideInfo
    after: SideInfo
    step_time: Change
    window: Change
    parts: list[Part]
    kernels: list[KernelDiff]
    operators: list[OperatorDiff]
    collectives: list[CollectiveDiff]
    bandwidth: list[BandwidthDiff]
    findings: list[FindingChange]
    ranks: list[RankDelta]
    rank_match: str                          # "id" | "position" | "none"
    memory: list[MemoryDiff]
    quantities: dict[str, Change]
    notes: list[str]
    sentences: list[str] = dataclasses.field(default_factory=list)
    # What differs in what the runs ran on and how they were measured (``alike``): said
    # before any cause; ``hardware_changed`` when the device model differs.
    unlike: list[str] = dataclasses.field(default_factory=list)
    hardware_changed: bool = False

    @property
    def parts_total_us(self) -> float:
        return sum(p.delta_us for p in self.parts)

    @property
    def residual_us(self) -> float | None:
        """Δ step time − Σ Δ parts: how far the parts' total is from the headline's change."""
        d = self.step_time.delta
        return None if d is None else d - self.parts_total_us

    def to_dict(self) -> dict:
        """JSON-safe (NaN → null): what ``meshscope compare --json`` prints for a pair."""
        return _clean({
            "kind": "meshscope-diff",
            "before": dataclasses.asdict(self.before), "after": dataclasses.asdict(self.after),
            "like_for_like": not self.unlike, "unlike": self.unlike,
            "hardware_changed": self.hardware_changed,
            "step_time": self.step_time.to_dict(), "window": self.window.to_dict(),
            "parts": [p.to_dict() for p in self.parts],
            "parts_total_us": self.parts_total_us, "residual_us": self.residual_us,
            "sentences": self.sentences,
            "kernels": [k.to_dict() for k in self.kernels],
            "operators": [dataclasses.asdict(o) | {"status": o.status} for o in self.operators],
            "collectives": [dataclasses.asdict(c) | {"status": c.status}
                            for c in self.collectives],
            "bandwidth": [dataclasses.asdict(b) for b in self.bandwidth],
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "ranks": [dataclasses.asdict(r) for r in self.ranks], "rank_match": self.rank_match,
            "memory": [dataclasses.asdict(m) | {"allocated_delta_bytes": m.allocated_delta_bytes}
                       for m in self.memory],
            "quantities": {k: c.to_dict() for k, c in self.quantities.items()},
            "notes": self.notes})


