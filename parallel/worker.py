"""The per-rank training program that ``parallel.launch`` starts under torchrun.

``python -m parallel.worker CONFIG.json`` — reads the run configuration the launcher wrote
(``options.WorkerConfig``),
builds this rank's share of the model (``parallel.build``), trains, and records what
``collectors`` defines: the Kineto trace of the profiled steps, the step timers, and this
rank's process-group table.
"""
from __future__ import annotations

import datetime
import os
import pathlib
import signal
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record
from torch.profiler import record_function

from meshscope.collectors import annotations, flight_recorder, memory_census, rendezvous
from meshscope.collectors import memory_snapshot
from meshscope.collectors.profiling import at_step_start, make_profiler
from meshscope.collectors.run_dir import steps_path, write_json_atomic
from meshscope.collectors.step_timer import StepTimer

from .build import RankModel, build_rank_model, local_batch
from .data import global_batch
from .data_parallel import no_sync, sync_expert_grads
from .faults import before_step, in_batch_fetch
from .model import lm_loss
from .options import WorkerConfig
from .process_exit import before_leaving, leave_now


def _device() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def _step_without_pp(rm: RankModel, x, y, microbatches: int) -> float:
    """Gradient accumulation over microbatches; data parallelism syncs on the last backward.
    Gradients are summed, then divided by the microbatch count (as the pipeline schedules do),
    so that the update is the mean over the whole batch."""
    (model,) = rm.modules.values()
    total = 0.0
    for i, (xm, ym) in enumerate(zip(x.chunk(microbatches), y.chunk(microbatches))):
        with no_sync(model, sync=i == microbatches - 1):
            with record_function(annotations.microbatch("forward", 0, 0, i)):
                loss = lm_loss(model(xm), ym)
            with record_function(annotations.microbatch("backward", 0, 0, i)):
                loss.backward()
        total += loss.item()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(microbatches)
    return total / microbatches


def _step_with_pp(rm: RankModel, schedule, x, y) -> float | None:
    from .pipeline import dp_sync_left_to_stages  # imported already when pp > 1

    losses: list = []
    with dp_sync_left_to_stages(rm.modules.values()):
        if rm.has_first and rm.has_last:
            schedule.step(x, target=y, losses=losses)
        elif rm.has_first:
            schedule.step(x)
        elif rm.has_last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
    return torch.stack([loss.detach() for loss in losses]).mean().item() if rm.has_last else None


def _record_on_sigterm(on_term) -> None:
    """When torchrun stops this rank (SIGTERM, after another rank failed), run ``on_term`` and
    exit. A Python signal handler would only run once the main thread returns from the C++
    call it is blocked in — a collective waiting for the failed rank may not return before the
    launcher's SIGKILL — so a dedicated thread waits for it: SIGTERM's handler is Python's C
    handler, which writes the signal's number to a pipe (``signal.set_wakeup_fd``) in
    whichever thread the signal reaches, and the thread reads that pipe. The signal is blocked
    in the threads started from here on (gloo's, the profiler's), so it reaches the waiting
    thread or a thread that was there before (torch's OpenMP pool when ``OMP_NUM_THREADS`` is
    unset): its default action, ending the process at once — in the middle of a dump —, is
    never taken. Called from the main thread (``signal.signal`` must be)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # noted by the pipe, not here
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        while signal.SIGTERM not in os.read(read_end, 64):
            pass
        try:
            on_term()
        finally:    # after a dump the main thread may have begun meanwhile (before_leaving)
            leave_now(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="meshscope-sigterm", daemon=True).start()


class _AtomicErrorFile(ErrorHandler):
    """torchrun's error handler, with the error file written whole or not at all. The stock
    handler truncates the file and then writes it; when the launcher stops this rank
    (SIGTERM, after another rank failed) while its main thread is writing the error of its own
    failed collective, the SIGTERM thread's exit leaves the file empty, and the launcher's
    reading of it raised ``JSONDecodeError`` instead of naming the rank that failed first.
    The content is torch's own format (``ProcessFailure`` reads it)."""

    def record_exception(self, e: BaseException) -> None:
        path = self._get_error_file_path()
        if path:
            write_json_atomic(pathlib.Path(path), {"message": {
                "message": f"{type(e).__name__}: {e}",
                "extraInfo": {"py_callstack": traceback.format_exc(),
                              "timestamp": str(int(time.time()))}}})


def _main(config_path: str) -> None:
    conf = WorkerConfig.read(pathlib.Path(config_path))
    run_dir, layout, cfg, faults = conf.run_dir, conf.layout, conf.model, list(conf.faults)
    before_leaving(flight_recorder.hold_dumps)  # never end a rank in the middle of a dump
    on_term: list = []  # what to save if the launcher stops this rank, filled in below
    _record_on_sigterm(lambda: [f() for f in on_term])
    device, backend = _device()
    if conf.nccl_debug and backend == "nccl":
        from meshscope.collectors.nccl_debug import nccl_debug_env
        os.environ.update(nccl_debug_env(run_dir, rank=int(os.environ["RANK"])))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=conf.timeout_s))
    rank = dist.get_rank()
    rm = build_rank_model(conf, layout, cfg, device, faults)
    write_json_atomic(run_dir / ".meta" / f"rank{rank}.json",
                      {"rank": rank, "coordinates": rm.coords, "groups": rm.groups,
                       "device": str(device), "backend": backend})
    opt = torch.optim.AdamW(list(rm.parameters()), lr=conf.lr)
    pp = layout.size("pp")
    schedule = None
    if pp > 1:
        from .pipeline import build_schedule  # torch.distributed.pipelining: only when pp > 1
        schedule = build_schedule(rm.modules, num_stages=rm.n_stages, device=device,
                                  group=rm.mesh["pp"].get_group(), schedule=conf.schedule,
                                  microbatches=conf.microbatches, loss_fn=lm_loss)
    dp_cp = layout.size("dp") * layout.size("cp")
    dp_group = rm.mesh["dp"].get_group() if layout.size("dp") > 1 else None  # dp-all-reduce
    # With the always-on collectors off (only to measure their cost) the timers write once at
    # the end and the Flight Recorder keeps nothing.
    timer = StepTimer(steps_path(run_dir, rank), rank, cuda=device.type == "cuda",
                      flush_every=10 if conf.always_on else 10**9)
    on_term.append(timer.flush)
    if conf.always_on:
        on_term.append(lambda: flight_recorder.dump(
            run_dir, rank, "terminated", "stopped by the launcher (SIGTERM) after another "
                                         "rank failed"))
    # With several launchers (--nnodes) each drew its own run id; run.json holds node 0's.
    node0 = conf.node_rank == 0 and int(os.environ.get("LOCAL_RANK", "0")) == 0
    meta = {"layout": str(layout), "rank": rank, "coordinates": rm.coords,
            "run_id": rendezvous.shared_value("run_id", conf.run_id, publisher=node0)}
    prof = make_profiler(run_dir, rank, conf.profile_steps, device, meta,
                         profile_memory=conf.profile_memory)
    local_tokens = conf.global_batch // layout.size("dp") * cfg.seq_len // layout.size("cp")
    try:
        with prof:
            for step in range(conf.steps):
                at_step_start(prof, step, conf.profile_steps)
                if conf.memory_snapshot:
                    memory_snapshot.at_step_start(step, conf.profile_steps, device)
                # The step's time includes fetching its batch, as a training loop's step time
                # does: a data-loader stall (--inject loader-sleep) is time the step took.
                timer.start()
                x, y = global_batch(conf.seed, step, conf.global_batch, cfg.seq_len,
                                    cfg.vocab_size)
                in_batch_fetch(faults, rank)
                x, y = (local_batch(t, layout, rm.coords).to(device) for t in (x, y))
                before_step(faults, rank, step, device, timeout_s=conf.timeout_s,
                            dp_group=dp_group)
                opt.zero_grad(set_to_none=True)
                with timer.phase("fwd_bwd"), record_function(annotations.PIPELINE):
                    if schedule is None:
                        loss = _step_without_pp(rm, x, y, conf.microbatches)
                    else:
                        loss = _step_with_pp(rm, schedule, x, y)
                    if rm.expert_params:
                        sync_expert_grads(rm.expert_params, rm.ep_replica_group, dp_cp)
                with timer.phase("optimizer"), record_function(annotations.OPTIMIZER):
                    opt.step()
                timer.stop(step, tokens=local_tokens, loss=loss)
                if step == conf.profile_steps[0]:       # still recording: into the trace
                    memory_census.record(prof, memory_census.census(
                        list(rm.parameters()), opt, step, device,
                        timer.last_peak_memory_bytes if device.type == "cuda" else None))
                if conf.memory_snapshot:
                    memory_snapshot.at_step_end(run_dir, rank, step, conf.profile_steps, device)
                prof.step()
    except BaseException as e:
        if conf.always_on:
            flight_recorder.dump(run_dir, rank, "exception", f"{type(e).__name__}: {e}")
        raise
    finally:
        timer.flush()
    if conf.always_on:
        flight_recorder.dump(run_dir, rank, "end")
    dist.destroy_process_group()


main = record(_main, error_handler=_AtomicErrorFile())


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except BaseException:  # noqa: BLE001 - recorded by main's error handler; the exit says so
        traceback.print_exc()  # as an uncaught error would, then leave as a forked rank does
        leave_now(1)           # (rank_start.forked_rank): not before a dump under way ends
    leave_now(0)  # everything written; skip torch's teardown (parallel/process_exit.py)
