"""Launch a profiled training run: validate, describe it in run.json, start the ranks.

Everything that can be checked before launch is checked here (``layout.validate``) so that a
bad layout costs one line and exit code 2, not a crash in eight processes. The ranks are then
started through torchrun's own machinery (``torch.distributed.run``), gloo on CPU and NCCL on
CUDA; a failing rank ends the whole job, and ``LaunchError`` names the rank and its error.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import pathlib
import platform
import shutil
import sys
import uuid

import torch

from collectors.run_dir import RUN_JSON, RUN_SCHEMA_VERSION, write_json_atomic

from .layout import Layout, LayoutError, stage_layers, validate
from .model import ModelConfig


class LaunchError(RuntimeError):
    """The job started but a rank failed; the message names the rank and its error."""


@dataclasses.dataclass
class RunOptions:
    layout: Layout
    model: ModelConfig
    out: pathlib.Path
    schedule: str = "1f1b"
    microbatches: int = 4
    steps: int = 6
    seed: int = 0
    global_batch: int = 16
    lr: float = 1e-3
    profile_steps: tuple[int, int] | None = None
    model_preset: str = "tiny"
    command: list[str] = dataclasses.field(default_factory=lambda: list(sys.argv))


def check(opts: RunOptions) -> None:
    """Every pre-launch check; raises LayoutError."""
    validate(opts.layout, opts.model, schedule=opts.schedule, microbatches=opts.microbatches,
             global_batch=opts.global_batch)
    if opts.steps < 1:
        raise LayoutError("--steps must be at least 1")
    if opts.profile_steps is not None and opts.profile_steps[1] >= opts.steps:
        raise LayoutError(f"--profile-steps {opts.profile_steps[0]}-{opts.profile_steps[1]} "
                          f"goes past the last step {opts.steps - 1}")
    out = pathlib.Path(opts.out)
    if out.exists() and any(out.iterdir()):
        raise LayoutError(f"output directory {out} exists and is not empty (choose a new one)")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _versions() -> dict:
    import importlib.metadata as md
    out = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        out["meshscope"] = md.version("meshscope")
    except md.PackageNotFoundError:
        out["meshscope"] = "unknown"
    return out


def run_description(opts: RunOptions, run_id: str) -> dict:
    """The launcher's part of run.json (process-group names are added from the ranks)."""
    layout, cfg = opts.layout, opts.model
    pp = layout.size("pp")
    cuda = torch.cuda.is_available()
    return {
        "schema_version": RUN_SCHEMA_VERSION,
        "run_id": run_id,
        "status": "running",
        "layout": {d: layout.size(d) for d in ("dp", "tp", "pp", "cp", "ep")},
        "layout_str": str(layout),
        "world_size": layout.world_size,
        "mesh": {"dims": list(layout.mesh_dims),
                 "shape": [layout.size(d) for d in layout.mesh_dims],
                 "coordinates": {str(r): layout.coordinates(r)
                                 for r in range(layout.world_size)}},
        "process_groups": [{"dimension": d, "ranks": g}
                           for d in layout.mesh_dims for g in layout.groups(d)],
        "schedule": opts.schedule if pp > 1 else None,
        "pipeline": {"stages": pp, "virtual_stages": 1, "microbatches": opts.microbatches,
                     "stage_layers": stage_layers(cfg.n_layers, pp)},
        "microbatches": opts.microbatches,
        "global_batch": opts.global_batch,
        "steps": opts.steps,
        "profile_steps": list(opts.profile_steps),
        "seed": opts.seed,
        "lr": opts.lr,
        "model": {"preset": opts.model_preset, **dataclasses.asdict(cfg),
                  "n_params": cfg.n_params(), "flops_per_token": cfg.flops_per_token()},
        "device": {"type": "cuda" if cuda else "cpu",
                   "name": torch.cuda.get_device_name(0) if cuda else platform.processor()
                   or platform.machine(),
                   "backend": "nccl" if cuda else "gloo"},
        "versions": _versions(),
        "command": opts.command,
        "start_time": _now(),
        "end_time": None,
    }


def _merge_rank_meta(run: pathlib.Path, desc: dict) -> None:
    """Fill process-group names from the per-rank tables the workers wrote."""
    meta_dir = run / ".meta"
    by_ranks = {}
    for f in sorted(meta_dir.glob("rank*.json")):
        for g in json.loads(f.read_text())["groups"]:
            by_ranks[(g["dimension"], tuple(g["ranks"]))] = g
    for g in desc["process_groups"]:
        seen = by_ranks.get((g["dimension"], tuple(g["ranks"])))
        if seen:
            g["name"], g["desc"] = seen["name"], seen["desc"]


def _failure_message(err) -> str:
    parts = []
    for rank, failure in sorted(err.failures.items()):
        msg = failure.message
        if isinstance(msg, dict):
            msg = msg.get("message", "")
        text = str(msg).strip().splitlines()
        last = next((line for line in reversed(text) if line.strip()), "")
        parts.append(f"rank {rank} failed (exit code {failure.exitcode}): "
                     f"{last or 'no error message (see its output above)'}")
    return "; ".join(parts) or str(err)


def launch(opts: RunOptions) -> dict:
    """Run the job; returns the final run.json contents. Raises LayoutError before launch and
    LaunchError if a rank fails."""
    if opts.profile_steps is None:
        from collectors.profiling import default_profile_steps
        opts.profile_steps = default_profile_steps(opts.steps)
    check(opts)
    run = pathlib.Path(opts.out).resolve()
    run.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    desc = run_description(opts, run_id)
    write_json_atomic(run / RUN_JSON, desc)
    config = {"run_dir": str(run), "run_id": run_id, "layout": opts.layout.sizes,
              "model": dataclasses.asdict(opts.model), "schedule": opts.schedule,
              "microbatches": opts.microbatches, "steps": opts.steps, "seed": opts.seed,
              "global_batch": opts.global_batch, "lr": opts.lr,
              "profile_steps": list(opts.profile_steps)}
    config_path = run / ".meta" / "config.json"
    write_json_atomic(config_path, config)

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run as torchrun

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = get_args_parser().parse_args([
        "--standalone", f"--nproc-per-node={opts.layout.world_size}", "--max-restarts=0",
        "--monitor-interval=0.5", "-m", "parallel.worker", str(config_path)])
    try:
        torchrun(args)
    except ChildFailedError as e:
        desc.update(status="failed", end_time=_now(), error=_failure_message(e))
        write_json_atomic(run / RUN_JSON, desc)
        raise LaunchError(desc["error"]) from None
    _merge_rank_meta(run, desc)
    shutil.rmtree(run / ".meta", ignore_errors=True)
    desc.update(status="completed", end_time=_now())
    write_json_atomic(run / RUN_JSON, desc)
    return desc
