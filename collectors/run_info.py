"""run.json as a typed object: what a run was (layout, mesh, process groups, schedule, model,
device), read once at the boundary and passed around as ``RunInfo``.

``read_run_info(run_dir)`` returns None when the folder has no run.json (a plain folder of
traces), else a ``RunInfo``; a run.json that cannot be used raises ``RunDirError`` whose one-line
message names the file, the field (as a JSON path, ``$.process_groups[2].ranks``) and what is
wrong. The checks, in order: a bounded decode (``schema.read_document``), the schema version,
the JSON Schema (``collectors/schemas/run.schema.json``), the types ``from_dict`` reads, and the
bounds the schema cannot state (``check_bounds``: the layout's product is the world size, the
mesh places every rank once below it, groups and faults name ranks below it, the pipeline's
stages, microbatches and stage layers agree). No list or set is sized by a number from the file
before these checks pass, and the world size is at most ``MAX_WORLD_SIZE``. Readers never
index the raw dict (``raw``, the document as read: only ``check_bounds`` here looks at it):
every field the analysis uses is an attribute here, with its unit or meaning in its name.

``RunInfo.to_dict()`` is the one writer of run.json's content: the runner's launcher
(``parallel/launch.py``) and the Recorder (``collectors/recorder.py``) build a ``RunInfo`` and
write its dict; a change of state (completed, failed, the group names the ranks report) is a
new value made with ``dataclasses.replace``. ``from_dict(info.to_dict())`` is ``info`` again.

The process groups of a run are ``ProcessGroup`` records: the dimension they belong to (``dp``,
``tp``, ``pp``, ``cp``, ``ep``, ``ep_replica``, ``world``…), their global ranks (sorted), and
torch's name and description of the group (the ``pg_name`` / ``pg_desc`` that traces and Flight
Recorder dumps carry). The default group (name ``"0"``, every rank) is always known, whether or
not run.json lists it.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping

from meshscope.theory.schedules import SCHEDULES
from meshscope.vocabulary import COORDINATE_ORDER

from . import schema
from .run_dir import RUN_JSON, RUN_SCHEMA_VERSION, RunDirError

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


# -- reading ---------------------------------------------------------------------------------

def _field(path: pathlib.Path, where: str, problem: str) -> RunDirError:
    return RunDirError(f"{path}: {where}: {problem}")


def _int(value, path, where, *, minimum: int | None = None, default=None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _field(path, where, f"expected an integer, got {json.dumps(value)[:40]}")
    if minimum is not None and value < minimum:
        raise _field(path, where, f"must be at least {minimum}, got {value}")
    return value


def _num(value, path, where) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value != value or value == float("inf"):
        raise _field(path, where, f"expected a positive finite number, got "
                                  f"{json.dumps(value)[:40]}")
    return float(value)


def _str(value, path, where) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _field(path, where, f"expected a string, got {json.dumps(value)[:40]}")
    return value


def _schedule(value, path) -> str | None:
    """run.json's pipeline schedule: one meshscope knows (``theory.schedules.SCHEDULES``), or
    none. An unknown name is refused — read as no schedule, the bubble would have no theory to
    be held against and its finding would vanish without a word."""
    name = _str(value, path, "$.schedule")
    if name is not None and name not in SCHEDULES:
        raise _field(path, "$.schedule", f"unknown schedule {json.dumps(name)[:40]} "
                                         f"(meshscope knows {', '.join(SCHEDULES)})")
    return name


def _obj(value, path, where) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _field(path, where, f"expected an object, got {json.dumps(value)[:40]}")
    return value


def from_dict(data: Mapping[str, Any], path: pathlib.Path) -> RunInfo:
    """A ``RunInfo`` of parsed run.json ``data`` (already checked against the schema by
    ``read_run_info``); RunDirError naming the field for what the schema cannot state."""
    path = pathlib.Path(path)
    layout_raw = _obj(data.get("layout"), path, "$.layout")
    layout = {str(k): _int(v, path, f"$.layout.{k}", minimum=1) for k, v in layout_raw.items()}
    world = _int(data.get("world_size"), path, "$.world_size", minimum=1)
    if world is None:
        raise _field(path, "$.world_size", "missing")
    mesh = _obj(data.get("mesh"), path, "$.mesh")
    coords = _coordinates(mesh, path)
    groups = _process_groups(data, path)
    pipe = _obj(data.get("pipeline"), path, "$.pipeline")
    micro = _int(data.get("microbatches", pipe.get("microbatches")), path, "$.microbatches",
                 minimum=1, default=1)
    stage_layers = _stage_layers(pipe, path)
    profile = data.get("profile_steps")
    if profile is not None:
        if not (isinstance(profile, list) and len(profile) == 2):
            raise _field(path, "$.profile_steps", "expected [first, last]")
        profile = tuple(_int(x, path, "$.profile_steps", minimum=0) for x in profile)
    model = _model(_obj(data.get("model"), path, "$.model"), path)
    device = _device(_obj(data.get("device"), path, "$.device"), path)
    faults = tuple(FaultInfo(_str(f.get("kind"), path, f"$.faults[{i}].kind") or "",
                             _int(f.get("rank"), path, f"$.faults[{i}].rank", minimum=0),
                             _int(f.get("value"), path, f"$.faults[{i}].value"))
                   for i, f in enumerate(_obj(x, path, f"$.faults[{i}]")
                                         for i, x in enumerate(data.get("faults") or [])))
    return RunInfo(
        path=path, run_id=_str(data.get("run_id"), path, "$.run_id"),
        status=_str(data.get("status"), path, "$.status"), layout=layout,
        layout_str=_str(data.get("layout_str"), path, "$.layout_str")
        or ",".join(f"{k}={v}" for k, v in layout.items() if v > 1) or "dp=1",
        world_size=world,
        mesh_dims=tuple(str(x) for x in (mesh.get("dims") or [])),
        coordinates=coords, process_groups=tuple(groups),
        schedule=_schedule(data.get("schedule"), path),
        microbatches=micro,
        virtual_stages=_int(pipe.get("virtual_stages"), path, "$.pipeline.virtual_stages",
                            minimum=1, default=1),
        stage_layers=stage_layers,
        steps=_int(data.get("steps"), path, "$.steps", minimum=0),
        profile_steps=profile,
        dp_mode=_str(data.get("dp_mode"), path, "$.dp_mode"),
        sequence_parallel=data.get("sequence_parallel")
        if isinstance(data.get("sequence_parallel"), bool) else None,
        global_batch=_int(data.get("global_batch"), path, "$.global_batch", minimum=1),
        model=model, device=device, faults=faults,
        kind=_str(data.get("kind"), path, "$.kind"),
        start_time=_str(data.get("start_time"), path, "$.start_time"),
        raw=data,
        mesh_shape=tuple(_int(x, path, "$.mesh.shape", minimum=1)
                         for x in (mesh.get("shape") or [])),
        nnodes=_int(data.get("nnodes"), path, "$.nnodes", minimum=1),
        seed=_int(data.get("seed"), path, "$.seed"),
        lr=data.get("lr") if isinstance(data.get("lr"), (int, float))
        and not isinstance(data.get("lr"), bool) else None,
        global_batch_tokens=_tokens(data.get("global_batch_tokens")),
        hosts=None if data.get("hosts") is None else {
            int(r): str(h) for r, h in _obj(data.get("hosts"), path, "$.hosts").items()
            if str(r).isdigit()},
        recorded_by=_str(data.get("recorded_by"), path, "$.recorded_by"),
        versions=_obj(data.get("versions"), path, "$.versions"),
        command=tuple(str(x) for x in data.get("command") or []),
        end_time=_str(data.get("end_time"), path, "$.end_time"),
        error=_str(data.get("error"), path, "$.error"))


def _coordinates(mesh: Mapping[str, Any], path: pathlib.Path) -> dict[int, dict[str, int]]:
    """rank → its coordinate per mesh dimension (``$.mesh.coordinates``)."""
    coords: dict[int, dict[str, int]] = {}
    for key, c in _obj(mesh.get("coordinates"), path, "$.mesh.coordinates").items():
        where = f"$.mesh.coordinates.{key}"
        if not str(key).isdigit():
            raise _field(path, where, "a rank must be a decimal number")
        coords[int(key)] = {str(d): _int(i, path, f"{where}.{d}", minimum=0)
                            for d, i in _obj(c, path, where).items()}
    return coords


def _process_groups(data: Mapping[str, Any], path: pathlib.Path) -> list[ProcessGroup]:
    """The process groups (``$.process_groups``), each with its sorted ranks and dimension."""
    groups = []
    for i, g in enumerate(data.get("process_groups") or []):
        where = f"$.process_groups[{i}]"
        g = _obj(g, path, where)
        ranks = g.get("ranks")
        if not isinstance(ranks, list) or not ranks:
            raise _field(path, f"{where}.ranks", "expected a non-empty list of ranks")
        ranks = tuple(sorted(_int(r, path, f"{where}.ranks", minimum=0) for r in ranks))
        dim = _str(g.get("dimension"), path, f"{where}.dimension")
        if dim is None:
            raise _field(path, f"{where}.dimension", "missing")
        name = g.get("name")
        groups.append(ProcessGroup(dim, ranks, None if name is None else str(name),
                                   _str(g.get("desc"), path, f"{where}.desc"),
                                   _str(g.get("mesh_dim"), path, f"{where}.mesh_dim")))
    return groups


def _stage_layers(pipe: Mapping[str, Any], path: pathlib.Path):
    """Each pipeline stage's layers (``$.pipeline.stage_layers``), None when not given."""
    stage_layers = pipe.get("stage_layers")
    if stage_layers is None:
        return None
    if not isinstance(stage_layers, list):
        raise _field(path, "$.pipeline.stage_layers", "expected a list of layer lists")
    return tuple(tuple(_int(x, path, f"$.pipeline.stage_layers[{i}]", minimum=0)
                       for x in (s if isinstance(s, list) else [None]))
                 for i, s in enumerate(stage_layers))


def _model(m: Mapping[str, Any], path: pathlib.Path) -> ModelInfo:
    """The model's shape and counts (``$.model``)."""
    return ModelInfo(
        preset=_str(m.get("preset"), path, "$.model.preset"),
        **{k: _int(m.get(k), path, f"$.model.{k}", minimum=1)
           for k in ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size",
                     "seq_len", "moe_top_k", "moe_every", "moe_hidden")},
        **{k: _num(m.get(k), path, f"$.model.{k}")
           for k in ("rope_theta", "norm_eps", "moe_aux_coef")},
        moe_experts=_int(m.get("moe_experts"), path, "$.model.moe_experts", minimum=0,
                         default=0),
        n_params=_int(m.get("n_params"), path, "$.model.n_params", minimum=0),
        flops_per_token=_num(m.get("flops_per_token"), path, "$.model.flops_per_token"))


def _device(d: Mapping[str, Any], path: pathlib.Path) -> DeviceInfo:
    """The device the run ran on and its peaks (``$.device``)."""
    return DeviceInfo(type=_str(d.get("type"), path, "$.device.type") or "cpu",
                      name=_str(d.get("name"), path, "$.device.name"),
                      backend=_str(d.get("backend"), path, "$.device.backend"),
                      peak_flops=_num(d.get("peak_flops"), path, "$.device.peak_flops"),
                      memory_bandwidth_bytes_per_s=_num(
                          d.get("memory_bandwidth_bytes_per_s"), path,
                          "$.device.memory_bandwidth_bytes_per_s"),
                      peak_source=_str(d.get("peak_source"), path, "$.device.peak_source"))


def _tokens(value) -> int | float | None:
    """A Recorder's ``global_batch_tokens``: a positive number, else unknown (None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return value


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def check_bounds(info: RunInfo) -> None:
    """RunDirError naming the field when ``info`` breaks a bound its schema cannot state
    (module docstring)."""
    path, world = info.path, info.world_size
    if world > MAX_WORLD_SIZE:
        raise _field(path, "$.world_size", f"{world} ranks, more than the {MAX_WORLD_SIZE} "
                                           f"meshscope accepts")
    sizes = dict(info.layout)
    without_ep = _prod(v for k, v in sizes.items() if k != "ep")
    if without_ep != world and _prod(sizes.values()) != world:
        raise _field(path, "$.layout", f"{info.layout_str or sizes}: the dimensions multiply to "
                                       f"{without_ep} ranks, but world_size is {world}")
    if world % sizes.get("ep", 1):
        raise _field(path, "$.layout.ep", f"ep={sizes['ep']} does not divide the world of "
                                          f"{world} ranks")
    mesh = info.raw.get("mesh") or {}
    shape = mesh.get("shape") or []
    if shape and len(shape) != len(info.mesh_dims):
        raise _field(path, "$.mesh.shape", f"{len(shape)} sizes for {len(info.mesh_dims)} "
                                           f"dimensions")
    if shape and _prod(shape) != world:
        raise _field(path, "$.mesh.shape", f"{shape} holds {_prod(shape)} ranks, but "
                                           f"world_size is {world}")
    extent = dict(zip(info.mesh_dims, shape))
    seen: dict[tuple, int] = {}
    for rank, coords in sorted(info.coordinates.items()):
        where = f"$.mesh.coordinates.{rank}"
        if rank >= world:
            raise _field(path, where, f"rank {rank} is not below world_size {world}")
        for dim, i in coords.items():
            if dim in extent and i >= extent[dim]:
                raise _field(path, f"{where}.{dim}", f"index {i} is not below the mesh's "
                                                     f"{dim} size {extent[dim]}")
        key = tuple(sorted(coords.items()))
        if extent and key in seen:
            raise _field(path, where, f"the same coordinates as rank {seen[key]}")
        seen[key] = rank
    for i, g in enumerate(info.process_groups):
        if g.ranks[-1] >= world:
            raise _field(path, f"$.process_groups[{i}].ranks",
                         f"rank {g.ranks[-1]} is not below world_size {world}")
    for i, f in enumerate(info.faults):
        if f.rank >= world:
            raise _field(path, f"$.faults[{i}].rank", f"rank {f.rank} is not below world_size "
                                                      f"{world}")
    pipe = info.raw.get("pipeline") or {}
    stages = pipe.get("stages")
    if stages is not None and stages != info.pipeline_stages:
        raise _field(path, "$.pipeline.stages", f"{stages} stages, but the layout has "
                                                f"pp={info.pipeline_stages}")
    top, inner = info.raw.get("microbatches"), pipe.get("microbatches")
    if top is not None and inner is not None and top != inner:
        raise _field(path, "$.pipeline.microbatches", f"{inner}, but $.microbatches is {top}")
    if info.stage_layers is not None and \
            len(info.stage_layers) != info.pipeline_stages * info.virtual_stages:
        raise _field(path, "$.pipeline.stage_layers",
                     f"{len(info.stage_layers)} stages listed, but pp × virtual_stages is "
                     f"{info.pipeline_stages * info.virtual_stages}")
    if info.profile_steps is not None:
        first, last = info.profile_steps
        if first > last:
            raise _field(path, "$.profile_steps", f"[{first}, {last}] ends before it starts")
        if info.steps is not None and last >= info.steps:
            raise _field(path, "$.profile_steps", f"step {last} is not below steps "
                                                  f"({info.steps})")


def read_run_info(run: pathlib.Path) -> RunInfo | None:
    """The typed run.json of run directory ``run``; None when it has none; RunDirError when it
    cannot be used (unreadable, not an object, unknown schema version, a field of the wrong
    type or out of bounds: module docstring)."""
    path = pathlib.Path(run) / RUN_JSON
    if not path.exists():
        return None
    data = schema.read_document(path, "run.json")
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: expected a JSON object, got {schema.short(data)}")
    version = data.get("schema_version")
    if version != RUN_SCHEMA_VERSION:
        raise RunDirError(f"{path}: $.schema_version: unknown version {schema.short(version)} "
                          f"(this meshscope reads version {RUN_SCHEMA_VERSION})")
    schema.check(data, path)
    info = from_dict(data, path)
    check_bounds(info)
    return info
