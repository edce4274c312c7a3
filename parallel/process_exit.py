"""Leaving a process that imported torch without waiting for the interpreter's teardown.

After its last line, a Python process that imported torch (and ``torch.distributed.pipelining``,
which brings ``torch._dynamo``) spends 1.5–2 s finalising modules before it exits, measured on
the project's 2-core machine — longer than a small run's training. Every rank pays it, and
the launcher waits for all of them; the command that started the launcher pays it again. Once
a process has closed everything it writes (the collectors write each file whole, through a
rename, before the rank returns), nothing is left for the teardown to do, so such a process
flushes what it printed and logged and ends with ``os._exit``.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

# What must finish before this process ends (``before_leaving``), e.g. a Flight Recorder dump
# another thread is writing: ``os._exit`` stops every thread where it stands.
_BEFORE_LEAVING: list[Callable[[], None]] = []


def before_leaving(wait: Callable[[], None]) -> None:
    """Have ``leave_now`` call ``wait`` (in the order given) before it ends the process."""
    _BEFORE_LEAVING.append(wait)


def leave_now(code: int = 0) -> None:
    """Wait for what ``before_leaving`` names, flush this process's stdout, stderr and logging
    handlers, then end it with ``code`` (no ``atexit`` handlers, no module teardown)."""
    for wait in _BEFORE_LEAVING:
        try:
            wait()
        except Exception as e:  # noqa: BLE001 - leaving anyway; say why it did not wait
            print(f"meshscope: leaving without waiting for {wait.__name__}: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
