"""Re-running ``meshscope analyze`` on inputs it has already analysed: the report is reused.

The report directory keeps ``.cache/report.key``, a digest of everything the report was
computed from:

- every input file under the analysed path (run.json, traces, Flight Recorder dumps, step
  timers — the whole tree but the report directories and hidden files): its path and the
  BLAKE2b hash of its content. Hashing a trace is read at disk speed, so the hash of each file
  is remembered in ``.cache/inputs.json`` with the file's size, modification time, inode and
  change time (ctime): when all four still match, the remembered hash is used. A copy that
  keeps size and mtime (``cp -p``, ``rsync -t``, ``tar``) has another inode or ctime, so it is
  hashed again. Only regular files are read; any other kind of file is keyed by its kind;
- the options that change the report (``--comm-kernel-regex``, ``--rank-regex``, ``--layout``,
  ``--rank-order``, ``--warmup-steps``, ``--device-memory``, reading budgets other than the
  defaults, the ``--baseline`` file's size and time, the content of each ``--snapshot``);
- the analysed path itself, resolved: the report names it (summary.json's ``source``), so a
  copied or moved run is analysed again under its new name rather than printing the
  original's (its traces' parsed copies in ``.cache/`` make that quick);
- the analysis itself: the size and modification time of meshscope's source files, so a
  changed meshscope never serves an old report (installing another version writes them anew;
  the version string is not read, since ``importlib.metadata`` alone costs a third of a
  cached run).

The key file also lists the report's files and their sizes: it is written last, after the
report is complete, in place and flushed to disk (``Report.write``; the key is flushed before
its rename and its folder after, so a power loss never leaves a key without its content), and
the report is only reused when it is
there, matches and every file it lists has its size — a damaged or unkeyed report is made
again. When it matches, the command prints that report instead of computing it again —
without importing pandas or anything heavy, which is most of what a cached run used to cost
(``bench/report_vs_hta.py``). ``--no-cache`` always computes afresh. This module uses the
standard library only.

``MESHSCOPE_TEST_STOP_AT_WRITE=N`` (tests only): the process kills itself (SIGKILL) at the
N-th step of writing a report (``stop_point``), as a crash or ``kill -9`` would.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import signal
import stat

from meshscope.collectors import run_dir as rd

STOP_ENV = "MESHSCOPE_TEST_STOP_AT_WRITE"
_steps = [0]
# Per report directory: the content hashes of its inputs found by ``key`` (``store`` keeps them).
_MEMO: dict[str, dict] = {}


def stop_point() -> None:
    """One step of writing a report; with ``STOP_ENV`` = N, the N-th kills this process."""
    at = os.environ.get(STOP_ENV)
    if not at:
        return
    _steps[0] += 1
    if _steps[0] == int(at):
        os.kill(os.getpid(), signal.SIGKILL)

_SKIP_DIRS = {"report", "__pycache__"}


def _stat_line(h, path: pathlib.Path, label: str) -> None:
    try:
        st = path.stat()
    except OSError:
        h.update(f"{label}\0missing\n".encode())
        return
    h.update(f"{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())


def _walk(root: pathlib.Path, skip: set[pathlib.Path]):
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = pathlib.Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and d not in _SKIP_DIRS and (here / d) not in skip)
        for name in sorted(filenames):
            if not name.startswith("."):
                yield here / name


def _content_line(h, path: pathlib.Path, label: str, old: dict, new: dict) -> None:
    """``label`` and the hash of the file's content (remembered while size, mtime, inode and
    ctime all match); a file that is not a regular file is never opened."""
    try:
        st = path.stat()
    except OSError:
        h.update(f"{label}\0missing\n".encode())
        return
    if not stat.S_ISREG(st.st_mode):
        h.update(f"{label}\0not a regular file {stat.S_IFMT(st.st_mode)}\n".encode())
        return
    sig = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
    known = old.get(label)
    if isinstance(known, list) and len(known) == 5 and known[:4] == sig:
        digest = known[4]
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise OSError("not a regular file")
                digest = hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=20)) \
                    .hexdigest()
        except OSError:
            h.update(f"{label}\0unreadable\n".encode())
            return
    new[label] = sig + [digest]
    h.update(f"{label}\0{digest}\n".encode())


def key(path: pathlib.Path, out: pathlib.Path, options: dict) -> str:
    """The digest of ``path``'s inputs, the ``options`` and this meshscope's sources (module
    docstring); ``out`` is the report directory (never part of the inputs)."""
    path, out = pathlib.Path(path), pathlib.Path(out)
    try:
        old = json.loads(rd.ReportDir(out).inputs_memo.read_text())
        old = old if isinstance(old, dict) else {}
    except (OSError, ValueError, RecursionError):
        old = {}
    new: dict = {}
    h = hashlib.blake2b(digest_size=20)
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    # The path the report describes (its summary names it): a copied or moved run is
    # analysed again under its own name — quickly, its traces' parsed copies are in the cache.
    h.update(f"path\0{path.resolve()}\n".encode())
    baseline = options.get("baseline")
    if baseline:
        _stat_line(h, pathlib.Path(baseline), "baseline")
    for snap in options.get("snapshots") or ():
        _content_line(h, pathlib.Path(snap), f"--snapshot {snap}", old, new)
    analysis = pathlib.Path(__file__).resolve().parents[1]
    for folder in (analysis, analysis.parent / "collectors", analysis.parent / "parallel"):
        for src in sorted(folder.glob("**/*.py")):
            _stat_line(h, src, str(src.relative_to(analysis.parent)))
    for f in _walk(path, {out.resolve()} if out.exists() else set()):
        _content_line(h, f, str(f.relative_to(path)) if path.is_dir() else f.name, old, new)
    _MEMO[str(out)] = new
    return h.hexdigest()


def _listing(out: pathlib.Path) -> dict:
    """The report's own files (not hidden) and their sizes."""
    return {f.name: f.stat().st_size for f in sorted(out.iterdir())
            if not f.name.startswith(".") and f.is_file()}


def cached_summary(out: pathlib.Path, digest: str) -> dict | None:
    """The stored summary.json when ``out``'s report was computed from exactly ``digest``."""
    out = pathlib.Path(out)
    try:
        stored, _, listing = rd.ReportDir(out).key.read_text().partition("\n")
        if stored.strip() != digest or json.loads(listing) != _listing(out):
            return None
        summary = json.loads(rd.ReportDir(out).summary.read_text())
        return summary if isinstance(summary, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def store(out: pathlib.Path, digest: str) -> None:
    """Remember that ``out``'s report is that of ``digest`` (a failure to write is ignored: the
    next run computes afresh)."""
    try:
        report = rd.ReportDir(pathlib.Path(out))
        d = report.cache
        d.mkdir(parents=True, exist_ok=True)
        memo = _MEMO.pop(str(pathlib.Path(out)), None)
        if memo is not None:
            tmp = d / f".{rd.INPUTS_MEMO}.{os.getpid()}"
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, report.inputs_memo)
        stop_point()
        tmp = d / f".{rd.REPORT_KEY}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(digest + "\n" + json.dumps(_listing(pathlib.Path(out))) + "\n")
            f.flush()
            os.fsync(f.fileno())        # the key's content on disk before its name
        stop_point()
        os.replace(tmp, report.key)
        rd.fsync_path(d)
    except OSError:
        pass


def unkey(out: pathlib.Path) -> None:
    """Forget which inputs ``out``'s report is of (before it is replaced): a run killed before
    the new key is stored leaves a report that the next run makes again."""
    try:
        rd.ReportDir(pathlib.Path(out)).key.unlink(missing_ok=True)
    except OSError:
        pass
