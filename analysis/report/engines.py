"""Where the per-rank stage runs: this machine's worker processes, or the workers of a Dask
cluster.

The analysis is split for this (``analysis/report/analyze.py``): every trace is reduced by
``rank_work.rank_work`` to its rank's small tables where the trace is read, and only those
travel to the cross-rank stage. ``map_ranks(files, fn, job, engine=...)`` yields
``(file, result or problem)`` in the order of ``files`` whichever engine runs them:

- ``local`` — a pool of this machine's processes (``analysis/ingest/pool.py``);
- ``dask`` — tasks of a Dask cluster: the one at ``scheduler`` (``tcp://host:8786``: a
  ``dask scheduler`` you started, ``dask-jobqueue`` on SLURM, a Dask Kubernetes operator), or,
  without one, a ``LocalCluster`` of ``workers`` single-threaded worker processes here. The
  workers must see the trace files at the same paths (a shared filesystem) and have meshscope
  installed; each reads its traces itself, so hundreds of GB of traces never pass through the
  machine that runs ``meshscope analyze``. Results come back per rank, small (timeline interval
  sets, the operations the trace shows) — the same objects the local engine returns, so the
  report is the same number for number (``tests/test_engines.py``).

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

import pathlib
from typing import Iterator

import os

from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest import budgets, pool

ENGINES = ("local", "dask")


def budget_env() -> dict[str, str | None]:
    """This process' value of every reading-budget variable (None: unset, the default)."""
    return {var: os.environ.get(var) for var in budgets.ENV.values()}


def _call(fn, path, job, env: dict[str, str | None] | None = None):
    """One Dask task: the submitter's budgets (``env``) set in this worker, then
    ``fn(path, *job)``, or the one-line problem of an ``InputError``."""
    for var, value in (env or {}).items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    try:
        return fn(path, *job)
    except InputError as e:
        return str(e)


def map_ranks(files: list[pathlib.Path], fn, job: tuple, *, engine: str = "local",
              scheduler: str | None = None, workers: int | None = None,
              progress: bool = False) -> Iterator[tuple[pathlib.Path, object]]:
    """``(file, fn(file, *job))`` per file, in order (module docstring)."""
    if engine == "local":
        yield from pool.map_files(files, fn, job, workers=workers, progress=progress)
        return
    if engine != "dask":
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    yield from _dask(files, fn, job, scheduler, workers, progress)


def _dask(files, fn, job, scheduler, workers, progress):
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--engine dask", "needs dask and distributed installed "
                                          "(pip install 'meshscope[dask]')") from None
    from meshscope.analysis.ingest.progress import Progress

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
        n = len(files)
        env = budget_env()
        futures = client.map(_call, [fn] * n, list(files), [job] * n, [env] * n, pure=False)
        with Progress(n, f"per-rank work (Dask, {len(client.scheduler_info()['workers'])} "
                         f"workers)", enabled=progress) as bar:
            for f, future in zip(files, futures):
                result = future.result()
                future.release()
                bar.advance()
                yield f, result
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
