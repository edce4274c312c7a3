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


def leave_now(code: int = 0) -> None:
    """Flush this process's stdout, stderr and logging handlers, then end it with ``code``
    (no ``atexit`` handlers, no module teardown)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
