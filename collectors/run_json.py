"""Reading run.json into a ``RunInfo`` (``collectors/run_info.py``), every field checked.

``read_run_info(run_dir)`` returns None when the folder has no run.json (a plain folder of
traces), else a ``RunInfo``; a run.json that cannot be used raises ``RunDirError`` whose one-line
message names the file, the field (as a JSON path, ``$.process_groups[2].ranks``) and what is
wrong. The checks, in order: a bounded decode (``schema.read_document``), the schema version,
the JSON Schema (``collectors/schemas/run.schema.json``), the types ``from_dict`` reads, and the
bounds the schema cannot state (``check_bounds``: the layout's product is the world size, the
mesh places every rank once below it, groups and faults name ranks below it, the pipeline's
stages, microbatches and stage layers agree). No list or set is sized by a number from the file
before these checks pass, and the world size is at most ``MAX_WORLD_SIZE``.
``from_dict(info.to_dict())`` is ``info`` again.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping

from meshscope.theory.schedules import SCHEDULES

from . import schema
from .run_dir import RUN_JSON, RUN_SCHEMA_VERSION, RunDirError
from .run_info import (MAX_WORLD_SIZE, DeviceInfo, FaultInfo, ModelInfo, ProcessGroup, RunInfo)


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
