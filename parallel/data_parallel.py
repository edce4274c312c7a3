"""Data parallelism: replicas that average their gradients, or shard their state (ZeRO).

``parallelize_dp`` applies one of three modes to a plain module (or a pipeline stage) over the
data-parallel mesh (the ``dp`` dimension, flattened with ``cp`` when context parallelism is on,
since context-parallel ranks also hold replicas of the weights):

- ``ddp`` — DistributedDataParallel: gradients are packed into buckets and each bucket's
  all-reduce starts as soon as its gradients are ready, overlapping the rest of the backward
  (Li et al., 2020, "PyTorch Distributed"). Modules with DTensor (tensor-parallel) weights use
  ``replicate``, the FSDP2-based DDP that understands DTensor.
- ``fsdp`` — FSDP2 ``fully_shard`` as ZeRO-3 (Rajbhandari et al., 2020): parameters, gradients
  and optimizer state sharded; each block's parameters all-gathered before its forward and
  again before its backward (re-sharded after forward), gradients reduce-scattered.
- ``zero2`` — the same without re-sharding after forward: parameters stay gathered from forward
  to backward (one all-gather per block per step instead of two), as in ZeRO-2's memory/traffic
  trade-off.

Parameters listed as ``ignored`` (the experts of an expert-parallel MoE, which differ between
ranks) are left out; ``sync_expert_grads`` reduces them over the ranks that hold the same
experts.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# FSDP2 (``fully_shard``) and DTensor are imported where a mode needs them: with DTensor they
# cost about 1.5 s per process. The modes themselves: ``options.DP_MODES``.


def parallelize_dp(module: torch.nn.Module, *, mode: str, mesh, device: torch.device,
                   ignored: list[torch.nn.Parameter] = ()) -> torch.nn.Module:
    """Wrap ``module`` for data parallelism over the 1-D ``mesh``; returns the module to use."""
    ignored_set = set(ignored)
    if mode == "ddp":
        # A parameter can be a DTensor only once tensor parallelism has imported the package.
        dtensor = sys.modules.get("torch.distributed.tensor")
        if dtensor and any(isinstance(p, dtensor.DTensor) for p in module.parameters()):
            from torch.distributed._composable.replicate_with_fsdp import replicate
            return replicate(module, mesh=mesh, ignored_params=ignored_set or None)
        if ignored_set:
            names = [n for n, p in module.named_parameters() if p in ignored_set]
            DDP._set_params_and_buffers_to_ignore_for_model(module, names)
        # The model's only buffers are the constant RoPE tables: nothing to broadcast per step.
        # (They still join the one broadcast of the parameters at construction, which
        # forward_sync_buffers=False keeps, unlike the deprecated broadcast_buffers=False;
        # every rank computes the same tables, so that broadcast changes nothing.)
        return DDP(module, process_group=mesh.get_group(), forward_sync_buffers=False,
                   device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    reshard = mode == "fsdp"
    for block in module.layers.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard,
                    ignored_params=ignored_set or None)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard,
                ignored_params=ignored_set or None)
    return module


def no_sync(module: torch.nn.Module, sync: bool):
    """Context in which a backward accumulates gradients without reducing them (when
    ``sync`` is False), for gradient accumulation over microbatches."""
    import contextlib

    if sync:
        return contextlib.nullcontext()
    if isinstance(module, DDP):
        return module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):
        @contextlib.contextmanager
        def _ctx():
            module.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                module.set_requires_gradient_sync(True)
        return _ctx()
    return contextlib.nullcontext()


def sync_expert_grads(params: list[torch.nn.Parameter], replica_group, dp_size: int) -> None:
    """Expert gradients: each owner already holds the sum over its expert-parallel group's
    tokens; sum over the groups holding the same experts and divide by the number of
    data-parallel replicas, matching the mean the dense parameters get."""
    for p in params:
        if p.grad is None:
            continue
        if replica_group is not None and dist.get_world_size(replica_group) > 1:
            dist.all_reduce(p.grad, group=replica_group)
        p.grad.div_(dp_size)
