"""Where the per-rank stage runs: a ``concurrent.futures.Executor`` — this machine's worker
processes, or the workers of a Dask cluster through ``distributed.Client.get_executor()``.

The analysis is split for this (``analysis/report/analyze.py``): every trace is reduced by
``rank_work.rank_work`` to its rank's small tables where the trace is read, and only those
travel to the cross-rank stage. ``map_ranks(files, fn, job, engine=...)`` yields
``(file, result or problem)`` in the order of ``files`` whichever engine runs them, and both go
through the one seam, ``analysis/ingest/pool.map_on(executor, …)``, so both hold the same two
guarantees: **bounded work in flight** (at most ``IN_FLIGHT_PER_WORKER`` files per worker
submitted and not yet taken, whatever the number of ranks) and **a lost worker's task run
again** (a Dask worker that dies mid-task: the scheduler reruns its task on another worker, up
to its ``allowed-failures``, and after that ``map_on`` runs it here; a local pool whose worker
died is broken, and its files are read here):

- ``local`` — a ``ProcessPoolExecutor`` of this machine's processes (``analysis/ingest/pool.py``);
- ``dask`` — the executor of a Dask client: the cluster at ``scheduler`` (``tcp://host:8786``: a
  ``dask scheduler`` you started, ``dask-jobqueue`` on SLURM, a Dask Kubernetes operator), or,
  without one, a ``LocalCluster`` of ``workers`` single-threaded worker processes here. The
  workers must see the trace files at the same paths (a shared filesystem) and have meshscope
  installed; each reads its traces itself, so hundreds of GB of traces never pass through the
  machine that runs ``meshscope analyze``. Results come back per rank, small (timeline interval
  sets, the operations the trace shows) — the same objects the local engine returns, so the
  report is the same number for number (``tests/test_engines.py``). Its bound is
  ``IN_FLIGHT_PER_WORKER`` × the cluster's worker threads at the start.

On either engine each rank's result is written to disk as it arrives (``spill.py``) and read
back when the cross-rank stage asks for it, so the analysing process holds the results in
flight, not every rank's.

The reading budgets (``--max-trace-bytes``, ``--max-events``, … ``analysis/ingest/budgets.py``)
hold on either engine. The command sets them as environment variables of its own process
(``budgets.ENV``); a Dask worker is another process, started before the command ran and
perhaps on another machine, so each task carries the submitting process' values of every
``budgets.ENV`` variable and sets them in its worker before it reads its trace (the local
pool does the same for its fork server's workers). A rank past a budget comes back as its
one-line problem, as with the local engine, and the other ranks go on. Whatever else the
per-rank work needs travels inside ``job``, pickled to the workers with it.
"""
from __future__ import annotations

import contextlib
import pathlib
from typing import Iterator

from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest import pool
from meshscope.analysis.ingest.pool import IN_FLIGHT_PER_WORKER

ENGINES = ("local", "dask")


def map_ranks(files: list[pathlib.Path], fn, job: tuple, *, engine: str = "local",
              scheduler: str | None = None, workers: int | None = None,
              progress: bool = False) -> Iterator[tuple[pathlib.Path, object]]:
    """``(file, fn(file, *job))`` per file, in order (module docstring)."""
    if engine == "local":
        yield from pool.map_files(files, fn, job, workers=workers, progress=progress)
        return
    if engine != "dask":
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    from meshscope.analysis.ingest.progress import Progress

    with dask_executor(scheduler, workers) as (executor, threads, lost):
        with Progress(len(files), f"per-rank work (Dask, {threads} worker threads)",
                      enabled=progress) as bar:
            yield from pool.map_on(executor, [pathlib.Path(f) for f in files], fn, job,
                                   in_flight=IN_FLIGHT_PER_WORKER * threads, bar=bar,
                                   lost=lost)


@contextlib.contextmanager
def dask_executor(scheduler: str | None, workers: int | None):
    """``(executor, worker threads, lost)``: a ``concurrent.futures.Executor`` of a Dask client
    on the cluster at ``scheduler`` (a ``LocalCluster`` of ``workers`` single-threaded
    processes without one), the cluster's worker threads, and the exceptions that mean a task
    was lost with its worker (``KilledWorker``). The client, and a cluster started here, are
    closed on leaving."""
    try:
        from dask.distributed import Client, KilledWorker, LocalCluster
    except ImportError:
        raise InputError("--engine dask", "needs dask and distributed installed "
                                          "(pip install 'meshscope[dask]')") from None
    cluster = None
    try:
        if scheduler:
            client = Client(scheduler, timeout="30s")
        else:
            cluster = LocalCluster(n_workers=workers or 2, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=50)
            client = Client(cluster)
    except OSError as e:
        raise InputError(scheduler or "LocalCluster", f"cannot reach the Dask scheduler ({e})") \
            from None
    try:
        threads = max(1, sum(client.nthreads().values()))
        yield client.get_executor(pure=False), threads, (KilledWorker,)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
