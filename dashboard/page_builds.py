"""A page of an enormous report must not hold a server thread for ever: each page is built in
a small pool of its own threads, and the request waits for it at most ``timeout_s``.

Dash answers a page with one callback, run on one of waitress' threads (``--threads``, 4 by
default). Building a page reads the report's tables and makes its figures; for a report of
millions of rows that can take minutes, and a few such requests would leave no thread for
anyone else. So ``PageBuilds.build(key, fn)`` runs ``fn`` in one of ``workers`` builder
threads and waits up to ``timeout_s``:

- done in time: its result, as before;
- not yet: ``Pending`` — the page says it is still being built and polls again (the same
  ``dcc.Interval`` as an analysis in progress); the build goes on, and the next request for
  the same view (``key``) waits on the same build instead of starting another, then gets its
  result. A finished result waits for its request at most ``KEEP_S``; at most ``KEEP``
  finished results are held.

Waitress threads are held at most ``timeout_s`` per request, whatever the report. Builds
themselves are bounded by the pool: at most ``workers`` run at once, the others queue; a
Python thread cannot be stopped from outside, so a build that never ends keeps its builder —
the pool's size is what such builds can take, never the server's request threads.
"""
from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Hashable

KEEP = 16           # finished builds held for their next request
KEEP_S = 300.0      # ... for at most this long


@dataclasses.dataclass(frozen=True)
class Pending:
    """A page still being built after the request's wait."""
    elapsed_s: float


class PageBuilds:
    """The page builders of one app (module docstring)."""

    def __init__(self, timeout_s: float = 20.0, workers: int = 2):
        self.timeout_s = timeout_s
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[[], object]] | None] = \
            queue.SimpleQueue()
        # Daemon threads, not a ThreadPoolExecutor's: the server's process must be able to
        # exit while a build is still running (an executor's threads are joined at exit).
        self._threads = [threading.Thread(target=self._builder, daemon=True,
                                          name=f"meshscope-page-{i}") for i in range(workers)]
        for t in self._threads:
            t.start()
        self._lock = threading.Lock()
        # key -> (future, when it was started); finished ones kept in order of finishing
        self._builds: collections.OrderedDict[Hashable, tuple[Future, float]] = \
            collections.OrderedDict()

    def build(self, key: Hashable, fn: Callable[[], object]):
        """``fn()``'s result when it is done within ``timeout_s`` (or was built by an earlier
        request for ``key``), else ``Pending``; ``fn``'s exception is raised here."""
        with self._lock:
            self._forget_old()
            held = self._builds.get(key)
            if held is None:
                future: Future = Future()
                self._jobs.put((future, fn))
                held = (future, time.monotonic())
                self._builds[key] = held
        future, started = held
        try:
            result = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            return Pending(time.monotonic() - started)
        except BaseException:
            self._drop(key, held)
            raise
        self._drop(key, held)                       # delivered: the next request builds afresh
        return result

    def _drop(self, key: Hashable, held: tuple[Future, float]) -> None:
        with self._lock:
            if self._builds.get(key) is held:
                del self._builds[key]

    def _forget_old(self) -> None:
        """Drop finished builds nobody came back for (older than ``KEEP_S``, past ``KEEP``)."""
        now = time.monotonic()
        done = [k for k, (f, t) in self._builds.items() if f.done()]
        for k in done:
            if now - self._builds[k][1] > KEEP_S:
                del self._builds[k]
        done = [k for k in done if k in self._builds]
        for k in done[:max(0, len(done) - KEEP)]:
            del self._builds[k]

    def _builder(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:      # handed to the request that waits for it
                future.set_exception(e)

    def shutdown(self) -> None:
        """Start no other build (those running end with the process: daemon threads)."""
        for _ in self._threads:
            self._jobs.put(None)
