"""Fault injection, for testing diagnosis tools against a known cause.

``--inject`` takes ``slow-rank=R:MS`` (rank R sleeps MS milliseconds at the start of every
microbatch forward), ``fixed-work=R:MS`` (rank R's stage waits MS milliseconds in every
microbatch's forward and again in its backward — split evenly over its model chunks when it
holds several, as in an interleaved schedule: with a small model, stage work that is a fixed
wait, equal on every stage whatever else the machine runs — how tests whose premise is equal
stage times get it; several for one rank add up to one wait), ``hang=R:STEP`` (at step STEP every rank joins one extra all-reduce on the
world group except rank R, so the others wait until the collective timeout),
``crash=R:STEP`` (rank R raises at the start of step STEP) and ``desync=R:STEP`` (at step STEP
every rank joins one extra ``all_to_all_single`` on the world group, sending 2 rows to every
rank, but rank R expects 3 rows from rank 0 — a program whose ranks disagree on the split
sizes; gloo completes it without an error, with rank R's extra row never written, which is
exactly what only the Flight Recorder can show) and ``leak=R:MB`` (rank R keeps MB more
mebibytes at every step: at the start of each step it allocates a tensor of MB MiB, zeroed,
and keeps it to the end of the run — a leak of a known size, step after step, that the
memory analysis must name and its healthy twin must not). Several may be given.

Two more move one part of a step by a known amount (issue 52: compare's oracle on real runs):

- ``loader-sleep=R:MS`` — rank R's batch fetch sleeps MS milliseconds every step (the host
  waiting for its data loader), inside the range PyTorch's DataLoader records
  (``LOADER_RANGE``) and no operator: within the step's ``ProfilerStep`` window, before any of
  the step's work — on CPU the step breakdown's ``idle``, on a GPU its data-loader idle — and
  within the step timers' step (they start before the fetch, parallel/worker.py).
- ``dp-all-reduce=R:KIB`` — every rank of rank R's data-parallel group joins one extra
  ``all_reduce`` of KIB KiB (float32) on that group at the start of every step, before the
  pipeline starts: communication outside any pipeline window, so the breakdown's exposed ``dp``
  communication grows by its duration (a larger gradient all-reduce, of a size one can state).
  Give it once per dp group (``dp-all-reduce=0:N``, ``dp-all-reduce=2:N`` for dp=2,pp=2); a
  layout without data parallelism refuses it.

Three more make, on CPU, the hang causes a CPU job can have (issue 47), each at step STEP on the
world group, through collectives every rank joins at the start of the step, so that each is a
known answer for the Flight Recorder and for torch's own analyser (``torchfrtrace``):

- ``size-mismatch=R:STEP`` — every rank joins one extra ``all_reduce``, of 4 float32 elements,
  but rank R's holds 8: the ranks disagree on the sizes of one sequence number. gloo does not
  complete it (its transfers wait for bytes the other side never sends; a rank whose side did
  complete goes on and waits in its next collective): ranks time out after the group timeout
  (``--timeout``), and every rank dumps.
- ``order-divergence=R:STEP`` — every rank joins two extra collectives, an ``all_reduce`` and
  then a ``broadcast`` from rank 0 (4 float32 elements each), but rank R issues the
  ``broadcast`` first: a CPU-side code path that diverged, the ranks' ops differing on one
  sequence number. gloo never completes either; every rank times out and dumps.
- ``host-stall=R:STEP`` — every rank joins one extra ``all_reduce`` (as ``hang`` does), but
  rank R's host stops inside the wrapper around it, before it issues it: it waits for a lock
  that another thread holds (``HOST_STALL_FACTOR`` times the group timeout, then gives up). Its
  peers time out waiting in that all_reduce and raise; the launcher then stops rank R, which
  dumps on SIGTERM (parallel/worker.py) — its newest entry is the previous step's, older than
  its peers', and the all_reduce lacks it in every peer's dump. Unlike ``hang`` (rank R skips
  the collective and runs on) the stalled rank issues nothing after it stopped.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported where a fault acts, in the rank: the command parses and checks ``--inject``
# before anything imports torch (parallel/options.py).

KINDS = ("slow-rank", "fixed-work", "hang", "crash", "desync", "leak", "size-mismatch",
         "order-divergence", "host-stall", "loader-sleep", "dp-all-reduce")
# How each is written on the command line (the help of ``--inject`` and its error).
FORMS = ("slow-rank=R:MS, fixed-work=R:MS, hang=R:STEP, crash=R:STEP, desync=R:STEP, "
         "leak=R:MB, size-mismatch=R:STEP, order-divergence=R:STEP, host-stall=R:STEP, "
         "loader-sleep=R:MS or dp-all-reduce=R:KIB")
# host-stall: how many group timeouts the stalled rank waits for its lock before it gives up
# (its peers time out after one; the launcher stops it long before it would).
HOST_STALL_FACTOR = 3


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    value: int  # milliseconds for slow-rank, fixed-work and loader-sleep, MiB for leak, KiB for
    #             dp-all-reduce, a step for the others

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_fault(text: str) -> Fault:
    kind, sep, rest = text.partition("=")
    rank, sep2, value = rest.partition(":")
    if kind not in KINDS or not sep or not sep2:
        raise ValueError(f"--inject {text!r}: expected {FORMS}")
    try:
        fault = Fault(kind, int(rank), int(value))
    except ValueError:
        raise ValueError(f"--inject {text!r}: rank and value must be integers") from None
    if fault.kind == "leak" and fault.value < 1:
        raise ValueError(f"--inject {text!r}: a leak keeps at least 1 MiB a step")
    if fault.kind == "loader-sleep" and fault.value < 1:
        raise ValueError(f"--inject {text!r}: a loader sleep lasts at least 1 ms a step")
    if fault.kind == "dp-all-reduce" and fault.value < 1:
        raise ValueError(f"--inject {text!r}: the extra all-reduce holds at least 1 KiB")
    return fault


class InjectedCrash(RuntimeError):
    pass


def install_module_faults(faults: list[Fault], rank: int, module: torch.nn.Module, *,
                          chunk: int = 0, n_chunks: int = 1) -> None:
    """The faults that act in a module's forward and backward, on chunk ``chunk`` of the
    ``n_chunks`` model chunks (pipeline stages) rank ``rank`` holds: a slow rank sleeps once
    per microbatch, at the start of its first chunk; fixed work is spread evenly over the
    chunks (MS / n_chunks in each), so an interleaved rank does the same fixed work per
    microbatch as a plain one and its chunks are equal, as the closed form of the
    interleaved bubble assumes."""
    for f in faults:
        if f.kind == "slow-rank" and f.rank == rank and chunk == 0:
            delay = f.value / 1000.0
            module.register_forward_pre_hook(lambda *_: time.sleep(delay))
    # Several fixed-work entries of one rank add up to one wait, so that a run adding fixed
    # work to another's sleeps as often as it (each sleep ends a little late on a busy host).
    fixed_ms = sum(f.value for f in faults if f.kind == "fixed-work" and f.rank == rank)
    if fixed_ms:
        _install_fixed_work(module, fixed_ms / 1000.0 / n_chunks)


def _install_fixed_work(module: torch.nn.Module, delay: float) -> None:
    """A wait of ``delay`` seconds before every forward of ``module`` and when the gradient of
    its output arrives (the start of its backward)."""
    import torch

    def wait_in_backward(grad):
        time.sleep(delay)
        return grad

    def after_forward(_module, _inputs, output):
        first = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(wait_in_backward)

    module.register_forward_pre_hook(lambda *_: time.sleep(delay))
    module.register_forward_hook(after_forward)


# The profiler range PyTorch's DataLoader puts around each fetch (``enumerate(DataLoader)#…``):
# an annotation, not work — on a GPU the idle it leaves is the data loader's
# (analysis/gpu/host_activity.py), on CPU the breakdown's idle.
LOADER_RANGE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def in_batch_fetch(faults: list[Fault], rank: int) -> None:
    """Where the worker fetches a step's batch: rank ``rank``'s data loader keeps it waiting
    as injected (``loader-sleep``), a sleep inside ``LOADER_RANGE`` and no operator."""
    ms = sum(f.value for f in faults if f.kind == "loader-sleep" and f.rank == rank)
    if ms:
        from torch.profiler import record_function

        with record_function(LOADER_RANGE):
            time.sleep(ms / 1000.0)


# dp-all-reduce's buffers, by (KiB, device): made once, so that a step's extra work is the
# all-reduce alone (zeroing the buffer anew every step would add compute too).
_DP_BUFFERS: dict = {}


def _dp_buffer(kib: int, device: torch.device) -> torch.Tensor:
    import torch

    key = (kib, str(device))
    if key not in _DP_BUFFERS:
        _DP_BUFFERS[key] = torch.zeros(kib * 256, device=device)   # float32: 256 a KiB
    return _DP_BUFFERS[key]


# What an injected leak keeps: never freed while the rank runs.
_LEAKED: list = []


def before_step(faults: list[Fault], rank: int, step: int, device: torch.device, *,
                timeout_s: float = 300.0, dp_group=None) -> None:
    """Crash, hang, desynchronise, leak, mismatch, diverge, stall or all-reduce more as injected
    for this rank and step; ``timeout_s`` is the process groups' timeout (how long a host stall
    lasts), ``dp_group`` this rank's data-parallel group (``dp-all-reduce``; None without data
    parallelism, where ``options.check`` refuses that fault)."""
    import torch
    import torch.distributed as dist

    dp_ranks = dist.get_process_group_ranks(dp_group) if dp_group is not None else []
    for f in faults:
        if f.kind == "dp-all-reduce" and f.rank in dp_ranks:
            dist.all_reduce(_dp_buffer(f.value, device), group=dp_group)
        if f.kind == "leak" and f.rank == rank:
            _LEAKED.append(torch.zeros(f.value << 20, dtype=torch.uint8, device=device))
        if f.kind == "crash" and f.rank == rank and f.value == step:
            raise InjectedCrash(f"injected crash on rank {rank} at step {step}")
        if f.kind == "hang" and f.value == step and f.rank != rank:
            dist.all_reduce(torch.zeros(1, device=device))  # rank f.rank never joins this one
        if f.kind == "desync" and f.value == step:
            world = dist.get_world_size()
            out_splits = [2] * world
            if rank == f.rank:
                out_splits[0] = 3                           # expects a row rank 0 never sends
            send = torch.zeros(2 * world, 4, device=device)
            recv = torch.zeros(sum(out_splits), 4, device=device)
            dist.all_to_all_single(recv, send, out_splits, [2] * world)
        if f.kind == "size-mismatch" and f.value == step:
            n = 8 if rank == f.rank else 4                  # rank f.rank's is twice the size
            dist.all_reduce(torch.ones(n, device=device))
        if f.kind == "order-divergence" and f.value == step:
            _diverging_pair(rank == f.rank, device)
        if f.kind == "host-stall" and f.value == step:
            _stalled_all_reduce(rank == f.rank, HOST_STALL_FACTOR * timeout_s, device)


def _diverging_pair(reversed_order: bool, device: torch.device) -> None:
    """An all_reduce and a broadcast from rank 0 on the world group, in that order — or, where
    ``reversed_order``, the broadcast first (``order-divergence``). (A broadcast, not an
    all_gather: torch's analyser wants an all_gather's first output to hold the group size
    times its input, which a list all_gather's does not — it would flag every rank.)"""
    import torch
    import torch.distributed as dist

    ops = [lambda: dist.all_reduce(torch.ones(4, device=device)),
           lambda: dist.broadcast(torch.ones(4, device=device), src=0)]
    for op in reversed(ops) if reversed_order else ops:
        op()


def _stalled_all_reduce(stall: bool, seconds: float, device: torch.device) -> None:
    """One all_reduce on the world group through a wrapper that first takes a lock; where
    ``stall``, another thread of this process holds that lock, and the host waits up to
    ``seconds`` for it before it issues the all_reduce (``host-stall``)."""
    import threading

    import torch
    import torch.distributed as dist

    lock = threading.Lock()
    if stall:
        held = threading.Event()

        def holder():
            with lock:
                held.set()
                time.sleep(seconds)

        threading.Thread(target=holder, name="meshscope-host-stall", daemon=True).start()
        held.wait()
    if lock.acquire(timeout=seconds):
        lock.release()
    dist.all_reduce(torch.zeros(1, device=device))
