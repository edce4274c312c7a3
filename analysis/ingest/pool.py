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
CPU-bound Python: threads would share one core); at most two files per worker are in flight,
so memory is bounded by per-rank work, not by the rank count. One file is read in this process.
A worker that dies (killed for memory, say) does not end the run: the files it left are read
here, one by one; so are all the files when the pool cannot start its manager thread (an
address-space cap with no room for the thread's stack).

Workers are forked when this process runs a single thread (quick, and safe then); otherwise
they come from a fork server that has imported ingest once.
"""
from __future__ import annotations

import collections
import multiprocessing as mp
import os
import pathlib
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator

from meshscope.analysis.ingest import budgets
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest.progress import Progress


def _call(fn, path: pathlib.Path, job: tuple, env: dict | None = None):
    """``fn(path, *job)``, or the problem; ``env``: the reading budgets of the process that
    submitted it (``budgets.ENV``), set here first (a fork server's workers would otherwise
    keep those of the moment it started)."""
    for var, value in (env or {}).items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    try:
        return fn(path, *job)
    except InputError as e:
        return str(e)


def _load(path: pathlib.Path, comm_kernel_re, rank_regex, cache_dir) -> ingest.RankTrace:
    return ingest.load_trace(path, comm_kernel_re=comm_kernel_re, rank_regex=rank_regex,
                             cache_dir=cache_dir)


def _context():
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["meshscope.analysis.report.rank_work"])
        return ctx
    return mp.get_context("spawn")


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
    job = (comm_kernel_re, ingest.compile_rank_regex(rank_regex), cache_dir)
    yield from map_files(files, _load, job, workers=workers, progress=progress)


def map_files(files: list[pathlib.Path], fn, job: tuple, *, workers: int | None = None,
              progress: bool = False, label: str = "ingest") -> Iterator[tuple[pathlib.Path, object]]:
    """``(file, fn(file, *job))`` for each file, in order (module docstring)."""
    files = [pathlib.Path(f) for f in files]
    n_workers = worker_count(len(files), workers)
    if n_workers < 2:
        with Progress(len(files), label, enabled=progress) as bar:
            yield from _serial(files, fn, job, bar)
        return
    queue = collections.deque(files)
    env = {var: os.environ.get(var) for var in budgets.ENV.values()}
    pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=_context())
    running = collections.deque()
    try:
        while queue and len(running) < 2 * n_workers:
            f = queue.popleft()
            running.append((f, pool.submit(_call, fn, f, job, env)))
    except RuntimeError:
        # The pool forks its workers at the first submit and then starts a manager thread;
        # under an address-space cap (RLIMIT_AS) there may be no room for that thread's stack
        # ("can't start new thread"). The pool can then neither work nor shut down (joining a
        # thread never started raises) and its forked workers would wait on their queue for
        # ever, holding the process open: end them and read every file here instead.
        _abandon(pool)
        with Progress(len(files), label, enabled=progress) as bar:
            yield from _serial(files, fn, job, bar)
        return
    with pool:
        with Progress(len(files), f"{label} ({n_workers} processes)", enabled=progress) as bar:
            while running:
                f, future = running.popleft()
                try:
                    result = future.result()
                except BrokenProcessPool:
                    break
                bar.advance()
                yield f, result
                if queue:
                    nxt = queue.popleft()
                    running.append((nxt, pool.submit(_call, fn, nxt, job, env)))
            else:
                return
            # A worker died: read what is left here.
            yield from _serial([f] + [g for g, _ in running] + list(queue), fn, job, bar)


def _abandon(pool: ProcessPoolExecutor) -> None:
    """End the worker processes of a pool whose manager thread never started (``map_files``).
    ``ProcessPoolExecutor`` offers no public way to do that without the thread, so this reads
    its process table."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        p.kill()
    for p in procs:
        p.join(timeout=10)
