"""Record any training loop into a meshscope run directory.

Our runner (``meshscope run``) is one way to get a run directory; ``Recorder`` is the other, for
loops written with anything else — plain DDP, FSDP, torchtitan, your own. Wrap the loop, call
``step()`` once per step, and each rank leaves what the runner leaves (docs/run-directory.md)::

    dist.init_process_group()             # set TORCH_FR_BUFFER_SIZE before this (below)
    with Recorder("runs/a", mesh=mesh, profile_steps=(2, 4)) as rec:
        for batch in data:
            with rec.phase("fwd_bwd"):    # optional: phase times and the analysis annotations
                loss = model(batch).mean(); loss.backward()
            with rec.phase("optimizer"):
                opt.step(); opt.zero_grad()
            rec.step(loss=loss.item(), tokens=batch.numel())

- ``traces/rank{R}.json.gz``: the PyTorch profiler runs on the ``profile_steps`` schedule
  (inclusive, 0-based, the step before the first is its warm-up); ``step()`` advances it.
- ``steps/rank{R}.parquet``: ``collectors.step_timer`` — ``step()`` closes the current step and
  opens the next; the step still open when the block ends is dropped (it was not a full step).
- ``comms/rank{R}.json``: the Flight Recorder buffer, dumped when the block ends (reason ``end``,
  or ``exception`` with the error — the exception is always re-raised). The buffer holds the
  last ``TORCH_FR_BUFFER_SIZE`` operations, read when the process groups are created: set it
  *before* ``init_process_group``, where you launch (``TORCH_FR_BUFFER_SIZE=20000 torchrun …``,
  as our runner does). Unset, torch 2.13 keeps 2000 (older releases kept none); 0 turns it off.
- ``run.json`` (rank 0): written as ``running`` on entry and ``completed`` / ``failed`` on exit.
  ``out_dir`` must be new or empty (every rank refuses a used one, together).
  The status is rank 0's view: on exit no rank talks to the others, so that a failing rank can
  never hang the recorder.

The layout comes from ``layout={"dp": 2, "tp": 4}`` when given, else from the DeviceMesh: each
mesh dimension maps to a parallel dimension by ``DIMENSIONS`` (``dp_shard`` and
``dp_replicate`` are both data parallelism, so dp = their product); a name not in the table keeps
its own name. Without a mesh the layout is dp = world size. Process groups (torch name,
description, ranks, dimension) are gathered from all ranks with one ``all_gather_object`` on
entry, so that nothing disturbs the profiled steps.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import platform
import socket
import sys
import uuid
import warnings

import torch
import torch.distributed as dist
from torch.profiler import record_function

from . import annotations, flight_recorder, run_dir
from .devices import lookup
from .profiling import at_step_start, make_profiler
from .run_dir import RUN_JSON, steps_path, write_json_atomic
from .run_info import MESH_DIMENSIONS, DeviceInfo, ModelInfo, ProcessGroup, RunInfo
from .step_timer import StepTimer
from meshscope.vocabulary import PARALLEL_DIMS

# Mesh dimension name -> parallel dimension. Any other name is kept as it is.
DIMENSIONS = MESH_DIMENSIONS
_PHASE_RANGES = {"fwd_bwd": annotations.PIPELINE, "optimizer": annotations.OPTIMIZER}


def infer_layout(mesh_dims: list[str], shape: list[int], world: int) -> dict[str, int]:
    """Sizes of dp, tp, pp, cp, ep (and of any unknown mesh dimension) from a mesh."""
    layout = dict.fromkeys(PARALLEL_DIMS, 1)
    if not mesh_dims:
        layout["dp"] = world
    for name, n in zip(mesh_dims, shape):
        dim = DIMENSIONS.get(name, name)
        layout[dim] = layout.get(dim, 1) * n
    return layout


def given_layout(given: dict, world: int) -> dict[str, int]:
    """A user's layout, completed with size 1; ValueError if dp·tp·pp·cp is not the world."""
    layout = {**dict.fromkeys(PARALLEL_DIMS, 1), **{k: int(v) for k, v in given.items()}}
    n = layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"]
    if set(layout) == set(PARALLEL_DIMS) and n != world:
        raise ValueError(f"layout {layout_str(layout)} has dp·tp·pp·cp = {n} ranks, "
                         f"but the world has {world}")
    return layout


def layout_str(layout: dict[str, int]) -> str:
    return ",".join(f"{d}={n}" for d, n in layout.items() if n > 1) or "dp=1"


class Recorder:
    def __init__(self, out_dir, *, mesh=None, layout: dict | None = None,
                 profile_steps: tuple[int, int] | None = (2, 4),
                 model_flops_per_token: float | None = None,
                 global_batch_tokens: int | None = None, schedule: str | None = None,
                 microbatches: int = 1, virtual_stages: int = 1, flush_every: int = 10,
                 peak_flops: float | None = None, memory_bandwidth: float | None = None):
        self.out = pathlib.Path(out_dir).resolve()
        self.mesh, self.profile_steps = mesh, profile_steps and tuple(profile_steps)
        if self.profile_steps and not 0 <= self.profile_steps[0] <= self.profile_steps[1]:
            raise ValueError(f"profile_steps {profile_steps}: expected (first, last) with "
                             f"0 <= first <= last")
        self._given_layout = layout
        self._opts = dict(flops=model_flops_per_token, tokens=global_batch_tokens,
                          schedule=schedule, microbatches=microbatches,
                          virtual=virtual_stages, peak=peak_flops, bw=memory_bandwidth)
        self.flush_every = flush_every
        self.step_index = 0
        self.info: RunInfo | None = None     # the run as run.json says (rank 0 writes it)

    # -- collection -----------------------------------------------------------------------
    def _groups_here(self) -> list[dict]:
        """This rank's process groups: one per mesh dimension, and the default group."""
        pairs = [(name, self.mesh.get_group(i)) for i, name in enumerate(self._dims)]
        pairs.append((None, dist.group.WORLD))
        return [{"name": g.group_name, "desc": getattr(g, "group_desc", None),
                 "ranks": dist.get_process_group_ranks(g), "mesh_dim": name} for name, g in pairs]

    def _describe(self, gathered: list[dict]) -> RunInfo:
        """The run as rank 0 writes it to run.json (``RunInfo.to_dict``), from every rank's
        gathered groups, host and start."""
        mine, world = gathered[0], len(gathered)
        shape = list(self.mesh.mesh.shape) if self.mesh is not None else [world]
        layout = (given_layout(self._given_layout, world) if self._given_layout
                  else infer_layout(self._dims, shape, world))
        # Without a mesh the ranks form one flat dimension: dp when that is the layout.
        dims = self._dims or ["dp" if layout["dp"] == world else "rank"]
        grid = self.mesh.mesh if self.mesh is not None else torch.arange(world)
        coords = {int(r): dict(zip(dims, (int(i) for i in idx)))
                  for idx, r in zip(torch.nonzero(grid >= 0).tolist(), grid.flatten())}
        groups, seen = [], set()
        for info in gathered:
            for g in info["groups"]:
                key = (g["name"], tuple(g["ranks"]))
                if key in seen or (g["mesh_dim"] is None and any(
                        h["name"] == g["name"] for h in groups)):
                    continue  # the default group, when a mesh dimension already is it
                seen.add(key)
                dim = (DIMENSIONS.get(g["mesh_dim"], g["mesh_dim"]) if g["mesh_dim"] else
                       "dp" if self.mesh is None else "world")
                groups.append(ProcessGroup(dim, tuple(g["ranks"]), g["name"], g["desc"],
                                           g["mesh_dim"]))
        order = {name: i for i, name in enumerate(self._dims)}
        groups.sort(key=lambda g: (order.get(g.mesh_dim, len(order)), list(g.ranks)))
        o, pp = self._opts, layout.get("pp", 1)
        cuda = self._device_type == "cuda"
        name = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
        known = lookup(name) or (None, None)
        return RunInfo(
            path=self.out / RUN_JSON, run_id=mine["run_id"], status="running",
            recorded_by="collectors.Recorder", layout=layout, layout_str=layout_str(layout),
            world_size=world, mesh_dims=tuple(dims), mesh_shape=tuple(shape),
            coordinates=coords, process_groups=tuple(groups),
            schedule=o["schedule"] if pp > 1 else None, microbatches=o["microbatches"],
            virtual_stages=o["virtual"], stage_layers=None, steps=None,
            profile_steps=self.profile_steps or None, dp_mode=None, sequence_parallel=None,
            global_batch=None, global_batch_tokens=o["tokens"],
            nnodes=len({g["host"] for g in gathered}),
            hosts={i: g["host"] for i, g in enumerate(gathered)},
            model=ModelInfo(flops_per_token=o["flops"]),
            device=DeviceInfo(type=self._device_type, name=name, backend=self._backend,
                              peak_flops=o["peak"] or known[0],
                              memory_bandwidth_bytes_per_s=o["bw"] or known[1],
                              peak_source="Recorder arguments" if o["peak"] or o["bw"] else
                              "collectors/devices.py" if known[0] else None),
            faults=(), kind=None, versions=run_dir.versions(), command=tuple(sys.argv),
            start_time=mine["start_time"], end_time=None)

    # -- the context manager ---------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        if not dist.is_initialized():
            raise RuntimeError("Recorder needs torch.distributed initialised "
                               "(dist.init_process_group) before it starts")
        self.rank, self._backend = dist.get_rank(), dist.get_backend()
        self._device_type = (self.mesh.device_type if self.mesh is not None
                             else "cuda" if self._backend == "nccl" else "cpu")
        self._dims = list(self.mesh.mesh_dim_names or ()) if self.mesh is not None else []
        if self.mesh is not None and not self._dims:
            self._dims = [f"dim{i}" for i in range(self.mesh.ndim)]
        if self.rank == 0 and os.environ.get("TORCH_FR_BUFFER_SIZE", "").strip() == "0":
            warnings.warn("TORCH_FR_BUFFER_SIZE=0: the Flight Recorder records nothing "
                          "(set it, e.g. to 20000, before init_process_group)", stacklevel=2)
        here = {"run_id": uuid.uuid4().hex[:12], "start_time": run_dir.now(),
                "host": socket.gethostname(), "groups": self._groups_here(),
                "used": self.out.is_dir() and any(self.out.iterdir())}
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, here)
        if any(g["used"] for g in gathered):  # every rank raises, none waits for the others
            raise FileExistsError(f"output directory {self.out} exists and is not empty "
                                  f"(choose a new one)")
        self.info = self._describe(gathered)
        if self.rank == 0:
            write_json_atomic(self.out / RUN_JSON, self.info.to_dict())
        self.timer = StepTimer(steps_path(self.out, self.rank), self.rank,
                               flush_every=self.flush_every, cuda=self._device_type == "cuda")
        self.prof = None
        if self.profile_steps:
            meta = {"layout": self.info.layout_str, "rank": self.rank,
                    "coordinates": dict(self.info.coordinates.get(self.rank, {})),
                    "run_id": self.info.run_id}
            self.prof = make_profiler(self.out, self.rank, self.profile_steps,
                                      torch.device(self._device_type), meta)
            self.prof.start()
            at_step_start(self.prof, 0, self.profile_steps)
        self.timer.start()
        return self

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time a phase of the current step (``fwd_bwd`` or ``optimizer``) and mark it in the
        trace with the range the analysis knows (``meshscope/pipeline``, ``/optimizer``)."""
        if name not in _PHASE_RANGES:
            raise ValueError(f"unknown phase {name!r} (known: {', '.join(_PHASE_RANGES)})")
        with self.timer.phase(name), record_function(_PHASE_RANGES[name]):
            yield

    def step(self, *, loss: float | None = None, tokens: int = 0) -> float:
        """Close the current step (its loss and the tokens this rank processed) and open the
        next; returns the closed step's wall time in µs."""
        wall = self.timer.stop(self.step_index, tokens=tokens, loss=loss)
        self.step_index += 1
        if self.prof is not None:
            self.prof.step()
            at_step_start(self.prof, self.step_index, self.profile_steps)
        self.timer.start()
        return wall

    def _finish_run_json(self, error: str | None) -> None:
        self.info = dataclasses.replace(
            self.info, status="failed" if error else "completed", end_time=run_dir.now(),
            steps=self.step_index, error=f"rank 0: {error}" if error else None)
        write_json_atomic(self.out / RUN_JSON, self.info.to_dict())

    def __exit__(self, exc_type, exc, tb) -> bool:
        error = f"{exc_type.__name__}: {exc}" if exc_type else None
        # Each part runs even if the one before it failed: profiler, step timers, dump, run.json.
        with contextlib.ExitStack() as stack:
            if self.rank == 0:
                stack.callback(self._finish_run_json, error)
            stack.callback(flight_recorder.dump, self.out, self.rank,
                           "exception" if exc_type else "end", error)
            stack.callback(self.timer.flush)
            if self.prof is not None:
                stack.callback(self.prof.stop)
        return False  # never swallow the exception
