"""Build this rank's share of the model: the parallelisms applied, in order, to a plain model.

Like torchtitan, each dimension is a ``parallelize_*`` function applied to a plain
``Transformer`` from outside: pipeline split → expert sharding → tensor parallelism → context
parallelism → data parallelism. ``RankModel`` holds the result: one module per local pipeline
stage (one without pipeline parallelism), the expert parameters that data parallelism must
leave alone, and the process groups the training step needs.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from meshscope.theory.schedules import SCHEDULES, stages_of_rank

from .context_parallel import parallelize_cp, shard_sequence
from .data import dp_shard
from .faults import install_module_faults
from .layout import Layout, stage_layers
from .model import ModelConfig, build_model
from .moe import shard_experts

if TYPE_CHECKING:
    from .options import WorkerConfig

# ``parallelize_tp`` (DTensor), ``split_model`` (torch.distributed.pipelining, which imports
# torch._dynamo) and ``parallelize_dp`` (FSDP for fsdp/zero2) are imported where
# ``build_rank_model`` applies their dimension: each of those torch packages costs
# about a second of import per rank, which a run without that dimension does not pay.


@dataclasses.dataclass
class RankModel:
    modules: dict[int, torch.nn.Module]      # global stage index → module, in chunk order
    n_stages: int
    expert_params: list[torch.nn.Parameter]
    mesh: object
    coords: dict[str, int]
    groups: list[dict]                       # this rank's process groups, for run.json
    ep_replica_group: object | None

    @property
    def has_first(self) -> bool:
        return 0 in self.modules

    @property
    def has_last(self) -> bool:
        return self.n_stages - 1 in self.modules

    def parameters(self):
        for m in self.modules.values():
            yield from m.parameters()


def _new_groups(all_groups: list[list[int]], rank: int):
    """Create every group (all ranks must), return the one holding ``rank``."""
    mine = None
    for ranks in all_groups:
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g
    return mine


def local_batch(x: torch.Tensor, layout: Layout, coords: dict[str, int]) -> torch.Tensor:
    """This rank's part of a global (batch, seq) tensor: its dp slice of the batch, its cp
    chunks of the sequence."""
    x = dp_shard(x, coords.get("dp", 0), layout.size("dp"))
    if layout.size("cp") > 1:
        x = shard_sequence(x, layout.size("cp"), coords["cp"])
    return x


def build_rank_model(conf: WorkerConfig, layout: Layout, cfg: ModelConfig,
                     device: torch.device, faults) -> RankModel:
    rank = dist.get_rank()
    mesh = init_device_mesh(device.type, tuple(layout.size(d) for d in layout.mesh_dims),
                            mesh_dim_names=layout.mesh_dims)
    coords = layout.coordinates(rank)
    groups = []
    for dim in layout.mesh_dims:
        g = mesh[dim].get_group()
        groups.append({"name": g.group_name, "desc": getattr(g, "group_desc", f"mesh_{dim}"),
                       "dimension": dim, "ranks": dist.get_process_group_ranks(g)})
    cp, tp, ep = layout.size("cp"), layout.size("tp"), layout.size("ep")
    dp_mesh = mesh["dp", "cp"]._flatten("dp_cp") if cp > 1 else mesh["dp"]
    ep_group = replica_group = None
    if ep > 1:
        ep_group = _new_groups(layout.ep_groups(), rank)
        replica_group = _new_groups(layout.ep_replica_groups(), rank)
        for dim, g in (("ep", ep_group), ("ep_replica", replica_group)):
            groups.append({"name": g.group_name, "desc": dim, "dimension": dim,
                           "ranks": dist.get_process_group_ranks(g)})

    pp = layout.size("pp")
    spec = SCHEDULES[conf.schedule]
    v = conf.virtual_stages if pp > 1 else 1
    n_stages = pp * v
    stage_ids = stages_of_rank(coords["pp"], pp, v, spec.placement) if pp > 1 else [0]
    layers = stage_layers(cfg.n_layers, n_stages, conf.stage_layers)
    modules, experts = {}, []
    for sid in stage_ids:
        m = build_model(cfg, conf.seed)
        if n_stages > 1:
            from .pipeline import split_model
            split_model(m, layers[sid], first=sid == 0, last=sid == n_stages - 1)
        m.to(device)
        mine = shard_experts(m, ep_group) if ep_group is not None else []
        experts += mine
        if tp > 1:
            from .tensor_parallel import parallelize_tp
            parallelize_tp(m, mesh["tp"], sp=conf.sp)
        if cp > 1:
            parallelize_cp(m, mesh["cp"].get_group(), coords["cp"], cp)
        install_module_faults(faults, rank, m, chunk=stage_ids.index(sid),
                              n_chunks=len(stage_ids))
        if dp_mesh.size() > 1:
            from .data_parallel import parallelize_dp
            m = parallelize_dp(m, mode=conf.dp_mode, mesh=dp_mesh, device=device,
                               ignored=mine)
        modules[sid] = m
    return RankModel(modules=modules, n_stages=n_stages, expert_params=experts, mesh=mesh,
                     coords=coords, groups=groups, ep_replica_group=replica_group)
