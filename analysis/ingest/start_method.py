"""How this process starts worker processes (``multiprocessing``'s start method).

A fork is quickest — the worker has every import and table of the parent at once — but is
safe only while the parent runs one thread (a fork copies a lock another thread holds, held
for ever). With other threads running (a progress bar's timer, the dashboard's server), the
workers come from a fork server that has imported the per-rank analysis once; where neither
exists (macOS without fork, Windows), they are spawned. Used by the per-file pool
(``pool.py``) and by the reader of one large trace in parts (``parts.py``).

Every worker dies with the process it was started for, whatever kills that process:
``die_with_parent`` (each pool's initializer, and the first thing a forked copy does) asks
Linux for a death signal (``PR_SET_PDEATHSIG``: SIGKILL when the worker's parent exits), so a
``kill -9`` of ``meshscope analyze`` leaves no worker behind, re-parented and blocked on a pipe
for good. A fork server's workers have the fork server as parent, which itself exits when the
process that started it does.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading

PR_SET_PDEATHSIG = 1          # <linux/prctl.h>

# What a fork server imports before it forks its first worker: the per-rank analysis and
# all that it reads with.
FORKSERVER_PRELOAD = ["meshscope.analysis.report.rank_work"]


def die_with_parent() -> None:
    """Have this worker killed when its parent exits (module docstring); where the system has
    no such request (not Linux), nothing. A worker whose parent is already gone (re-parented
    to init before it could ask) leaves at once."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:
        os._exit(1)


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
