"""One way to run the model: a layout and the options that change its cost.

A ``Candidate`` is what ``meshscope sweep`` runs and ``meshscope plan`` predicts: the layout
(``parallel.layout.Layout``), the pipeline schedule and its stages per rank, microbatches, the
data-parallel mode (the runner's ``ddp`` = ZeRO-0, ``zero2`` = ZeRO-2, ``fsdp`` = ZeRO-3; the
planner also knows ``zero1``, which the runner does not implement), sequence parallelism, and
the global batch. ``name`` is a file-name-safe label (``dp2-pp2-1f1b-mb4``) used as the run's
directory in a sweep.
"""
from __future__ import annotations

import dataclasses
import functools

from meshscope.parallel.layout import Layout, parse_layout, stage_layers, virtual_stages
from meshscope.theory.schedules import SCHEDULES, stages_of_rank
from meshscope.vocabulary import PARALLEL_DIMS

# ZeRO stage of each data-parallel mode (Rajbhandari et al., 2020): what is sharded over the
# data-parallel ranks — 1: optimizer state, 2: + gradients, 3: + parameters. ``fsdp``
# reshards each unit after its forward (FSDP2's reshard_after_forward=True, torch's default;
# with a pipeline torchtitan keeps the stage gathered, ``traffic.py``); ``fsdp_noreshard``
# keeps a stage's weights gathered, and its gradients unsharded, from the first
# microbatch's forward to the step's end (reshard_after_forward=False and no gradient sync
# until the last microbatch): one gather and one reduce-scatter a step, the stage whole in
# memory.
ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "fsdp": 3, "fsdp_noreshard": 3}
RUNNER_DP_MODES = ("ddp", "zero2", "fsdp")
DP_MODES = tuple(ZERO_STAGE)
# recomputation a candidate may carry (None: the plan's Training's); its short name in
# ``Candidate.name``
RECOMPUTE_NAMES = {"none": "rcnone", "selective": "rcsel", "op": "rcop", "full": "rcfull"}


@dataclasses.dataclass(frozen=True)
class Candidate:
    layout: Layout
    schedule: str = "1f1b"
    microbatches: int = 4
    dp_mode: str = "ddp"
    sp: bool = True
    global_batch: int = 16
    virtual: int | None = None          # stages per pipeline rank; None: the schedule's default
    stage_layer_counts: tuple[int, ...] | None = None
    recompute: str | None = None        # None: the plan's (``Training.recompute``)

    @property
    def micro_batch_size(self) -> int:
        """Sequences in one microbatch on one data-parallel rank."""
        return self.global_batch // self.layout.size("dp") // self.microbatches

    @property
    def pp(self) -> int:
        return self.layout.size("pp")

    @functools.cached_property
    def v(self) -> int:
        """Stages per pipeline rank (1 without pipeline parallelism)."""
        return virtual_stages(self.schedule, self.virtual) if self.pp > 1 else 1

    @property
    def n_stages(self) -> int:
        return self.pp * self.v

    @property
    def zero_stage(self) -> int:
        return ZERO_STAGE[self.dp_mode]

    @property
    def dp_shards(self) -> int:
        """Ranks over which gradients are averaged and ZeRO shards: dp × cp (context-parallel
        ranks hold replicas of the weights too; the runner flattens the two into one mesh)."""
        return self.layout.size("dp") * self.layout.size("cp")

    def stages_of(self, pp_rank: int) -> list[int]:
        """Global stage indices on pipeline rank ``pp_rank``, in chunk order
        (``theory.schedules.stages_of_rank``: loop r, r+p, …; V r and 2p−1−r)."""
        if self.pp == 1:
            return [0]
        return stages_of_rank(pp_rank, self.pp, self.v, SCHEDULES[self.schedule].placement)

    def rank_of_stage(self, stage: int) -> int:
        """The pipeline rank that holds global stage ``stage``."""
        return next(r for r in range(self.pp) if stage in self.stages_of(r))

    def stage_layers(self, n_layers: int) -> list[list[int]]:
        return [list(s) for s in _stage_layers(n_layers, self.n_stages,
                                               self.stage_layer_counts)]

    @property
    def name(self) -> str:
        parts = [f"{d}{self.layout.size(d)}" for d in PARALLEL_DIMS if self.layout.size(d) > 1]
        parts = parts or ["dp1"]
        if self.dp_mode != "ddp":
            parts.append(self.dp_mode)
        if self.layout.size("tp") > 1 and not self.sp:
            parts.append("nosp")
        if self.pp > 1:
            parts.append(self.schedule)
            if self.virtual is not None and self.v > 1:
                parts.append(f"v{self.v}")
        parts.append(f"mb{self.microbatches}")
        if self.recompute is not None:
            parts.append(RECOMPUTE_NAMES[self.recompute])
        return "-".join(parts)

    @property
    def label(self) -> str:
        """A short human label: ``dp2·pp2`` (plus the schedule and microbatches with pp)."""
        dims = "·".join(f"{d}{self.layout.size(d)}" for d in PARALLEL_DIMS
                        if self.layout.size(d) > 1) or "dp1"
        extra = [self.dp_mode] if self.dp_mode != "ddp" else []
        if self.pp > 1:
            extra.append(f"{self.schedule} m={self.microbatches}")
        return dims + (f" ({', '.join(extra)})" if extra else "")

    def as_dict(self) -> dict:
        return {"name": self.name, "layout": str(self.layout),
                "sizes": {d: self.layout.size(d) for d in PARALLEL_DIMS},
                "schedule": self.schedule if self.pp > 1 else None,
                "virtual_stages": self.v, "virtual": self.virtual,
                "microbatches": self.microbatches,
                "dp_mode": self.dp_mode, "sp": self.sp, "global_batch": self.global_batch,
                "stage_layers": list(self.stage_layer_counts) if self.stage_layer_counts
                else None, "recompute": self.recompute,
                "micro_batch_size": self.micro_batch_size}

    @classmethod
    def from_dict(cls, d: dict) -> "Candidate":
        return cls(layout=parse_layout(d["layout"]), schedule=d.get("schedule") or "1f1b",
                   microbatches=int(d["microbatches"]), dp_mode=d.get("dp_mode", "ddp"),
                   sp=bool(d.get("sp", True)), global_batch=int(d["global_batch"]),
                   virtual=d.get("virtual"),
                   stage_layer_counts=tuple(d["stage_layers"]) if d.get("stage_layers")
                   else None, recompute=d.get("recompute"))


@functools.lru_cache(maxsize=1024)
def _stage_layers(n_layers: int, n_stages: int, counts: tuple[int, ...] | None
                  ) -> tuple[tuple[int, ...], ...]:
    """``parallel.layout.stage_layers``, kept (a layout search asks it thousands of times)."""
    return tuple(tuple(s) for s in stage_layers(n_layers, n_stages,
                                                list(counts) if counts else None))
