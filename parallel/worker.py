"""The per-rank training program that ``parallel.launch`` starts under torchrun.

``python -m parallel.worker CONFIG.json`` — reads the run configuration the launcher wrote,
builds the named DeviceMesh, applies the parallel dimensions to a plain model (pipeline split,
then DDP over ``dp``), trains, and records what ``collectors`` defines: the Kineto trace of the
profiled steps, the step timers, and this rank's process-group table.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import record_function

from collectors import annotations
from collectors.profiling import embed_metadata, make_profiler
from collectors.run_dir import steps_path, write_json_atomic
from collectors.step_timer import StepTimer

from .data import dp_shard, global_batch
from .layout import Layout, stage_layers
from .model import ModelConfig, build_model, lm_loss
from .pipeline import build_schedule, split_model


def _device() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def _group_table(mesh, layout: Layout) -> list[dict]:
    """This rank's process groups, one per mesh dimension."""
    out = []
    for dim in layout.mesh_dims:
        group = mesh[dim].get_group()
        out.append({"name": group.group_name, "desc": getattr(group, "group_desc", f"mesh_{dim}"),
                    "dimension": dim, "ranks": dist.get_process_group_ranks(group)})
    return out


def _train_step_no_pp(model, x, y, microbatches: int) -> float:
    """Gradient accumulation over microbatches; DDP syncs only on the last backward."""
    total = 0.0
    xs, ys = x.chunk(microbatches), y.chunk(microbatches)
    for i, (xm, ym) in enumerate(zip(xs, ys)):
        last = i == microbatches - 1
        sync = model.no_sync() if isinstance(model, DDP) and not last else _nullcontext()
        with sync:
            with record_function(annotations.microbatch("forward", 0, 0, i)):
                loss = lm_loss(model(xm), ym)
            with record_function(annotations.microbatch("backward", 0, 0, i)):
                (loss / microbatches).backward()
        total += loss.item()
    return total / microbatches


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@record
def main(config_path: str) -> None:
    conf = json.loads(pathlib.Path(config_path).read_text())
    run_dir = pathlib.Path(conf["run_dir"])
    layout = Layout(conf["layout"])
    cfg = ModelConfig(**conf["model"])
    device, backend = _device()
    dist.init_process_group(backend)
    rank = dist.get_rank()
    mesh = init_device_mesh(device.type, tuple(layout.size(d) for d in layout.mesh_dims),
                            mesh_dim_names=layout.mesh_dims)
    coords = layout.coordinates(rank)
    write_json_atomic(run_dir / ".meta" / f"rank{rank}.json",
                      {"rank": rank, "coordinates": coords, "groups": _group_table(mesh, layout),
                       "device": str(device), "backend": backend})

    pp, dp = layout.size("pp"), layout.size("dp")
    stage = coords["pp"]
    model = build_model(cfg, conf["seed"])
    if pp > 1:
        split_model(model, stage_layers(cfg.n_layers, pp)[stage], first=stage == 0,
                    last=stage == pp - 1)
    model.to(device)
    if dp > 1:
        model = DDP(model, process_group=mesh["dp"].get_group(),
                    device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=conf["lr"])
    schedule = None
    if pp > 1:
        schedule = build_schedule(model, stage_index=stage, num_stages=pp, device=device,
                                  group=mesh["pp"].get_group(), schedule=conf["schedule"],
                                  microbatches=conf["microbatches"], loss_fn=lm_loss)
    is_last = stage == pp - 1
    timer = StepTimer(steps_path(run_dir, rank), rank,
                      sync=torch.cuda.synchronize if device.type == "cuda" else None)
    meta = {"layout": str(layout), "rank": rank, "coordinates": coords,
            "run_id": conf["run_id"]}
    prof = make_profiler(run_dir, rank, conf["profile_steps"], device, meta)
    local_tokens = conf["global_batch"] // dp * cfg.seq_len
    try:
        with prof:
            for step in range(conf["steps"]):
                x, y = global_batch(conf["seed"], step, conf["global_batch"], cfg.seq_len,
                                    cfg.vocab_size)
                x, y = dp_shard(x, coords["dp"], dp).to(device), dp_shard(y, coords["dp"], dp).to(device)
                embed_metadata(prof, step, tuple(conf["profile_steps"]))
                timer.start()
                opt.zero_grad(set_to_none=True)
                with record_function(annotations.PIPELINE):
                    if schedule is None:
                        loss = _train_step_no_pp(model, x, y, conf["microbatches"])
                    else:
                        losses: list = []
                        if stage == 0:
                            schedule.step(x)
                        elif is_last:
                            schedule.step(target=y, losses=losses)
                        else:
                            schedule.step()
                        loss = torch.stack(losses).mean().item() if is_last else None
                with record_function(annotations.OPTIMIZER):
                    opt.step()
                timer.stop(step, tokens=local_tokens, loss=loss)
                prof.step()
    finally:
        timer.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
