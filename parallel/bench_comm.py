"""``meshscope bench-comm``: an nccl-tests-style sweep of collectives over a layout's groups.

For every mesh dimension of the layout with size > 1 (dp, tp, pp, cp; in a one-dimensional
layout its group is the whole world), every op and every size S, the ranks run ``warmup``
untimed iterations and then ``iters`` timed ones back to back, and the time of one is the total
divided by ``iters`` — the slowest rank's, as all ranks wait for it (nccl-tests does the same).
S is what nccl-tests' ``size`` column means: the buffer for all_reduce and broadcast, the whole
gathered output for all_gather, the whole input for reduce_scatter, each rank's send buffer
for all_to_all, the message for send/recv (a ring: every rank sends to the next and receives
from the previous). float32 throughout.

Rank 0 writes ``RUN/baseline.parquet`` (and ``.csv``): op, dim, n_ranks (the group's size),
size_bytes, count, dtype, time_us, algbw_gbps, busbw_gbps (``theory/bus_factors.py``) — the
columns of ``analysis/comm/nccl_tests.py``'s tables, so either can be the baseline of a
bandwidth report. With ``--profile`` each rank also writes its Kineto trace (one profiler step
per (dim, op, size) block, each block inside a ``meshscope/comm dim=D`` range) and run.json,
so ``meshscope analyze`` reports the same sweep from the traces.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.profiler import record_function

from meshscope.collectors import annotations
from meshscope.theory.bus_factors import algbw_gbps, busbw_gbps

from .layout import Layout

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def _make(op: str, size: int, n: int, device) -> tuple:
    count = size // 4
    full = torch.ones(count, device=device)
    if op == "all_gather":
        return torch.ones(count // n, device=device), torch.empty(count, device=device)
    if op == "reduce_scatter":
        return full, torch.empty(count // n, device=device)
    if op in ("all_to_all", "send_recv"):
        return full, torch.empty(count, device=device)
    return full, None


def _run(op: str, a, b, group, ring: tuple[int, int]):
    if op == "all_reduce":
        dist.all_reduce(a, group=group)
    elif op == "all_gather":
        dist.all_gather_into_tensor(b, a, group=group)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(b, a, group=group)
    elif op == "all_to_all":
        dist.all_to_all_single(b, a, group=group)
    elif op == "broadcast":
        dist.broadcast(a, src=dist.get_global_rank(group, 0), group=group)
    else:
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, a, ring[0], group),
                                         dist.P2POp(dist.irecv, b, ring[1], group)]):
            w.wait()


def _groups(layout: Layout, mesh) -> list[tuple[str, object]]:
    dims = [d for d in layout.mesh_dims if layout.size(d) > 1]
    return [(d, mesh[d].get_group()) for d in dims]


def main(config_path: str) -> None:
    conf = json.loads(pathlib.Path(config_path).read_text())
    run_dir = pathlib.Path(conf["run_dir"])
    layout = Layout(conf["layout"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else \
        torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh(device.type, tuple(layout.size(d) for d in layout.mesh_dims),
                            mesh_dim_names=layout.mesh_dims)
    blocks = [(d, g, op, s) for d, g in _groups(layout, mesh) for op in conf["ops"]
              for s in conf["sizes"]]
    prof = None
    if conf["profile"]:
        from meshscope.collectors.profiling import make_profiler

        # One profiler step per block, every one recorded.
        prof = make_profiler(run_dir, rank, (0, len(blocks) - 1), device, {})
        prof.start()
    rows = []
    for dim, group, op, size in blocks:
        n = dist.get_world_size(group)
        me = dist.get_rank(group)
        ring = (dist.get_global_rank(group, (me + 1) % n),
                dist.get_global_rank(group, (me - 1) % n))
        a, b = _make(op, size, n, device)
        with record_function(annotations.comm_scope(dim)):
            for _ in range(conf["warmup"]):
                _run(op, a, b, group, ring)
        dist.barrier(group=group)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with record_function(annotations.comm_scope(dim)):
            for _ in range(conf["iters"]):
                _run(op, a, b, group, ring)
            if cuda:
                torch.cuda.synchronize()
        local = torch.tensor([(time.perf_counter() - t0) / conf["iters"] * 1e6])
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
        t_us = float(local)
        rows.append({"op": op, "dim": dim, "n_ranks": n, "size_bytes": size,
                     "count": size // 4, "dtype": "float32", "time_us": t_us,
                     "algbw_gbps": algbw_gbps(size, t_us),
                     "busbw_gbps": busbw_gbps(op, size, t_us, n)})
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    if rank == 0:
        import pandas as pd
        table = pd.DataFrame(rows)
        table.to_parquet(run_dir / "baseline.parquet", index=False)
        table.to_csv(run_dir / "baseline.csv", index=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    from meshscope.parallel.process_exit import leave_now

    leave_now(0)  # everything written; skip torch's teardown (parallel/process_exit.py)
