"""How this process starts worker processes (``multiprocessing``'s start method).

A fork is quickest — the worker has every import and table of the parent at once — but is
safe only while the parent runs one thread (a fork copies a lock another thread holds, held
for ever). With other threads running (a progress bar's timer, the dashboard's server), the
workers come from a fork server that has imported the per-rank analysis once; where neither
exists (macOS without fork, Windows), they are spawned. Used by the per-file pool
(``pool.py``) and by the reader of one large trace in parts (``parts.py``).
"""
from __future__ import annotations

import multiprocessing as mp
import threading

# What a fork server imports before it forks its first worker: the per-rank analysis and
# all that it reads with.
FORKSERVER_PRELOAD = ["meshscope.analysis.report.rank_work"]


def context() -> mp.context.BaseContext:
    """The start method's context for a new pool of worker processes (module docstring)."""
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        return ctx
    return mp.get_context("spawn")
