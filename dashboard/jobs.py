"""Runs not analysed yet are analysed on first open: ``meshscope analyze RUN`` in a child
process, while the page shows its progress.

``Analyses.start(entry)`` queues the run (once; opening the page again only asks how far it
is; a failed analysis is tried again when the run is opened ``RETRY_AFTER_S`` later);
``status(run_id)`` returns an ``AnalysisStatus``: ``state`` (``queued``, ``running``,
``done``, ``failed``), seconds elapsed, trace files parsed so far out of the run's total (the
analysis keeps one parquet copy per parsed trace in ``report/.cache``, which is what is
counted) and, for a failure, the analysis' own one-line error with the server's paths taken
out. A child process rather than a thread: the analysis runs its own worker pool, and a crash
there cannot take the server down. Its full output goes to the server log.

The runs folder may hold anything, so each analysis is bounded on its own (``Limits``):

- **a pool** of ``workers`` analyses at a time (2 by default): a run that hangs holds one
  worker, the others go on;
- **a time limit** (``timeout_s``, 10 minutes by default): past it the analysis is killed and
  its run named as failed ("took longer than the dashboard's limit");
- **a memory limit** (``memory_mb``): the child's address space is capped
  (``RLIMIT_AS``), so a trace that inflates without end ends in that run's failure, not in the
  server's machine running out of memory. A process past its cap does not always say so: Python
  prints ``MemoryError``, but an allocation failing in C (a library mapped at import,
  OpenBLAS's buffers, Arrow) may end the process with a bare exit code or a signal. So the
  supervisor watches the address space of the analysis and its workers (``VmPeak``) and
  reports, when the child ends, its exit status, that peak and its peak resident memory
  (``os.wait4``). A failure is named "stopped: memory limit (N MiB)" when the evidence says
  so (``memory_evidence``): ``MemoryError`` or an allocation failure in its output, an
  address space that reached within ``NEAR_CAP`` of the cap, a crash (SIGSEGV, SIGBUS,
  SIGABRT: an allocation that failed unchecked; the address space is sampled every 20 ms and
  may grow to the cap between two samples), or a SIGKILL the dashboard did not send (the
  kernel's out-of-memory killer). A process at its cap may also stop without ending (CPython
  left waiting on a lock it could not release): once the address space has reached the cap
  and the analysis and its workers have used no CPU for ``stall_s`` (15 s), the supervisor
  stops them, and the failure is named by the memory limit, without waiting for the time
  limit;
- **they end with the server**: each child leads its own process group (its worker pool
  inside it), killed as a group on timeout and by ``shutdown()`` (called when the server
  stops); on Linux the group also ends if the server dies without stopping (the child is a
  small supervisor, ``_LIMITED``, told by ``PR_SET_PDEATHSIG``).

The Perfetto export of the dashboard (``export_perfetto``) parses traces too: it runs the same
way, ``meshscope export`` in a child process within the same limits.

The analysis runs in the runs folder with the run's id as its path, so what it writes into the
report (the source, the files named in problems) is relative to the runs folder: pages and
exports show no server path.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from meshscope.collectors import run_dir as rd

from .runs import RunEntry

log = logging.getLogger("meshscope.dashboard")
RETRY_AFTER_S = 60     # a failed analysis is tried again when the run is opened after this


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one analysis started by the dashboard may use (module docstring)."""
    timeout_s: float = 600.0
    memory_mb: int = 4096
    workers: int = 2
    stall_s: float = 15.0       # at its cap and no CPU used for this long: stuck, stopped


# The child: a small supervisor in its own process group (``start_new_session``) that caps the
# address space, then runs ``python -m meshscope ...`` and waits for it. On Linux it is told
# when the server dies, even killed outright (``PR_SET_PDEATHSIG``, SIGTERM), and then kills its
# whole group: the analysis and the analysis' own worker pool. A program rather than
# ``preexec_fn``, which may deadlock in a server with threads. While it waits it reads, every
# 20 ms, the peak address space (``VmPeak``) of the analysis and of its children (its worker
# pool: each has the cap of its own); when the analysis ends it prints one line,
# ``meshscope-supervisor: exit=… peak_vm_kib=… peak_rss_kib=…`` (``END_MARK``), the last of
# its stderr — ``exit=stopped`` when it was told to stop (SIGTERM: the time limit, the server).
# A process that runs out of address space does not always end: CPython may be left waiting
# for ever on a lock it could not release (seen: an import of numpy under a 100 MiB cap, its
# only thread blocked in importlib's module lock). So when the analysis' address space has
# reached the cap (``NEAR_CAP``) and neither it nor any of its workers has used CPU time for
# ``stall_s`` seconds (``/proc/PID/stat``), the supervisor stops the group itself and says
# ``exit=stalled … idle_s=…``.
_LIMITED = """\
import os, resource, signal, subprocess, sys, time
cap = int(sys.argv[1]) << 20
stall_s = float(sys.argv[3])
near_cap_kib = float(sys.argv[4]) * (cap >> 10)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
peak = 0
def stop(*_, how="stopped", extra=""):
    try:                                            # told to stop: how far it had got
        sys.stderr.write(f"\\nmeshscope-supervisor: exit={how} peak_vm_kib={peak} "
                         f"peak_rss_kib=0{extra}\\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, stop)
if sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
if os.getppid() != int(sys.argv[2]):
    stop()                                          # the server is gone already
def vm_peak_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0
def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])    # utime + stime
    except (OSError, ValueError, IndexError):
        return 0
def children(pid):
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return out
child = subprocess.Popen([sys.executable] + sys.argv[5:])
seen, since = None, time.monotonic()
while True:
    pid, status, usage = os.wait4(child.pid, os.WNOHANG)
    if pid:
        break
    procs = [child.pid] + children(child.pid)
    for p in procs:
        peak = max(peak, vm_peak_kib(p))
    now = time.monotonic()
    work = (sorted(procs), sum(cpu_ticks(p) for p in procs))
    if work != seen:
        seen, since = work, now
    elif peak >= near_cap_kib and now - since >= stall_s:
        stop(how="stalled", extra=f" idle_s={now - since:.1f}")
    time.sleep(0.02)
code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
sys.stderr.write(f"\\nmeshscope-supervisor: exit={code} peak_vm_kib={peak} "
                 f"peak_rss_kib={usage.ru_maxrss}\\n")
sys.stderr.flush()
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""
END_MARK = "meshscope-supervisor:"
NEAR_CAP = 0.9          # an address space past this share of the cap counts as reaching it
# What an allocation that failed prints, besides Python's MemoryError: errno ENOMEM's text, a
# shared library that could not be mapped at import, C++'s and NumPy's and OpenBLAS's words, a
# thread whose stack found no room (under RLIMIT_AS, 8 MiB of address space each).
# The signals a process that dereferences a failed allocation dies of (exit codes, negative).
CRASH_SIGNALS = (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT)
ALLOCATION_FAILED = ("Cannot allocate memory", "failed to map segment", "std::bad_alloc",
                     "Unable to allocate", "Memory allocation", "out of memory",
                     "can't start new thread")


@dataclasses.dataclass(frozen=True)
class ChildEnd:
    """How the analysis ended, as its supervisor saw it (``END_MARK`` line)."""
    exit: int | None            # the exit code, minus the signal that ended it, or None:
                                # stopped while running (by the dashboard's time limit, or
                                # by the supervisor: stuck at its cap)
    peak_vm_mib: float          # the largest address space of it or one of its workers
    peak_rss_mib: float         # its peak resident memory (``wait4``'s ``ru_maxrss``)
    stalled_s: float | None = None  # stopped by the supervisor: at its cap, no CPU for this


def child_end(err: str) -> ChildEnd | None:
    """The supervisor's last line in ``err``, or None (killed before it could print)."""
    for line in reversed(err.splitlines()):
        if line.startswith(END_MARK):
            fields = dict(f.split("=", 1) for f in line[len(END_MARK):].split() if "=" in f)
            try:
                code = None if fields["exit"] in ("stopped", "stalled") else int(fields["exit"])
                stalled = float(fields["idle_s"]) if fields["exit"] == "stalled" else None
                return ChildEnd(code, int(fields["peak_vm_kib"]) / 1024,
                                int(fields["peak_rss_kib"]) / 1024, stalled)
            except (KeyError, ValueError):
                return None
    return None


def memory_evidence(err: str, end: ChildEnd | None, cap_mb: int) -> str | None:
    """Why a failed analysis that printed no error of its own was stopped by memory — "memory
    limit (N MiB; what shows it)" or "out of memory (…)" — or None when nothing says so."""
    if "MemoryError" in err:
        return f"memory limit ({cap_mb} MiB; it raised MemoryError)"
    for words in ALLOCATION_FAILED:
        if words.lower() in err.lower():
            return f"memory limit ({cap_mb} MiB; an allocation failed: “{words}”)"
    if end is None:
        return None
    if end.stalled_s is not None:
        return (f"memory limit ({cap_mb} MiB; its address space reached "
                f"{end.peak_vm_mib:.0f} MiB, and then it used no CPU for {end.stalled_s:.0f} s: "
                f"stuck at the cap)")
    if end.peak_vm_mib >= NEAR_CAP * cap_mb:
        return (f"memory limit ({cap_mb} MiB; its address space reached "
                f"{end.peak_vm_mib:.0f} MiB)")
    if end.exit == -signal.SIGKILL:
        return (f"out of memory (killed by SIGKILL, which the dashboard did not send: the "
                f"kernel's out-of-memory killer, most likely; {end.peak_rss_mib:.0f} MiB "
                f"resident at its peak)")
    if end.exit in CRASH_SIGNALS:
        # Under an address-space cap a C library whose allocation or mapping failed and that
        # does not check for it crashes; the supervisor samples the address space every
        # 20 ms, so a process that grows to the cap and dies between two samples leaves a
        # peak below it (seen: signal 11 at 0.1 s under 100 MiB, while importing).
        return (f"memory limit ({cap_mb} MiB; it crashed with signal {-end.exit}, as a failed "
                f"allocation under the cap does; its address space was last seen at "
                f"{end.peak_vm_mib:.0f} MiB)")
    return None


def supervised(memory_mb: int, stall_s: float, python_args: list[str]) -> list[str]:
    """The command line running ``python PYTHON_ARGS`` under the supervisor (``_LIMITED``):
    ``memory_mb`` of address space, stopped when stuck at that cap for ``stall_s``."""
    return [sys.executable, "-c", _LIMITED, str(memory_mb), str(os.getpid()), f"{stall_s:g}",
            f"{NEAR_CAP:g}", *python_args]


def _limited(limits: Limits, args: list[str]) -> list[str]:
    """The command line running ``python -m meshscope ARGS`` under the limits."""
    return supervised(limits.memory_mb, limits.stall_s, ["-m", "meshscope", *args])


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    cache = rd.ReportDir(entry.report_dir).cache
    try:
        return sum(1 for p in cache.iterdir() if p.suffix == ".parquet"
                   and p.stat().st_mtime >= since - 1)
    except OSError:
        return 0


class Analyses:
    """The analysis queue of one server (module docstring)."""

    def __init__(self, root, limits: Limits | None = None):
        self.root = str(root)
        self.limits = limits or Limits()
        self._procs: dict[int, subprocess.Popen] = {}
        self._export_slots = threading.BoundedSemaphore(self.limits.workers)
        self._closed = False
        self._status: dict[str, AnalysisStatus] = {}
        self._started: dict[str, float] = {}
        self._finished: dict[str, float] = {}
        self._entries: dict[str, RunEntry] = {}
        self._queue: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []

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
            self._workers = [w for w in self._workers if w.is_alive()]
            if len(self._workers) < self.limits.workers and not self._closed:
                w = threading.Thread(target=self._work, name="meshscope-analyze", daemon=True)
                w.start()
                self._workers.append(w)

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
                if self._closed:
                    return
                self._started[run_id] = time.monotonic()
                self._status[run_id] = dataclasses.replace(self._status[run_id],
                                                           state="running")
            log.info("analysing %s (first open)", entry.path)
            code, out, err = self._analyse(entry)
            log.info("meshscope analyze %s exited %s\n%s%s", entry.path, code, out[-4000:],
                     err[-4000:])
            with self._lock:
                st = self._status[run_id]
                elapsed = time.monotonic() - self._started[run_id]
                self._finished[run_id] = time.monotonic()
                if code == 0 and rd.ReportDir.of_run(entry.path).summary.is_file():
                    self._status[run_id] = dataclasses.replace(st, state="done",
                                                               elapsed_s=elapsed)
                else:
                    self._status[run_id] = dataclasses.replace(
                        st, state="failed", elapsed_s=elapsed, error=self._one_line(err, entry))

    def _analyse(self, entry: RunEntry) -> tuple[int, str, str]:
        """``meshscope analyze`` of ``entry`` within the limits: (exit code, stdout, stderr)."""
        return self._run_limited(entry, "analysis", ["analyze", self._rel(entry)])

    def export_perfetto(self, entry: RunEntry, out) -> str | None:
        """``meshscope export RUN --perfetto OUT`` in a child process with the analyses'
        limits (at most ``workers`` at a time): a trace's parsing never grows the server, and
        one that hangs is stopped. None when written, else the one-line reason."""
        with self._export_slots:
            code, _, err = self._run_limited(entry, "export",
                                             ["export", self._rel(entry), "--perfetto", str(out)])
        return None if code == 0 else self._one_line(err, entry)

    def _rel(self, entry: RunEntry) -> str:
        try:
            return entry.path.relative_to(self.root).as_posix()
        except ValueError:
            return str(entry.path)

    def _run_limited(self, entry: RunEntry, what: str, args: list[str]) -> tuple[int, str, str]:
        """``meshscope ARGS`` in the runs folder within the limits (module docstring)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        lim = self.limits
        try:
            proc = subprocess.Popen(_limited(lim, args), cwd=self.root, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            return -1, "", f"meshscope: error: cannot start the {what} ({e.strerror})"
        with self._lock:
            if self._closed:
                _kill_group(proc)
            self._procs[proc.pid] = proc
        try:
            out, err = proc.communicate(timeout=lim.timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            proc.terminate()            # the supervisor says how far it got, then kills all
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out, err = proc.communicate()
            end = child_end(err)
            why = ""
            if end is not None and end.peak_vm_mib >= NEAR_CAP * lim.memory_mb:
                why = (f" (its address space had reached {end.peak_vm_mib:.0f} MiB of the "
                       f"{lim.memory_mb} MiB memory limit: a process that runs out of it may "
                       f"stop without ending)")
            return -1, out, (err + f"\nmeshscope: error: the {what} took longer than the "
                                   f"dashboard's limit of {lim.timeout_s:g} s and was "
                                   f"stopped{why}")
        finally:
            _kill_group(proc)           # what the child left behind (its worker pool)
            with self._lock:
                self._procs.pop(proc.pid, None)
        if code != 0 and "meshscope: error:" not in err:
            end = child_end(err)
            evidence = memory_evidence(err, end, lim.memory_mb)
            if evidence:
                err += f"\nmeshscope: error: the {what} was stopped: {evidence}"
            elif code < 0:
                err += f"\nmeshscope: error: the {what} was stopped by signal {-code}"
            elif end is not None:
                err += (f"\nmeshscope: error: the {what} exited {end.exit} without a message "
                        f"(peak address space {end.peak_vm_mib:.0f} MiB of the "
                        f"{lim.memory_mb} MiB limit; see the server log)")
        return code, out, err

    def shutdown(self) -> None:
        """Kill every analysis still running (with its worker pool); start no other."""
        with self._lock:
            self._closed = True
            procs = list(self._procs.values())
        for proc in procs:
            _kill_group(proc)
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _one_line(self, err: str, entry: RunEntry) -> str:
        """The analysis' last error line, with the server's folders replaced by the run id."""
        lines = [ln for ln in err.strip().splitlines() if ln.startswith("meshscope: error:")]
        line = lines[-1][len("meshscope: error:"):].strip() if lines else \
            "meshscope analyze stopped without a message (see the server log)"
        for prefix in (str(entry.path), self.root + "/", self.root):
            line = line.replace(prefix, entry.run_id if prefix == str(entry.path) else "")
        return line[:300]
