"""Issue 46, case 5: a worker process dies with the process it works for, whatever kills that
process. ``start_method.die_with_parent`` — each pool's initializer and the first thing a
forked copy does — asks Linux for SIGKILL when the worker's parent exits. Here a parent starts
two workers busy in a long task, as the per-rank pool's are during ingest, and is killed with
SIGKILL: with the initializer both workers are gone at once; without it (the control) they are
still alive, re-parented, once their parent is dead."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import ROOT

PARENT = """
import sys, time
from concurrent.futures import ProcessPoolExecutor
from meshscope.analysis.ingest import start_method

def busy(_):
    time.sleep(60)

init = start_method.die_with_parent if sys.argv[1] == "yes" else None
pool = ProcessPoolExecutor(max_workers=2, mp_context=start_method.context(), initializer=init)
futures = [pool.submit(busy, i) for i in range(2)]
time.sleep(1.0)
print(" ".join(str(p) for p in pool._processes), flush=True)
time.sleep(60)
"""


def _workers_after_parent_killed(initializer: str) -> tuple[int, int]:
    """(workers started, workers alive 2 s after their parent got SIGKILL)."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT, initializer], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 2.0
        alive = pids
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in pids if psutil.pid_exists(p)
                     and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        return len(pids), len(alive)
    finally:
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] and PARENT.strip()[:20] in " ".join(p.info["cmdline"]):
                p.kill()
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_their_killed_parent():
    started, alive = _workers_after_parent_killed("yes")
    assert (started, alive) == (2, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_without_the_death_signal_the_busy_workers_outlive_their_parent():
    started, alive = _workers_after_parent_killed("no")    # (killed by the helper after)
    assert (started, alive) == (2, 2)
