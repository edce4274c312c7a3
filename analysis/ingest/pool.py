"""Work on many ranks' traces at once, in worker processes.

``map_files(files, fn, job)`` yields ``(file, fn(file, *job))`` — or ``(file, problem)``, the
one-line message of an ``InputError`` that ``fn`` raised — in the order of ``files``, whatever
order the workers finish in. ``fn`` must be a module-level function (it is sent to the workers
by name) and should return something small: the analysis sends each worker a trace and gets
back that rank's small tables (``analysis/report/rank_work.py``), never its event table.
``load_traces(files)`` is the same with ``fn`` = ``ingest.load_trace``: each file's
``RankTrace`` (used by tests and benchmarks that want the events themselves). With two or more
files the work
runs in a ``ProcessPoolExecutor`` of ``min(files, os.cpu_count())`` processes (parsing JSON is
CPU-bound Python: threads would share one core) through ``map_on``, the seam every executor
of the per-rank work goes through (this pool, or a Dask client's executor:
``analysis/report/engines.py``): at most two files per worker are in flight, so memory is
bounded by per-rank work, not by the rank count. One file is read in this process, with
every core given to it: its events read in parts by worker processes (``parts.on_cores``,
``analysis/ingest/parts.py``) and, once its steps are known, the rank's tables that need
nothing else of its timeline made in a forked copy of this process beside the rest
(``Beside``, ``analysis/report/rank_work.py``). A worker
that dies (killed for memory, say) does not end the run: the files it left are read here, one
by one; so are all the files when the pool cannot start its manager thread (an address-space
cap with no room for the thread's stack).

Workers are forked when this process runs a single thread (quick, and safe then); otherwise
they come from a fork server that has imported ingest once.
"""
from __future__ import annotations

import collections
import os
import pathlib
import pickle
import re
import sys
import threading
from concurrent.futures import BrokenExecutor, CancelledError, Executor, ProcessPoolExecutor
from typing import Iterator

from meshscope.analysis.ingest import budgets
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import parts
from meshscope.analysis.ingest import rank_naming
from meshscope.analysis.ingest import start_method
from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest.progress import Progress


def _call(fn, path: pathlib.Path, job: tuple, env: dict | None = None):
    """``fn(path, *job)``, or the problem; ``env``: the reading budgets of the process that
    submitted it (``budgets.ENV``), set here first (a fork server's workers would otherwise
    keep those of the moment it started)."""
    budgets.set_environment(env or {})
    try:
        return fn(path, *job)
    except InputError as e:
        return str(e)


def _load(path: pathlib.Path, comm_kernel_re, rank_regex, cache_dir) -> ingest.RankTrace:
    return ingest.load_trace(path, comm_kernel_re=comm_kernel_re, rank_regex=rank_regex,
                             cache_dir=cache_dir)


IN_FLIGHT_PER_WORKER = 2       # files submitted and not yet yielded, per worker (map_on)


def worker_count(n_files: int, workers: int | None = None) -> int:
    limit = (os.cpu_count() or 1) if workers is None else workers
    return max(1, min(n_files, limit))


def _serial(files, fn, job, bar):
    """Run ``fn`` on ``files`` one after another in this process, advancing ``bar``."""
    for f in files:
        result = _call(fn, f, job)
        bar.advance()
        yield f, result


def load_traces(files: list[pathlib.Path], *, comm_kernel_re: re.Pattern | None = None,
                rank_regex: re.Pattern | str | None = None,
                cache_dir: pathlib.Path | None = None, workers: int | None = None,
                progress: bool = False) -> Iterator[tuple[pathlib.Path, ingest.RankTrace | str]]:
    """Each file's ``RankTrace`` or problem, in the order of ``files``. ``progress``: show a
    bar on stderr when it is a terminal and the work takes over a second."""
    job = (comm_kernel_re, rank_naming.compile_rank_regex(rank_regex), cache_dir)
    yield from map_files(files, _load, job, workers=workers, progress=progress)


def map_files(files: list[pathlib.Path], fn, job: tuple, *, workers: int | None = None,
              progress: bool = False, label: str = "ingest") -> Iterator[tuple[pathlib.Path, object]]:
    """``(file, fn(file, *job))`` for each file, in order (module docstring): this machine's
    ``ProcessPoolExecutor`` through ``map_on``, or this process for one worker."""
    files = [pathlib.Path(f) for f in files]
    n_workers = worker_count(len(files), workers)
    if n_workers < 2:
        # One trace (or one worker): read here; a large trace's events on every core the
        # user gave (``parts.py``), the rest of its work in this process.
        cores = (os.cpu_count() or 1) if workers is None else workers
        with parts.on_cores(cores if len(files) == 1 else 1), \
                Progress(len(files), label, enabled=progress) as bar:
            yield from _serial(files, fn, job, bar)
        return
    pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=start_method.context(),
                               initializer=start_method.die_with_parent)
    abandoned = []

    def abandon():
        # The pool forks its workers at the first submit and then starts a manager thread;
        # under an address-space cap (RLIMIT_AS) there may be no room for that thread's stack
        # ("can't start new thread"). The pool can then neither work nor shut down (joining a
        # thread never started raises) and its forked workers would wait on their queue for
        # ever, holding the process open: end them (map_on reads every file here instead).
        _abandon(pool)
        abandoned.append(pool)

    try:
        with Progress(len(files), f"{label} ({n_workers} processes)", enabled=progress) as bar:
            yield from map_on(pool, files, fn, job, in_flight=IN_FLIGHT_PER_WORKER * n_workers,
                              bar=bar, on_broken=abandon)
    finally:
        if not abandoned:
            pool.shutdown(wait=True)


def map_on(executor: Executor, files: list[pathlib.Path], fn, job: tuple, *, in_flight: int,
           bar: Progress, lost: tuple[type[BaseException], ...] = (),
           on_broken=None) -> Iterator[tuple[pathlib.Path, object]]:
    """``(file, fn(file, *job))`` for each file, in order, run on ``executor`` — any
    ``concurrent.futures.Executor``: this machine's process pool (``map_files``) or a Dask
    client's (``distributed.Client.get_executor()``, ``analysis/report/engines.py``). The one
    seam of the per-rank stage; whichever executor it is:

    - **bounded work in flight**: at most ``in_flight`` files are submitted and not yet
      yielded (the next is submitted as one is yielded), so the results waiting here, and
      the executor's queue, stay bounded whatever the number of ranks;
    - **a lost worker's task is run again**: a future that fails because its worker went away
      — the pool broken (``BrokenExecutor``: a worker killed, for memory say) or an exception
      of ``lost`` (Dask's ``KilledWorker``, raised once the scheduler's own retries on other
      workers are spent) — is run again here, in this process; once the executor takes no
      more work (broken, or it cannot start: ``RuntimeError`` at submit, after which
      ``on_broken`` is called) every file not yet submitted is read here too. An
      ``InputError`` is the file's one-line problem, never a lost worker.

    Each task carries this process' reading budgets (``budgets.ENV``), set in its worker
    before it reads (``_call``); ``bar`` advances once per file."""
    env = budgets.environment()
    queue = collections.deque(pathlib.Path(f) for f in files)
    running: collections.deque = collections.deque()
    takes_work = True
    while queue or running:
        while takes_work and queue and len(running) < in_flight:
            try:
                future = executor.submit(_call, fn, queue[0], job, env)
            except (RuntimeError, BrokenExecutor):
                takes_work = False
                if on_broken is not None and not running:
                    on_broken()
                break
            running.append((queue.popleft(), future))
        if not running:
            break
        f, future = running.popleft()
        try:
            result = future.result()
        except BrokenExecutor:                  # the pool lost a worker: it is broken
            takes_work = False
            result = _call(fn, f, job)          # the task lost with its worker, run here
        except (CancelledError, *lost):         # this task alone was lost
            result = _call(fn, f, job)
        bar.advance()
        yield f, result
    yield from _serial(list(queue), fn, job, bar)


def _abandon(pool: ProcessPoolExecutor) -> None:
    """End the worker processes of a pool whose manager thread never started (``map_files``).
    ``ProcessPoolExecutor`` offers no public way to do that without the thread, so this reads
    its process table."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        p.kill()
    for p in procs:
        p.join(timeout=10)


class Beside:
    """``fn(*args)`` run in a forked copy of this process, beside what this process does next;
    ``result()`` waits for it. The copy shares this process' memory until either writes to it
    (a rank's event table is read, never copied), and only the result comes back, pickled
    through a pipe.

    Used for one large trace, whose own work would otherwise leave the other cores idle
    (``analysis/report/rank_work.py``), where a fork is safe: the system forks, and this
    process runs at most one thread besides its own (a progress bar's, ``progress.py``). The
    copy runs nothing of that thread's: its stdout and stderr are new files on the null device
    (a lock the thread held at the fork, on the terminal's stream, is never taken), and it
    leaves by ``os._exit`` once the result is written, with no flush and no exit handlers.
    Where it cannot start, or its process is lost (killed for memory, say) or fails,
    ``result()`` runs ``fn(*args)`` here instead — the same value, or the same exception."""

    def __init__(self, fn, *args):
        self._call = (fn, args)
        self._pid = self._read = None
        if not hasattr(os, "fork") or threading.active_count() > 2:
            return
        try:
            read, write = os.pipe()
        except OSError:
            return
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return
        if pid == 0:                                        # the copy
            code = 1
            try:
                start_method.die_with_parent()
                os.close(read)
                sys.stdout = sys.stderr = open(os.devnull, "w")
                data = pickle.dumps(fn(*args), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write, "wb") as out:
                    out.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self._pid, self._read = pid, read

    def result(self):
        if self._pid is not None:
            chunks = []
            try:
                with os.fdopen(self._read, "rb") as f:
                    while chunk := f.read(1 << 20):
                        chunks.append(chunk)
            finally:
                _, status = os.waitpid(self._pid, 0)
                self._pid = None
            if os.waitstatus_to_exitcode(status) == 0:
                return pickle.loads(b"".join(chunks))       # written by the copy, above
        fn, args = self._call
        return fn(*args)
