"""Re-running ``meshscope analyze`` on inputs it has already analysed: the report is reused.

The report directory keeps ``.cache/report.key``, a digest of everything the report was
computed from:

- every input file under the analysed path (run.json, traces, Flight Recorder dumps, step
  timers — the whole tree but the report directories and hidden files): its path, size and
  modification time;
- the options that change the report (``--comm-kernel-regex``, ``--rank-regex``, ``--layout``,
  ``--rank-order``, ``--warmup-steps``, the ``--baseline`` file's size and time);
- the analysis itself: the size and modification time of meshscope's source files, so a
  changed meshscope never serves an old report (installing another version writes them anew;
  the version string is not read, since ``importlib.metadata`` alone costs a third of a
  cached run).

When the digest matches the one stored beside a readable ``summary.json``, the command prints
that report instead of computing it again — without importing pandas or anything heavy, which
is most of what a cached run used to cost (``bench/report_vs_hta.py``). A file replaced in
place within the same nanosecond and with the same size would not be noticed: ``--no-cache``
always computes afresh. This module uses the standard library only.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib

KEY_FILE = "report.key"
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


def key(path: pathlib.Path, out: pathlib.Path, options: dict) -> str:
    """The digest of ``path``'s inputs, the ``options`` and this meshscope's sources (module
    docstring); ``out`` is the report directory (never part of the inputs)."""
    path, out = pathlib.Path(path), pathlib.Path(out)
    h = hashlib.blake2b(digest_size=20)
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    baseline = options.get("baseline")
    if baseline:
        _stat_line(h, pathlib.Path(baseline), "baseline")
    analysis = pathlib.Path(__file__).resolve().parents[1]
    for folder in (analysis, analysis.parent / "collectors", analysis.parent / "parallel"):
        for src in sorted(folder.glob("**/*.py")):
            _stat_line(h, src, str(src.relative_to(analysis.parent)))
    for f in _walk(path, {out.resolve()} if out.exists() else set()):
        _stat_line(h, f, str(f.relative_to(path)) if path.is_dir() else f.name)
    return h.hexdigest()


def cached_summary(out: pathlib.Path, digest: str) -> dict | None:
    """The stored summary.json when ``out``'s report was computed from exactly ``digest``."""
    out = pathlib.Path(out)
    try:
        if (out / ".cache" / KEY_FILE).read_text().strip() != digest:
            return None
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def store(out: pathlib.Path, digest: str) -> None:
    """Remember that ``out``'s report is that of ``digest`` (a failure to write is ignored: the
    next run computes afresh)."""
    try:
        d = pathlib.Path(out) / ".cache"
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{KEY_FILE}.{os.getpid()}"
        tmp.write_text(digest + "\n")
        os.replace(tmp, d / KEY_FILE)
    except OSError:
        pass
