"""What the benchmark scripts share: timing a command as a process (wall time and peak memory),
describing the machine, and writing a section of docs/benchmarks.md.

``measure(cmd)`` runs a command the way a user would and returns a ``Measured``: its wall
time; the peak resident memory of its largest process (each process's own high-water mark,
``VmHWM`` in /proc, sampled every ``SAMPLE_S`` over the whole process tree); and the peak of the
summed RSS of the whole process tree, sampled likewise (what a job with worker processes holds
at once; pages a forked worker still shares with its parent count twice, so this errs high).
Not ``wait4``'s ``ru_maxrss``: Linux carries into it the RSS of the forked copy of the caller
before ``execve``, so a command measured from a large process (a test session of 1 GB) would
read as 1 GB. A worker that lives less than ``SAMPLE_S`` can be missed.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import platform
import re
import sys
import subprocess
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
MESHSCOPE = [str(ROOT / ".venv" / "bin" / "python"), "-m", "meshscope"]
SAMPLE_S = 0.02


@dataclasses.dataclass
class Measured:
    wall_s: float
    peak_rss_mb: float        # the largest single process (its VmHWM, sampled)
    peak_tree_rss_mb: float   # all processes of the command at once (sampled)
    returncode: int
    stdout: str
    stderr: str
    # With ``measure(pss=True)``: all processes at once, each page shared among them (a
    # forked worker's pages still shared with its parent) counted once — their proportional
    # set sizes summed (sampled; NaN without it).
    peak_tree_pss_mb: float = float("nan")


def _hwm_mb(pid: int) -> float:
    """``VmHWM`` of one process (its peak RSS since its ``execve``), MB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _tree_mb(pid: int, pss: bool = False) -> tuple[float, float, float]:
    """(summed RSS, the largest ``VmHWM``, summed PSS — NaN unless ``pss``) of ``pid`` and its
    descendants (via /proc), MB."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0, 0.0, 0.0
    total, hwm, shared = 0, 0.0, 0
    for p in procs:
        try:
            total += p.memory_info().rss
            if pss:
                shared += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        hwm = max(hwm, _hwm_mb(p.pid))
    return total / 2**20, hwm, (shared / 2**20 if pss else float("nan"))


def measure(cmd: list[str], *, env: dict | None = None, cwd: pathlib.Path = ROOT,
            timeout_s: float = 3600, check: bool = True, pss: bool = False) -> Measured:
    """Run ``cmd`` to its end; its wall time and peak memory (module docstring); ``pss``:
    also the peak of the process tree's summed proportional set sizes (``Measured``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = [0.0, 0.0, float("nan")]   # summed RSS of the tree, the largest VmHWM, summed PSS
    done = threading.Event()

    def sample():
        while not done.is_set():
            tree, hwm, shared = _tree_mb(proc.pid, pss)
            peak[0], peak[1] = max(peak[0], tree), max(peak[1], hwm)
            if pss:
                peak[2] = shared if peak[2] != peak[2] else max(peak[2], shared)
            done.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out_chunks, err_chunks = [], []
    readers = [threading.Thread(target=lambda s=s, c=c: c.append(s.read()), daemon=True)
               for s, c in ((proc.stdout, out_chunks), (proc.stderr, err_chunks))]
    for r in readers:
        r.start()
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    result = Measured(wall, peak[1], max(peak[0], peak[1]),
                      proc.returncode, "".join(out_chunks), "".join(err_chunks),
                      peak_tree_pss_mb=max(peak[2], peak[1]) if pss else float("nan"))
    if check and result.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} exited {result.returncode}:\n"
                         f"{result.stderr[-3000:]}")
    return result


def git_commit() -> str:
    """The commit measured, with ``+changes`` when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes" if dirty else "")


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({model or platform.machine()}), {mem:.0f} GiB RAM, " \
           f"Python {platform.python_version()}, {platform.system()}"


def provenance(command: str, note: str, *details: str) -> str:
    """The line that opens a benchmark's section: the command as run, today's date, the
    commit, the machine, any ``details`` (library versions, worker counts) and the machine's
    load at the start (``load_note``)."""
    import datetime as dt

    parts = [f"machine: {machine()}", *details, note]
    return (f"`{command}` on {dt.date.today().isoformat()}, commit {git_commit()}; "
            f"{'; '.join(parts)}.")


def versions(packages=("traceinsight", "msgspec", "pyarrow", "pandas")) -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for pkg in packages:
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            pass
    return ", ".join(parts)


def load_note() -> str:
    """The machine's load when the measurement started (other work shares these cores)."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return ""
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) at the start"


def write_docs_section(heading: str, section: str) -> None:
    """Put ``section`` (which starts with ``heading``, a ``## `` line) into docs/benchmarks.md,
    replacing the section of that heading if there is one, else at the end."""
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip() + "\n\n", text)
    else:
        text = text.rstrip() + "\n\n" + section.rstrip() + "\n"
    DOCS.write_text(text.rstrip() + "\n")


def status_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, MB. Not ``ru_maxrss``: Linux
    carries that over ``execve`` from the parent's memory at ``fork``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def met(ok: bool) -> str:
    """How a target line ends: met, or not met in bold."""
    return "met" if ok else "**not met**"


def publish(heading: str, section: str, write: bool) -> None:
    """Print a benchmark's section; with ``write``, also put it into docs/benchmarks.md."""
    print(section)
    if write:
        write_docs_section(heading, section)
        print(f"written to {DOCS.relative_to(ROOT)}", file=sys.stderr)
