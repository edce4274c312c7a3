"""Launch a profiled training run: validate, describe it in run.json, start the ranks.

Everything that can be checked before launch is checked first (``options.check``, which the
command also runs before it imports torch) so that a bad layout costs one line and exit code 2,
not a crash in eight processes. The ranks are then started through torchrun's own machinery
(``torch.distributed.run``), gloo on CPU and NCCL on CUDA, forked from a server that has
already imported torch (``rank_start``); a failing rank ends the whole job, and
``LaunchError`` names the rank and its error.

What the ranks print (library warnings, Kineto's ``profiler_start/stop`` lines, NCCL's chatter)
goes to ``RUN/logs/rank{R}.stdout.log`` and ``rank{R}.stderr.log`` (``RunLogs``), torchrun's
own lines to ``RUN/logs/launcher.log`` (``launcher-node<N>.log`` per node of a multi-node
run); the terminal shows what meshscope prints, and on failure
one line with the failing rank's error (before it, the last lines of its stderr log when the
rank died without an error message, e.g. killed by a signal).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import platform
import re
import shutil
import signal
import sys
import uuid

import torch
from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

from meshscope.collectors import flight_recorder
from meshscope.collectors import run_dir
from meshscope.collectors.run_dir import RUN_JSON, write_json_atomic
from meshscope.collectors.run_info import (DeviceInfo, FaultInfo, ModelInfo, ProcessGroup,
                                           RunInfo)

from .layout import Layout, LayoutError, stage_layers
from .model import ModelConfig
from .options import LOGS, RunOptions, WorkerConfig, check
from .rank_start import forked_rank, rank_start_method, start_server
from meshscope.vocabulary import PARALLEL_DIMS


FAILED_LOG_TAIL_LINES = 20  # how much of a failed rank's stderr log the launcher shows


class LaunchError(RuntimeError):
    """The job started but a rank failed; the message names the rank and its error."""


def run_description(opts: RunOptions, run_id: str) -> RunInfo:
    """The launcher's part of run.json (process-group names are added from the ranks,
    ``_with_rank_meta``); ``to_dict()`` is what the file holds."""
    from meshscope.collectors.devices import lookup

    layout, cfg = opts.layout, opts.model
    pp, v = layout.size("pp"), opts.virtual
    cuda = torch.cuda.is_available()
    groups = [ProcessGroup(d, tuple(g)) for d in layout.mesh_dims for g in layout.groups(d)]
    if layout.size("ep") > 1:
        groups += [ProcessGroup("ep", tuple(g)) for g in layout.ep_groups()]
        groups += [ProcessGroup("ep_replica", tuple(g)) for g in layout.ep_replica_groups()]
    # Device type, name, backend, and its peak FLOP/s and memory bandwidth: from the command
    # line when given, else from ``collectors.devices`` by name, else null (unknown).
    name = torch.cuda.get_device_name(0) if cuda else (platform.processor()
                                                         or platform.machine())
    known = lookup(name) or (None, None)
    device = DeviceInfo(type="cuda" if cuda else "cpu", name=name,
                        backend="nccl" if cuda else "gloo",
                        peak_flops=opts.peak_flops or known[0],
                        memory_bandwidth_bytes_per_s=opts.peak_bandwidth or known[1],
                        peak_source="command line" if opts.peak_flops or opts.peak_bandwidth
                        else ("collectors/devices.py" if known[0] else None))
    layers = stage_layers(cfg.n_layers, pp * v, opts.stage_layers)
    return RunInfo(
        path=pathlib.Path(opts.out) / RUN_JSON, run_id=run_id, status="running",
        layout={d: layout.size(d) for d in PARALLEL_DIMS},
        layout_str=str(layout), world_size=layout.world_size,
        mesh_dims=tuple(layout.mesh_dims),
        mesh_shape=tuple(layout.size(d) for d in layout.mesh_dims),
        coordinates={r: layout.coordinates(r) for r in range(layout.world_size)},
        process_groups=tuple(groups), schedule=opts.schedule if pp > 1 else None,
        microbatches=opts.microbatches, virtual_stages=v,
        stage_layers=None if layers is None else tuple(tuple(s) for s in layers),
        steps=opts.steps, profile_steps=tuple(opts.profile_steps), dp_mode=opts.dp_mode,
        sequence_parallel=opts.sp if layout.size("tp") > 1 else None,
        global_batch=opts.global_batch,
        model=ModelInfo(preset=opts.model_preset, **dataclasses.asdict(cfg),
                        n_params=cfg.n_params(), flops_per_token=cfg.flops_per_token()),
        device=device, faults=tuple(FaultInfo(**f.as_dict()) for f in opts.faults),
        kind=None, start_time=run_dir.now(), nnodes=opts.nnodes, seed=opts.seed, lr=opts.lr,
        versions=run_dir.versions(), command=tuple(opts.command))


def _with_rank_meta(run: pathlib.Path, info: RunInfo) -> RunInfo:
    """``info`` with the process-group names the workers wrote to ``.meta/rank*.json``."""
    meta_dir = run / ".meta"
    by_ranks = {}
    for f in sorted(meta_dir.glob("rank*.json")):
        for g in json.loads(f.read_text())["groups"]:
            by_ranks[(g["dimension"], tuple(g["ranks"]))] = g
    groups = []
    for g in info.process_groups:
        seen = by_ranks.get((g.dimension, tuple(g.ranks)))
        groups.append(dataclasses.replace(g, name=seen["name"], desc=seen["desc"])
                      if seen else g)
    return dataclasses.replace(info, process_groups=tuple(groups))


class RunLogs(LogsSpecs):
    """Where torchrun puts each rank's output: ``LOG_DIR/rank{R}.stdout.log`` and
    ``rank{R}.stderr.log`` (both streams redirected, nothing on the terminal), and the error
    file that ``@record`` writes when the rank raises, ``rank{R}.error.json`` — the launcher
    reads the error of every rank that raised from it (``_rank_failures``), so an earlier
    job's error file in the same folder is removed before the ranks start. Files are named by
    global rank, so the launchers of several hosts can share one run directory. torchrun's own
    ``DefaultLogsSpecs`` nests them as ``LOG_DIR/<run id>_<random>/attempt_0/<local rank>/``."""

    def __init__(self, log_dir: pathlib.Path):
        super().__init__(log_dir=str(log_dir), redirects=Std.ALL, tee=Std.NONE)
        self.ranks: list[int] = []  # the global ranks this launcher started (``reify``)

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        os.makedirs(self._root_log_dir, exist_ok=True)
        dest = LogsDest()
        for local_rank, env in envs.items():
            base = os.path.join(self._root_log_dir, f"rank{env['RANK']}")
            dest.stdouts[local_rank] = base + ".stdout.log"
            dest.stderrs[local_rank] = base + ".stderr.log"
            dest.error_files[local_rank] = env["TORCHELASTIC_ERROR_FILE"] = base + ".error.json"
            with contextlib.suppress(FileNotFoundError):
                os.remove(dest.error_files[local_rank])
            self.ranks.append(int(env["RANK"]))
        return dest


def _remove_partial_writes(ranks: list[int], folders: list[pathlib.Path]) -> None:
    """Remove the temporary files of writes that ``ranks`` (all ended) left unfinished: a rank
    the launcher stopped while it wrote its error file, Flight Recorder dump or step timer
    leaves ``rank{R}.<name><random>.tmp`` (``write_json_atomic``) or ``rank{R}.parquet.tmp``
    beside the file it never replaced. The readers never take them (they read ``rank*.json``
    and ``rank*.parquet``); a user listing the folder would."""
    for folder in folders:
        for rank in ranks:
            for tmp in folder.glob(f"rank{rank}.*.tmp"):
                tmp.unlink(missing_ok=True)


def _log_tail(path: pathlib.Path, lines: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


# What a rank raises when a peer went away: a victim's error, not a cause.
_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "remote process exited")


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """One rank's failure as the launcher learns it: ``exit_code`` is None for a rank that
    torch did not report but whose error file says it raised (``_rank_failures``);
    ``error_file`` is None when the rank wrote none (killed by a signal, a crash in C++)."""
    rank: int
    exit_code: int | None
    message: str
    timestamp_s: int
    error_file: pathlib.Path | None
    root_error: str | None = None   # the first exception of a chain it raised (its line)

    @property
    def peer_lost(self) -> bool:
        return any(p in self.message for p in _PEER_LOST)

    @property
    def stopped(self) -> bool:
        """Ended by a SIGTERM (the launcher's stop once another rank failed: exit code 143,
        or −15 where the signal's default action ran) without an error of its own."""
        return self.error_file is None and self.exit_code in (128 + signal.SIGTERM,
                                                              -signal.SIGTERM)


def _from_torch(rank: int, pf, exit_code: int | None) -> RankFailure:
    """A ``ProcessFailure`` (torch's reading of a rank's error file) as a RankFailure."""
    msg = pf.message
    extra = msg.get("extraInfo") if isinstance(msg, dict) else None
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
    return RankFailure(rank, exit_code,
                       str(msg.get("message", "") if isinstance(msg, dict) else msg),
                       int(pf.timestamp),
                       pathlib.Path(pf.error_file) if os.path.isfile(pf.error_file) else None,
                       root_error(callstack) if isinstance(callstack, str) else None)


ERROR_LINE_CHARS = 400     # an error's text in the launcher's one line, at most
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*: \S.*")


def root_error(callstack: str) -> str | None:
    """The first exception of a chain in a Python traceback (``callstack``), one line: the
    error a wrapper re-raised under its own message (torch's pipelining raises "[Stage 0]
    failed to run forward" from the error that happened) — None when nothing was chained."""
    if not any(words in callstack for words in _CHAINED):
        return None
    for line in callstack.splitlines():
        if _EXCEPTION_LINE.fullmatch(line):
            return _one_line(line)
    return None


def _one_line(text: str) -> str:
    """``text`` on one line (its whitespace runs as one space), cut at ERROR_LINE_CHARS."""
    flat = " ".join(text.split())
    return flat if len(flat) <= ERROR_LINE_CHARS else flat[:ERROR_LINE_CHARS - 1] + "…"


def _rank_failures(err, log_dir: pathlib.Path) -> list[RankFailure]:
    """Every failed rank the launcher can learn of: those torch reported, and each rank whose
    error file is in ``log_dir`` although torch did not report it. With forked ranks torch
    reports one failure only — the first process it sees gone, often the peer that lost its
    connection while the rank that raised was still leaving (and was then stopped). Torch
    reads those files too (``ProcessFailure``; pid and exit code it never saw are not used);
    one it cannot read is skipped, torch's line on why going to the launcher's log."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    found = {rank: _from_torch(rank, pf, pf.exitcode) for rank, pf in err.failures.items()}
    for path in log_dir.glob("rank*.error.json"):
        m = re.fullmatch(r"rank(\d+)\.error\.json", path.name)
        if m and int(m.group(1)) not in found:
            rank = int(m.group(1))
            try:
                pf = ProcessFailure(local_rank=rank, pid=0, exitcode=0, error_file=str(path))
            except (ValueError, KeyError, TypeError):
                continue
            found[rank] = _from_torch(rank, pf, None)
    return list(found.values())


def _cause(failures: list[RankFailure]) -> RankFailure:
    """The failure that caused the others: the first of the ranks whose own error is not the
    loss of a peer, nor the launcher's stop, else the first. Error files record the second
    only, so a rank that raised and the peer it left behind often fail "at once"; by time
    alone the victim could be named (torch's ``get_first_failure`` takes whichever it lists
    first) — and a rank the launcher stopped, which torch dates when it sees it gone, in the
    same second as the raise, would win on its lower rank."""
    return min(failures, key=lambda f: (f.peer_lost, f.stopped, f.timestamp_s, f.rank))


def _failure_message(err, log_dir: pathlib.Path) -> str:
    """The rank whose failure caused the others (``_cause``) and its error on one line — with
    the first error of the chain when it re-raised another (``root_error``); the other failed
    ranks after. A rank that died without writing its error (killed by a signal, a crash in
    C++) gets the last lines of its stderr log printed to the terminal first."""
    failures = _rank_failures(err, log_dir)
    cause = _cause(failures)
    stderr_log = log_dir / f"rank{cause.rank}.stderr.log"
    if cause.error_file is None:
        tail = _log_tail(stderr_log, FAILED_LOG_TAIL_LINES)
        if tail:
            print(f"--- the last lines of rank {cause.rank}'s output ({stderr_log}) ---",
                  *tail, "---", sep="\n", file=sys.stderr)
    exit_code = "" if cause.exit_code is None else f" (exit code {cause.exit_code})"
    said = _one_line(cause.message) or "no error message"
    if cause.root_error and cause.root_error not in said:
        said += f" — raised from {cause.root_error}"
    text = f"rank {cause.rank} failed{exit_code}: {said} (its output: {stderr_log})"
    others = sorted(f.rank for f in failures if f.rank != cause.rank)
    if others:
        text += f"; ranks {', '.join(map(str, others))} were stopped"
    return text


def launch(opts: RunOptions) -> RunInfo:
    """Run the job; returns the run as its final run.json holds it. Raises LayoutError before launch and
    LaunchError if a rank fails."""
    if opts.profile_steps is None:
        from meshscope.collectors.profile_steps import default_profile_steps
        opts.profile_steps = default_profile_steps(opts.steps)
    check(opts)
    run = pathlib.Path(opts.out).resolve()
    run.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    info = run_description(opts, run_id)
    if opts.node_rank == 0:
        write_json_atomic(run / RUN_JSON, info.to_dict())
    config_path = run / ".meta" / f"config-node{opts.node_rank}.json"
    WorkerConfig.of(opts, run, run_id).write(config_path)

    os.environ["TORCH_FR_BUFFER_SIZE"] = os.environ.get(
        "TORCH_FR_BUFFER_SIZE", str(flight_recorder.DEFAULT_BUFFER_SIZE)) \
        if opts.always_on else "0"
    try:
        run_ranks("meshscope.parallel.worker", config_path, log_dir=run / LOGS,
                  nproc=opts.layout.world_size // opts.nnodes, nnodes=opts.nnodes,
                  node_rank=opts.node_rank, rdzv_endpoint=opts.rdzv_endpoint,
                  rdzv_id=f"meshscope-{opts.layout}",
                  written=(run / run_dir.COMMS, run / run_dir.STEPS))
    except LaunchError as e:
        _finish(run, dataclasses.replace(info, status="failed", end_time=run_dir.now(),
                                         error=str(e)), opts)
        raise
    return _finish(run, dataclasses.replace(info, status="completed", end_time=run_dir.now()),
                   opts)


def run_ranks(module: str, config_path: pathlib.Path, *, log_dir: pathlib.Path, nproc: int,
              nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
              rdzv_id: str = "meshscope", written: tuple[pathlib.Path, ...] = ()) -> None:
    """``python -m MODULE CONFIG`` on ``nproc`` local ranks through torchrun's machinery, their
    output in ``log_dir`` (``RunLogs``); LaunchError naming the rank that caused the failure.
    Once the ranks have ended, their unfinished writes are removed from ``log_dir`` and the
    ``written`` folders (``_remove_partial_writes``)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if nnodes == 1:
        # What torchrun's --standalone means: a private c10d store on a free local port.
        where = ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
                 f"--rdzv-id={uuid.uuid4()}"]
    else:
        # Every node's launcher meets at node 0's endpoint (torchrun's c10d rendezvous).
        where = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}-{rdzv_endpoint}",
                 # Node 0 serves the rendezvous store; the others connect to it (needed when
                 # several launchers share one host, e.g. 127.0.0.1 in a test).
                 f"--rdzv-conf=is_host={1 if node_rank == 0 else 0}"]
    args = get_args_parser().parse_args([
        *where, f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.1",
        "-m", module, str(config_path)])
    # torchrun's own run(args), with the log destinations replaced by RunLogs.
    config, entrypoint, entry_args = config_from_args(args)
    config.logs_specs = logs = RunLogs(log_dir)
    if rank_start_method() == "forkserver":  # parallel/rank_start.py
        start_server([module])  # already running when the command started it early
        config.start_method = "forkserver"
        entrypoint, entry_args = forked_rank, [module, str(config_path), dict(os.environ)]
    name = "launcher.log" if nnodes == 1 else f"launcher-node{node_rank}.log"
    with _launcher_log(log_dir / name):
        try:
            elastic_launch(config=config, entrypoint=entrypoint)(*entry_args)
        except ChildFailedError as e:
            raise LaunchError(_failure_message(e, log_dir)) from None
        finally:
            _remove_partial_writes(logs.ranks, [log_dir, *written])


@contextlib.contextmanager
def _launcher_log(path: pathlib.Path):
    """The launcher's own torchrun lines (rendezvous, "Sending process … closing signal
    SIGTERM", "failed (exitcode: 1)", and with forked ranks torch.multiprocessing's
    "Terminating process … via signal SIGTERM") go to ``path`` instead of the terminal, where
    ``LaunchError`` says what failed in one line."""
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic",
                                                    "torch.multiprocessing")]
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = [(logger.propagate, logger.level) for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger, (propagate, level) in zip(loggers, saved):
            logger.removeHandler(handler)
            logger.propagate, logger.level = propagate, level
        handler.close()


def _finish(run: pathlib.Path, info: RunInfo, opts: RunOptions) -> RunInfo:
    """Node 0 completes run.json with the ranks' group names and removes the scratch files;
    returns the run as written (``info`` on the other nodes)."""
    if opts.node_rank == 0:
        info = _with_rank_meta(run, info)
        write_json_atomic(run / RUN_JSON, info.to_dict())
        shutil.rmtree(run / ".meta", ignore_errors=True)
    return info


def bench_comm(layout: Layout, out: pathlib.Path, *, ops: list[str], sizes: list[int],
               iters: int = 20, warmup: int = 5, profile: bool = False) -> pathlib.Path:
    """Run the ``parallel.bench_comm`` sweep on ``layout``'s ranks; returns the baseline path.
    With ``profile``, ``out`` is also a run directory (run.json, traces/)."""
    from .bench_comm import OPS

    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise LayoutError(f"unknown op {unknown[0]!r} (known: {', '.join(OPS)})")
    world = layout.world_size
    for s in sizes:
        if s < 4 * world or s % (4 * world):
            raise LayoutError(f"size {s} B must be a positive multiple of 4 × {world} ranks "
                              f"(float32 elements split evenly over any group)")
    out = pathlib.Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise LayoutError(f"output directory {out} exists and is not empty (choose a new one)")
    out.mkdir(parents=True, exist_ok=True)
    if profile:
        opts = RunOptions(layout=layout, model=ModelConfig(), out=out, steps=1,
                          profile_steps=(0, 0))
        info = dataclasses.replace(run_description(opts, uuid.uuid4().hex[:12]),
                                   kind="bench-comm", schedule=None,
                                   steps=len(ops) * len(sizes))
        write_json_atomic(out / RUN_JSON, info.to_dict())
    config = {"run_dir": str(out), "layout": layout.sizes, "ops": ops, "sizes": sizes,
              "iters": iters, "warmup": warmup, "profile": profile}
    config_path = out / ".meta" / "bench-config.json"
    write_json_atomic(config_path, config)
    try:
        run_ranks("meshscope.parallel.bench_comm", config_path, log_dir=out / LOGS, nproc=world,
                  rdzv_id="meshscope-bench")
    finally:
        shutil.rmtree(out / ".meta", ignore_errors=True)
    if profile:
        info = dataclasses.replace(info, status="completed", end_time=run_dir.now())
        write_json_atomic(out / RUN_JSON, info.to_dict())
    return out / "baseline.parquet"
