"""What a run is asked to do (``RunOptions``) and every check made of it before launch
(``check``). No torch here: ``meshscope run`` refuses a layout that cannot work in the time
of its own start, before anything imports torch or starts a process."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import sys

from .config import ModelConfig
from .faults import Fault
from .layout import Layout, LayoutError, validate, virtual_stages
from .rank_start import rank_start_method

LOGS = "logs"  # RUN/logs/: each rank's stdout and stderr (launch.RunLogs)
DP_MODES = ("ddp", "fsdp", "zero2")  # --dp-mode (parallel/data_parallel.py)
# Schedules whose backward torch 2.13 splits into input and weight gradients; the weight
# gradients are computed with ``torch.autograd.grad`` and added to ``.grad`` by hand
# (``pipelining._backward.stage_backward_weight``), so DDP's gradient hooks never fire for
# them: pytorch/pytorch#144530 (open).
SPLIT_BACKWARD_SCHEDULES = ("zero-bubble", "zbv", "dualpipev")


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
    memory_snapshot: bool = False  # CUDA: a memory snapshot per rank into memory/rank{R}.pickle
    profile_memory: bool = True    # the profiler records the allocator's [memory] events
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
    _check_ddp_under_split_backward(opts)
    for f in opts.faults:
        if not 0 <= f.rank < world:
            raise LayoutError(f"--inject {f.kind}={f.rank}:{f.value}: rank {f.rank} is not in "
                              f"0..{world - 1}")
        if f.kind == "dp-all-reduce" and opts.layout.size("dp") < 2:
            raise LayoutError(f"--inject {f.kind}={f.rank}:{f.value}: layout {opts.layout} has "
                              "no data parallelism (dp=1): no dp group to all-reduce on")
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


def _check_ddp_under_split_backward(opts: RunOptions) -> None:
    """DDP (``--dp-mode ddp`` without tensor parallelism, which makes it ``replicate``) or
    FSDP under a split-backward schedule would train to wrong losses silently: every stage but
    the first computes its weight gradients outside autograd's accumulation, DDP never
    reduces them, and each data-parallel replica updates those stages with its own gradients
    (checked: dp=2,pp=2 with zero-bubble, zbv and dualpipev, 1e-3 to 4e-3 from one process's
    losses by the third step). FSDP, which reshards after forward, trains apart too (dp=2,
    pp=2 zero-bubble, 2 microbatches: step 1's loss 5.7162 against 1F1B's 5.7018, which is
    one process's; why was not traced); ``zero2``, which keeps the gathered parameters until
    the step's end, matched 1F1B to the digit and is accepted."""
    layout = opts.layout
    if (opts.dp_mode in ("ddp", "fsdp") and opts.schedule in SPLIT_BACKWARD_SCHEDULES
            and layout.size("pp") > 1 and layout.size("dp") * layout.size("cp") > 1
            and layout.size("tp") == 1):
        raise LayoutError(
            f"--schedule {opts.schedule} with --dp-mode {opts.dp_mode} (layout {layout}) is "
            f"not supported: torch 2.13 computes a split backward's weight gradients without "
            f"autograd's gradient hooks, so {opts.dp_mode.upper()} does not average them over "
            f"the data-parallel replicas (pytorch/pytorch#144530) and the replicas would train "
            f"apart; use --dp-mode zero2, or --schedule "
            f"gpipe, 1f1b, interleaved-1f1b or looped-bfs with data parallelism")


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """What every rank of a run is told (``parallel/worker.py``): the launcher writes it once
    per node as ``RUN/.meta/config-node<N>.json`` (``write``) and each rank reads it back
    (``read``) — typed on both sides, so the worker asks ``config.steps`` where it indexed a
    dict by string.

    ``run_dir``: the run directory (absolute); ``run_id``: this launcher's run id (node 0's is
    shared through the rendezvous); ``node_rank``: the launcher's node; ``layout``: the mesh;
    ``model``: the model's shape; ``schedule``, ``virtual_stages`` (1 without pipeline
    parallelism; the chunks per rank with it), ``stage_layers`` (None: the even split) and
    ``microbatches``: the pipeline; ``steps``, ``seed``, ``global_batch`` (sequences per
    step over the whole job), ``lr``: the training; ``dp_mode``, ``sp``: how data and tensor
    parallelism run; ``faults``: what to inject; ``timeout_s``: the process groups' timeout;
    ``profile_steps``: the first and last profiled step (inclusive); ``always_on``: the step
    timers flush every 10 steps and the Flight Recorder dumps (off only to measure them);
    ``nccl_debug``: ``NCCL_DEBUG=INFO`` per rank into ``comms/`` (CUDA only);
    ``memory_snapshot``: the allocator's history recorded over the profiled steps and dumped
    per rank into ``memory/rank{R}.pickle`` (CUDA only; ``collectors/memory_snapshot.py``);
    ``profile_memory``: the profiler records the allocator's ``[memory]`` events."""
    run_dir: pathlib.Path
    run_id: str
    node_rank: int
    layout: Layout
    model: ModelConfig
    schedule: str
    virtual_stages: int
    stage_layers: list[int] | None
    microbatches: int
    steps: int
    seed: int
    global_batch: int
    lr: float
    dp_mode: str
    sp: bool
    faults: tuple[Fault, ...]
    timeout_s: int
    profile_steps: tuple[int, int]
    always_on: bool
    nccl_debug: bool
    memory_snapshot: bool = False
    profile_memory: bool = True

    @classmethod
    def of(cls, opts: RunOptions, run_dir: pathlib.Path, run_id: str) -> WorkerConfig:
        """The ranks' share of ``opts`` (its ``profile_steps`` already chosen)."""
        return cls(run_dir=pathlib.Path(run_dir), run_id=run_id, node_rank=opts.node_rank,
                   layout=opts.layout, model=opts.model, schedule=opts.schedule,
                   virtual_stages=opts.virtual, stage_layers=opts.stage_layers,
                   microbatches=opts.microbatches, steps=opts.steps, seed=opts.seed,
                   global_batch=opts.global_batch, lr=opts.lr, dp_mode=opts.dp_mode,
                   sp=opts.sp, faults=tuple(opts.faults), timeout_s=opts.timeout_s,
                   profile_steps=tuple(opts.profile_steps), always_on=opts.always_on,
                   nccl_debug=opts.nccl_debug, memory_snapshot=opts.memory_snapshot,
                   profile_memory=opts.profile_memory)

    def to_dict(self) -> dict:
        """The JSON form (``read`` takes it back): plain values, the layout as its sizes."""
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "run_dir": str(self.run_dir), "layout": dict(self.layout.sizes),
                "model": dataclasses.asdict(self.model),
                "faults": [f.as_dict() for f in self.faults],
                "profile_steps": list(self.profile_steps)}

    @classmethod
    def from_dict(cls, d: dict) -> WorkerConfig:
        """``to_dict``'s value back; a key missing or unknown is a TypeError naming it."""
        return cls(**{**d, "run_dir": pathlib.Path(d["run_dir"]), "layout": Layout(d["layout"]),
                      "model": ModelConfig(**d["model"]),
                      "faults": tuple(Fault(**f) for f in d["faults"]),
                      "profile_steps": tuple(d["profile_steps"])})

    def write(self, path: pathlib.Path) -> None:
        from meshscope.collectors.run_dir import write_json_atomic

        write_json_atomic(path, self.to_dict())

    @classmethod
    def read(cls, path: pathlib.Path) -> WorkerConfig:
        return cls.from_dict(json.loads(pathlib.Path(path).read_text()))
