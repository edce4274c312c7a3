"""What a run is asked to do (``RunOptions``) and every check made of it before launch
(``check``). No torch here: ``meshscope run`` refuses a layout that cannot work in the time
of its own start, before anything imports torch or starts a process."""
from __future__ import annotations

import dataclasses
import pathlib
import re
import sys

from .config import ModelConfig
from .faults import Fault
from .layout import Layout, LayoutError, validate, virtual_stages
from .rank_start import rank_start_method

LOGS = "logs"  # RUN/logs/: each rank's stdout and stderr (launch.RunLogs)
DP_MODES = ("ddp", "fsdp", "zero2")  # --dp-mode (parallel/data_parallel.py)


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
    virtual_stages: int | None = None
    stage_layers: list[int] | None = None
    dp_mode: str = "ddp"
    sp: bool = True
    faults: list[Fault] = dataclasses.field(default_factory=list)
    timeout_s: int = 300
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    nproc_per_node: int | None = None
    always_on: bool = True   # step-timer flushes and Flight Recorder; off only to measure them
    nccl_debug: bool = False  # NCCL_DEBUG=INFO per rank into comms/nccl-rank{R}.log (CUDA)
    peak_flops: float | None = None          # per device, overrides collectors.devices
    peak_bandwidth: float | None = None      # bytes/s per device, likewise
    command: list[str] = dataclasses.field(default_factory=lambda: list(sys.argv))

    @property
    def virtual(self) -> int:
        return virtual_stages(self.schedule, self.virtual_stages) \
            if self.layout.size("pp") > 1 else 1


def check(opts: RunOptions) -> None:
    """Every pre-launch check; raises LayoutError."""
    rank_start_method()  # MESHSCOPE_RANK_START, if set, must name a way to start the ranks
    validate(opts.layout, opts.model, schedule=opts.schedule, microbatches=opts.microbatches,
             global_batch=opts.global_batch, virtual=opts.virtual_stages,
             layers_per_stage=opts.stage_layers)
    world = opts.layout.world_size
    if opts.dp_mode not in DP_MODES:
        raise LayoutError(f"unknown --dp-mode {opts.dp_mode!r} (known: {', '.join(DP_MODES)})")
    if opts.layout.size("ep") > 1 and opts.dp_mode != "ddp":
        raise LayoutError(f"expert parallelism runs with --dp-mode ddp only, not {opts.dp_mode}")
    for f in opts.faults:
        if not 0 <= f.rank < world:
            raise LayoutError(f"--inject {f.kind}={f.rank}:{f.value}: rank {f.rank} is not in "
                              f"0..{world - 1}")
    if opts.nnodes < 1 or world % opts.nnodes:
        raise LayoutError(f"--nnodes {opts.nnodes} must divide the world size {world}")
    if opts.nproc_per_node is not None and opts.nproc_per_node * opts.nnodes != world:
        raise LayoutError(f"layout {opts.layout} needs {world} ranks, but --nproc-per-node "
                          f"{opts.nproc_per_node} × --nnodes {opts.nnodes} = "
                          f"{opts.nproc_per_node * opts.nnodes} were requested")
    if opts.nnodes > 1 and not opts.rdzv_endpoint:
        raise LayoutError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0's address)")
    if not 0 <= opts.node_rank < opts.nnodes:
        raise LayoutError(f"--node-rank {opts.node_rank} is not in 0..{opts.nnodes - 1}")
    if opts.steps < 1:
        raise LayoutError("--steps must be at least 1")
    if opts.profile_steps is not None and opts.profile_steps[1] >= opts.steps:
        raise LayoutError(f"--profile-steps {opts.profile_steps[0]}-{opts.profile_steps[1]} "
                          f"goes past the last step {opts.steps - 1}")
    out = pathlib.Path(opts.out)
    # Other nodes' launchers may already have written their scratch files (.meta/) and begun
    # their own launcher logs (logs/launcher-node<N>.log; their ranks' logs come only after the
    # rendezvous, which waits for this node).
    def others(p: pathlib.Path) -> bool:
        return p.name == ".meta" or p.name == LOGS and p.is_dir() and all(
            re.fullmatch(r"launcher-node[1-9]\d*\.log", q.name) for q in p.iterdir())

    if opts.node_rank == 0 and out.exists() and not all(others(p) for p in out.iterdir()):
        raise LayoutError(f"output directory {out} exists and is not empty (choose a new one)")
