"""run.json as a typed object: what a run was (layout, mesh, process groups, schedule, model,
device), read once at the boundary and passed around as ``RunInfo``.

run.json is read, and every field checked, by ``collectors/run_json.py``
(``read_run_info``). Readers never index the raw dict (``raw``, the document as read: only
``run_json.check_bounds`` looks at it): every field the analysis uses is an attribute here,
with its unit or meaning in its name.

``RunInfo.to_dict()`` is the one writer of run.json's content: the runner's launcher
(``parallel/launch.py``) and the Recorder (``collectors/recorder.py``) build a ``RunInfo`` and
write its dict; a change of state (completed, failed, the group names the ranks report) is a
new value made with ``dataclasses.replace``; ``run_json.from_dict(info.to_dict())`` is ``info``
again.

The process groups of a run are ``ProcessGroup`` records: the dimension they belong to (``dp``,
``tp``, ``pp``, ``cp``, ``ep``, ``ep_replica``, ``world``…), their global ranks (sorted), and
torch's name and description of the group (the ``pg_name`` / ``pg_desc`` that traces and Flight
Recorder dumps carry). The default group (name ``"0"``, every rank) is always known, whether or
not run.json lists it.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping

from meshscope.vocabulary import COORDINATE_ORDER

from .run_dir import RUN_SCHEMA_VERSION

# The largest world size meshscope accepts from a file (run.json, a trace's distributedInfo):
# 2^20 ranks, some eight times the largest jobs run today. Sets and lists of ranks are built
# from world sizes, so a larger number is refused, never allocated.
MAX_WORLD_SIZE = 1 << 20
DEFAULT_GROUP_NAME = "0"
# DeviceMesh dimension name -> parallel dimension (torchtitan's dp_shard and dp_replicate are
# both data parallelism); any other name keeps its own.
MESH_DIMENSIONS = {"dp": "dp", "dp_shard": "dp", "dp_replicate": "dp", "tp": "tp", "pp": "pp",
                   "cp": "cp", "ep": "ep"}


def ranks_key(ranks) -> str:
    """The canonical text of a rank set, ``"0,1,3"`` (sorted): how tables name a group's
    ranks."""
    return ",".join(str(r) for r in sorted(int(x) for x in ranks))


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    dimension: str
    ranks: tuple[int, ...]
    name: str | None = None
    desc: str | None = None
    # The DeviceMesh dimension a Recorder's group came from (None: the default group); the
    # runner's run.json does not carry it.
    mesh_dim: str | None = dataclasses.field(default=None, compare=False)

    def to_dict(self, recorder: bool) -> dict:
        """Its entry of run.json's ``process_groups`` (``RunInfo.to_dict``): name and desc
        once known (the runner learns them from its ranks), the mesh dimension in a
        Recorder's."""
        d: dict[str, Any] = {"dimension": self.dimension, "ranks": list(self.ranks)}
        if recorder or self.name is not None:
            d.update(name=self.name, desc=self.desc)
        if recorder:
            d["mesh_dim"] = self.mesh_dim
        return d

    @property
    def ranks_key(self) -> str:
        return ranks_key(self.ranks)

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """The model as run.json describes it; any field may be unknown (None) for a Recorder run.
    ``rope_theta``, ``norm_eps`` and ``moe_aux_coef`` are the runner's model settings, kept so
    that run.json is written whole (``to_dict``); the analysis reads none of them."""
    preset: str | None = None
    vocab_size: int | None = None
    dim: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    ffn_hidden: int | None = None
    seq_len: int | None = None
    rope_theta: float | None = None
    norm_eps: float | None = None
    moe_experts: int = 0
    moe_top_k: int | None = None
    moe_every: int | None = None
    moe_hidden: int | None = None
    moe_aux_coef: float | None = None
    n_params: int | None = None
    flops_per_token: float | None = None

    def to_dict(self, recorder: bool) -> dict:
        """run.json's ``model``: a Recorder knows only the FLOPs per token (null when not
        given); the runner writes every field it knows (those not None), in field order."""
        if recorder:
            return {"flops_per_token": self.flops_per_token}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    type: str = "cpu"
    name: str | None = None
    backend: str | None = None
    peak_flops: float | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    peak_source: str | None = None      # where the peaks came from (None: unknown)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class FaultInfo:
    kind: str
    rank: int
    value: int


@dataclasses.dataclass(frozen=True)
class RunInfo:
    path: pathlib.Path
    run_id: str | None
    status: str | None
    layout: Mapping[str, int]
    layout_str: str
    world_size: int
    mesh_dims: tuple[str, ...]
    coordinates: Mapping[int, Mapping[str, int]]
    process_groups: tuple[ProcessGroup, ...]
    schedule: str | None
    microbatches: int
    virtual_stages: int
    stage_layers: tuple[tuple[int, ...], ...] | None
    steps: int | None
    profile_steps: tuple[int, int] | None
    dp_mode: str | None
    sequence_parallel: bool | None
    global_batch: int | None
    model: ModelInfo
    device: DeviceInfo
    faults: tuple[FaultInfo, ...]
    kind: str | None
    start_time: str | None
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # What run.json also says, for writing it whole (``to_dict``); the analysis reads only
    # ``global_batch_tokens`` of these (a Recorder's token count, ``records/steps.py``).
    mesh_shape: tuple[int, ...] = ()
    nnodes: int | None = None
    seed: int | None = None
    lr: float | None = None
    global_batch_tokens: int | None = None      # tokens per step, a Recorder's argument
    hosts: Mapping[int, str] | None = None       # rank → host name (a Recorder's)
    recorded_by: str | None = None               # "collectors.Recorder"; None: the runner
    versions: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    command: tuple[str, ...] = ()
    end_time: str | None = None
    error: str | None = None

    # -- writing -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """run.json's content — its one writer (the runner's launcher, ``parallel/launch.py``;
        the Recorder, ``collectors/recorder.py``; ``read_run_info`` reads it back). Two
        kinds, as they have always been written: the runner's (``recorded_by`` None: the
        training settings dp_mode, sequence_parallel, faults, global_batch, seed, lr) and a
        Recorder's (its ``recorded_by``, ``global_batch_tokens`` and ``hosts`` instead).
        ``kind`` (``bench-comm``) and ``error`` only when set. Changing a run's state is a new
        value: ``dataclasses.replace(info, status="completed", end_time=...)``."""
        recorder = self.recorded_by is not None
        d: dict[str, Any] = {"schema_version": RUN_SCHEMA_VERSION, "run_id": self.run_id,
                             "status": self.status}
        if recorder:
            d["recorded_by"] = self.recorded_by
        d.update(
            layout=dict(self.layout), layout_str=self.layout_str, world_size=self.world_size,
            mesh={"dims": list(self.mesh_dims), "shape": list(self.mesh_shape),
                  "coordinates": {str(r): dict(c) for r, c in self.coordinates.items()}},
            process_groups=[g.to_dict(recorder) for g in self.process_groups],
            schedule=self.schedule,
            pipeline={"stages": self.pipeline_stages, "virtual_stages": self.virtual_stages,
                      "microbatches": self.microbatches,
                      "stage_layers": None if self.stage_layers is None
                      else [list(s) for s in self.stage_layers]})
        if recorder:
            d.update(microbatches=self.microbatches,
                     global_batch_tokens=self.global_batch_tokens, nnodes=self.nnodes,
                     hosts=None if self.hosts is None
                     else {str(r): h for r, h in self.hosts.items()})
        else:
            d.update(dp_mode=self.dp_mode, sequence_parallel=self.sequence_parallel,
                     faults=[dataclasses.asdict(f) for f in self.faults], nnodes=self.nnodes,
                     microbatches=self.microbatches, global_batch=self.global_batch)
        d.update(steps=self.steps,
                 profile_steps=None if self.profile_steps is None else list(self.profile_steps))
        if not recorder:
            d.update(seed=self.seed, lr=self.lr)
        d.update(model=self.model.to_dict(recorder), device=self.device.to_dict(),
                 versions=dict(self.versions), command=list(self.command),
                 start_time=self.start_time, end_time=self.end_time)
        if self.kind is not None:
            d["kind"] = self.kind
        if self.error is not None:
            d["error"] = self.error
        return d

    # -- the layout --------------------------------------------------------------------------
    def size(self, dim: str) -> int:
        """The size of parallel dimension ``dim`` (1 when the layout does not name it)."""
        return int(self.layout.get(dim, 1))

    @property
    def pipeline_stages(self) -> int:
        return self.size("pp")

    def rank_label(self, rank: int) -> str:
        """``rank 3 (pp1·dp1)``: the rank and its mesh coordinates in the dimensions of size
        > 1 (``vocabulary.COORDINATE_ORDER``); ``rank 3`` when the mesh does not place it."""
        coords = self.coordinates.get(int(rank))
        parts = [f"{d}{coords[d]}" for d in COORDINATE_ORDER
                 if coords and d in coords and self.size(d) > 1]
        return f"rank {rank}" + (f" ({'·'.join(parts)})" if parts else "")

    def stage_of(self, rank: int) -> int | None:
        """The pipeline coordinate of ``rank`` (0 without pipeline parallelism); None when the
        mesh does not place the rank."""
        coords = self.coordinates.get(int(rank))
        if coords is None:
            return None
        return int(coords.get("pp", 0))

    def stage_peers(self, rank: int) -> list[int]:
        """The other ranks of ``rank``'s pipeline stage: in dp, tp and cp they do the same work
        by construction."""
        stage = self.stage_of(rank)
        return [r for r in sorted(self.coordinates) if r != rank and self.stage_of(r) == stage]

    # -- the process groups ------------------------------------------------------------------
    def groups_along(self, dim: str) -> list[ProcessGroup]:
        return [g for g in self.process_groups if g.dimension == dim]

    def groups_of(self, rank: int) -> dict[str, ProcessGroup]:
        """dimension → the first group of that dimension holding ``rank``."""
        out: dict[str, ProcessGroup] = {}
        for g in self.process_groups:
            if rank in g.ranks:
                out.setdefault(g.dimension, g)
        return out

    def group_named(self, name) -> ProcessGroup | None:
        """The group torch named ``name`` (the default group ``"0"`` is every rank)."""
        name = str(name)
        for g in self.process_groups:
            if g.name == name:
                return g
        if name == DEFAULT_GROUP_NAME:
            return self.default_group
        return None

    @property
    def default_group(self) -> ProcessGroup:
        for g in self.process_groups:
            if g.name == DEFAULT_GROUP_NAME:
                return g
        return ProcessGroup("world", tuple(range(self.world_size)), DEFAULT_GROUP_NAME,
                            "default_pg")

    def dims_of_ranks(self, ranks) -> list[str]:
        """The dimensions whose groups have exactly this rank set (several when dimensions
        coincide, e.g. dp and ep on the same two ranks)."""
        key = ranks_key(ranks)
        return [g.dimension for g in self.process_groups if g.ranks_key == key]
