"""Runs not analysed yet are analysed on first open: ``meshscope analyze RUN`` in a child
process, one at a time, while the page shows its progress.

``Analyses.start(entry)`` queues the run (once; opening the page again only asks how far it
is; a failed analysis is tried again when the run is opened ``RETRY_AFTER_S`` later);
``status(run_id)`` returns an ``AnalysisStatus``: ``state`` (``queued``, ``running``,
``done``, ``failed``), seconds elapsed, trace files parsed so far out of the run's total (the
analysis keeps one parquet copy per parsed trace in ``report/.cache``, which is what is
counted) and, for a failure, the analysis' own one-line error with the server's paths taken
out. A child process rather than a thread: the analysis runs its own worker pool, and a crash
there cannot take the server down. Its full output goes to the server log.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import subprocess
import sys
import threading
import time

from meshscope.collectors import run_dir as rd

from .runs import RunEntry

log = logging.getLogger("meshscope.dashboard")
TIMEOUT_S = 3600
RETRY_AFTER_S = 60     # a failed analysis is tried again when the run is opened after this


@dataclasses.dataclass
class AnalysisStatus:
    state: str
    elapsed_s: float = 0.0
    traces_done: int = 0
    traces_total: int = 0
    error: str | None = None

    @property
    def text(self) -> str:
        if self.state == "queued":
            return "Waiting for another analysis to finish…"
        if self.state == "running":
            parsed = (f"{self.traces_done} of {self.traces_total} trace files parsed, "
                      if self.traces_total else "")
            return f"Analysing: {parsed}{self.elapsed_s:.0f} s so far."
        if self.state == "failed":
            return f"The analysis failed: {self.error}"
        return "Analysed."


def _count_traces(entry: RunEntry) -> int:
    from meshscope.analysis.report.inputs import find_traces
    try:
        return len(find_traces(entry.path))
    except OSError:
        return 0


def _count_cached(entry: RunEntry, since: float) -> int:
    cache = entry.report_dir / ".cache"
    try:
        return sum(1 for p in cache.iterdir() if p.suffix == ".parquet"
                   and p.stat().st_mtime >= since - 1)
    except OSError:
        return 0


class Analyses:
    """The analysis queue of one server (module docstring)."""

    def __init__(self, root):
        self.root = str(root)
        self._status: dict[str, AnalysisStatus] = {}
        self._started: dict[str, float] = {}
        self._finished: dict[str, float] = {}
        self._entries: dict[str, RunEntry] = {}
        self._queue: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None

    def start(self, entry: RunEntry) -> None:
        with self._lock:
            st = self._status.get(entry.run_id)
            if st is not None and st.state in ("queued", "running"):
                return
            if st is not None and st.state == "failed" and \
                    time.monotonic() - self._finished.get(entry.run_id, 0.0) < RETRY_AFTER_S:
                return
            self._status[entry.run_id] = AnalysisStatus("queued",
                                                        traces_total=_count_traces(entry))
            self._entries[entry.run_id] = entry
            self._queue.put(entry.run_id)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="meshscope-analyze",
                                                daemon=True)
                self._worker.start()

    def status(self, run_id: str) -> AnalysisStatus | None:
        with self._lock:
            st = self._status.get(run_id)
            if st is None:
                return None
            if st.state == "running":
                elapsed = time.monotonic() - self._started[run_id]
                st = dataclasses.replace(st, elapsed_s=elapsed, traces_done=min(
                    st.traces_total, _count_cached(self._entries[run_id],
                                                   time.time() - elapsed)))
            return st

    def _work(self) -> None:
        while True:
            run_id = self._queue.get()
            entry = self._entries[run_id]
            with self._lock:
                self._started[run_id] = time.monotonic()
                self._status[run_id] = dataclasses.replace(self._status[run_id],
                                                           state="running")
            log.info("analysing %s (first open)", entry.path)
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            try:
                proc = subprocess.run([sys.executable, "-m", "meshscope", "analyze",
                                       str(entry.path)], capture_output=True, text=True,
                                      timeout=TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
                code, out, err = proc.returncode, proc.stdout, proc.stderr
            except (OSError, subprocess.TimeoutExpired) as e:
                code, out, err = -1, "", f"meshscope: error: {type(e).__name__}"
            log.info("meshscope analyze %s exited %s\n%s%s", entry.path, code, out[-4000:],
                     err[-4000:])
            with self._lock:
                st = self._status[run_id]
                elapsed = time.monotonic() - self._started[run_id]
                self._finished[run_id] = time.monotonic()
                if code == 0 and (entry.path / rd.REPORT / "summary.json").is_file():
                    self._status[run_id] = dataclasses.replace(st, state="done",
                                                               elapsed_s=elapsed)
                else:
                    self._status[run_id] = dataclasses.replace(
                        st, state="failed", elapsed_s=elapsed, error=self._one_line(err, entry))

    def _one_line(self, err: str, entry: RunEntry) -> str:
        """The analysis' last error line, with the server's folders replaced by the run id."""
        lines = [ln for ln in err.strip().splitlines() if ln.startswith("meshscope: error:")]
        line = lines[-1][len("meshscope: error:"):].strip() if lines else \
            "meshscope analyze stopped without a message (see the server log)"
        for prefix in (str(entry.path), self.root):
            line = line.replace(prefix, entry.run_id if prefix == str(entry.path) else "")
        return line[:300]
