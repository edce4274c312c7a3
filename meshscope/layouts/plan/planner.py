"""``plan(...)``: every candidate layout's memory, traffic and predicted step, ranked.

    from meshscope.layouts.plan import ModelSpec, Candidate, plan
    from meshscope.parallel.layout import parse_layout
    p = plan(ModelSpec.from_json("llama-7b.json"),
             [Candidate(parse_layout("dp=8")), Candidate(parse_layout("dp=4,tp=2"))],
             rates=Rates(flops_per_s=989e12 * 0.4), comm=CommModel(busbw_gbps=150))
    p.rows[0].estimate.step_time_us, p.rows[0].peak_memory_bytes

Without ``rates`` the plan has memory and traffic only (no ranking).
"""
from __future__ import annotations

import dataclasses
import functools

from meshscope.theory.schedules import bubble_fraction as theory_fraction

from .candidate import Candidate
from .comm_model import CommModel
from .cost import Rates, StepEstimate, predict
from .job_step import JobOptions, ThroughputRange, predict_job, throughput_range_of
from .memory import MemoryEstimate, memory
from .precision import Precision, precision_of
from .spec import ModelSpec
from .traffic import Transfer, bytes_by_rank, transfers
from .training import Training


@dataclasses.dataclass(frozen=True)
class PlanRow:
    candidate: Candidate
    memory: list[MemoryEstimate]           # per pipeline rank
    transfers: list[Transfer]
    comm_bytes: dict[str, float]           # dim -> bytes per step, mean over ranks
    theory_bubble_fraction: float
    estimate: StepEstimate | None
    fits: bool | None                      # peak memory ≤ the device's, when known
    wire_bytes: dict[str, float] = dataclasses.field(default_factory=dict)  # dim -> sent
    link_level: dict[str, str] = dataclasses.field(default_factory=dict)    # dim -> intra/inter
    tie: bool = False             # predicted within the uncertainty band of the fastest

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def peak(self) -> MemoryEstimate:
        return max(self.memory, key=lambda m: m.total_bytes)

    @property
    def peak_memory_bytes(self) -> float:
        return self.peak.total_bytes

    def as_dict(self) -> dict:
        return {"name": self.name, "label": self.candidate.label,
                "candidate": self.candidate.as_dict(),
                "memory": [m.as_dict() for m in self.memory],
                "peak_memory_bytes": self.peak_memory_bytes,
                "comm_bytes": self.comm_bytes, "wire_bytes": self.wire_bytes,
                "link_level": self.link_level,
                "transfers": [t.as_dict() for t in self.transfers],
                "theory_bubble_fraction": self.theory_bubble_fraction,
                "estimate": self.estimate.as_dict() if self.estimate else None,
                "fits": self.fits, "tie": self.tie}


@dataclasses.dataclass
class Plan:
    model: ModelSpec
    precision: Precision
    rates: Rates | None
    comm: CommModel | None
    rows: list[PlanRow]
    notes: list[str] = dataclasses.field(default_factory=list)
    training: Training | None = None
    topology: object | None = None
    device: object | None = None              # devices.DeviceSpec of a GPU job
    uncertainty: float | None = None          # the predicted step's relative uncertainty
    uncertainty_source: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)
    searched: tuple[str, ...] = ()            # the knobs searched within each layout
    fit_changes: list = dataclasses.field(default_factory=list)   # search.Change, none fits
    not_shown_over_memory: int = 0            # layouts of the search that fit no variant

    @property
    def throughput_range(self) -> ThroughputRange | None:
        """A MoE GPU job's throughput range, instead of a point (``throughput_range_of``);
        None without a device (no throughput) and for other jobs."""
        return throughput_range_of(self.model, self.training) if self.device is not None \
            else None

    def row(self, name: str) -> PlanRow | None:
        return next((r for r in self.rows if r.name == name), None)

    @property
    def ties(self) -> list[PlanRow]:
        return [r for r in self.rows if r.tie]

    def as_dict(self) -> dict:
        return {"kind": "meshscope-plan", "model": self.model.as_dict(),
                "n_params": self.model.n_params(),
                "flops_per_token": self.model.flops_per_token(),
                "precision": dataclasses.asdict(self.precision),
                "rates": self.rates.as_dict() if self.rates else None,
                "comm": self.comm.describe() if self.comm else None,
                "training": self.training.as_dict() if self.training else None,
                "topology": self.topology.describe() if self.topology else None,
                "device": ([{"value": f, "is": v, "source": src}
                            for f, v, src in self.device.values()] if self.device else None),
                "uncertainty": self.uncertainty,
                "uncertainty_source": self.uncertainty_source,
                "warnings": self.warnings, "searched": list(self.searched),
                "fit_changes": [dataclasses.asdict(c) | {"text": c.text}
                                for c in self.fit_changes],
                "layouts_over_memory": self.not_shown_over_memory,
                "throughput_range": (self.throughput_range.as_dict()
                                     if self.throughput_range else None),
                "notes": self.notes, "rows": [self._row_dict(r) for r in self.rows]}

    def _row_dict(self, r: PlanRow) -> dict:
        d = r.as_dict()
        if self.throughput_range and r.estimate:
            per_gpu = r.estimate.tokens_per_s / r.candidate.layout.world_size
            d["tokens_per_s_per_gpu_range"] = [per_gpu * self.throughput_range.low_factor,
                                               per_gpu * self.throughput_range.high_factor]
        return d


def comm_bytes_by_dim(spec: ModelSpec, cand: Candidate, precision, training=None,
                      trs: list[Transfer] | None = None, wire: bool = False
                      ) -> dict[str, float]:
    """dim → bytes per step (sum of S over the step's operations; ``wire``: bytes each rank
    sends, ``Transfer.wire_bytes``), mean over the ranks."""
    if trs is None and training is None and not wire:
        per_rank = bytes_by_rank(spec, cand, precision)
        out: dict[str, float] = {}
        for by_op in per_rank.values():
            for (dim, _op), b in by_op.items():
                out[dim] = out.get(dim, 0.0) + b / len(per_rank)
        return out
    trs = trs if trs is not None else transfers(spec, cand, precision, training=training)
    out = {}
    for t in trs:   # every pipeline rank has the same number of ranks: mean over pp ranks
        out[t.dim] = out.get(t.dim, 0.0) + (t.wire_bytes if wire else t.bytes) / cand.pp
    return out


def plan_one(spec: ModelSpec, cand: Candidate, *, precision: Precision | str = "fp32",
             rates: Rates | None = None, comm: CommModel | None = None,
             device_memory_bytes: float | None = None, training: Training | None = None,
             device=None, topology=None, job_options=None) -> PlanRow:
    """One layout. With a ``training`` of a GPU framework, a ``device`` (``devices.DeviceSpec``)
    and a ``topology``: the job model (``job_memory``, ``job_step``); otherwise the runner's."""
    prec = precision_of(precision)
    job = training is not None and training.framework != "runner"
    training = training_of(training, cand)
    mem = memory(spec, cand, prec, training=training)
    trs = transfers(spec, cand, prec, training=training)
    if job and device is not None and topology is not None:
        est = predict_job(spec, cand, training, device, topology, job_options or JobOptions(),
                          trs=trs)
    else:
        est = predict(spec, cand, rates, comm or CommModel(), prec) if rates else None
    peak = max(m.total_bytes for m in mem)
    levels = {}
    if topology is not None:
        levels = {t.dim: topology.level_of(cand, t.dim) for t in trs}
    return PlanRow(candidate=cand, memory=mem, transfers=trs,
                   comm_bytes=comm_bytes_by_dim(spec, cand, prec, training,
                                                trs if job else None),
                   wire_bytes=comm_bytes_by_dim(spec, cand, prec, training, trs, wire=True),
                   link_level=levels,
                   theory_bubble_fraction=theory_fraction(cand.schedule, cand.pp,
                                                          cand.microbatches, cand.v),
                   estimate=est,
                   fits=(peak <= device_memory_bytes) if device_memory_bytes else None)


def training_of(training: Training | None, cand: Candidate) -> Training | None:
    """The training a candidate runs: the plan's, with the candidate's own recomputation
    where it carries one (the default search tries none, selective and full)."""
    if training is None or cand.recompute is None or cand.recompute == training.recompute:
        return training
    return _with_recompute(training, cand.recompute)


@functools.lru_cache(maxsize=64)
def _with_recompute(training: Training, recompute: str) -> Training:
    return dataclasses.replace(training, recompute=recompute)


def rank(rows: list[PlanRow], uncertainty: float | None) -> tuple[list[PlanRow], list[str]]:
    """Fitting layouts first (those whose fit is unknown with them), each group by predicted
    step time; the layouts whose step is within ``uncertainty`` of the fastest fitting one
    are ties (``PlanRow.tie``; none when no layout fits). A warning when no layout fits."""
    warnings = []
    if rows and all(r.fits is False for r in rows):
        warnings.append(f"no layout fits the device's memory: the smallest needs "
                        f"{min(r.peak_memory_bytes for r in rows) / 2**30:.1f} GiB a GPU; "
                        f"the ranking below is of layouts that would run out of memory")
    if not all(r.estimate for r in rows):
        return rows, warnings
    rows = sorted(rows, key=lambda r: (r.fits is False, r.estimate.step_time_us))
    pool = [r for r in rows if r.fits is not False]
    if uncertainty is not None and pool:      # no ties among layouts none of which fit
        best = pool[0].estimate.step_time_us
        rows = [dataclasses.replace(r, tie=r.fits is not False
                                    and r.estimate.step_time_us <= best * (1 + uncertainty))
                for r in rows]
    return rows, warnings


def plan(spec: ModelSpec, candidates: list[Candidate], *, precision: Precision | str = "fp32",
         rates: Rates | None = None, comm: CommModel | None = None,
         device_memory_bytes: float | None = None, notes: list[str] | None = None,
         training: Training | None = None, device=None, topology=None,
         job_options=None, uncertainty: float | None = None,
         uncertainty_source: str = "") -> Plan:
    """Every candidate's row, ranked (``rank``) when step times are predicted."""
    prec = training.as_precision() if training is not None and \
        training.framework != "runner" else precision_of(precision)
    rows = [plan_one(spec, c, precision=prec, rates=rates, comm=comm,
                     device_memory_bytes=device_memory_bytes, training=training,
                     device=device, topology=topology, job_options=job_options)
            for c in candidates]
    rows, warnings = rank(rows, uncertainty)
    return Plan(model=spec, precision=prec, rates=rates, comm=comm, rows=rows,
                notes=list(notes or []), training=training, topology=topology,
                device=device, uncertainty=uncertainty,
                uncertainty_source=uncertainty_source, warnings=warnings)
