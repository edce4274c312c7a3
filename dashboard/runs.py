"""Which runs the dashboard serves: the run directories (and sweep folders) under its runs folder.

``RunIndex(root)`` scans ``root`` when asked (``refresh``) and keeps what it found, keyed by a
**run id**: the run's path relative to the root, with ``/`` (``dp2-pp2-1f1b``,
``sweep-w4/dp2-tp2``). Requests name runs by that id only, and the index answers with an entry
it found itself (``get``): no path a request names is ever opened, so ``..``, absolute paths,
URL-encoded separators and ids of folders that are not runs all get ``None``.

What counts as a run is ``collectors.run_dir.run_kind``, the definition ``meshscope analyze``
shares: a folder with ``run.json`` (a run directory), or with a written report
(``report/summary.json``), or holding Kineto traces itself or in its ``traces/`` (a foreign
folder of traces, analysed on first open), or one sub-folder per rank each holding its traces
(``result/0/``, ``result/1/``: one run, not two), or PyTorch's own Flight Recorder dumps
(``_dump_<R>``: a hung job's, analysed likewise). A run id the index does not know makes it
scan again (at most every ``RESCAN_S``), so a run made since is found without the Runs page. A folder that is none of these but holds runs is a **sweep**: its runs are
listed with its name, and the compare page takes them together. Hidden folders and the
run-directory parts (``traces/``, ``steps/``, ``comms/``, ``report/``) are never runs. A
symbolic link is followed only when its target stays inside the root; one leading out is
skipped and named in the server log. The scan goes ``MAX_DEPTH`` levels down at most.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import time

from meshscope.collectors import run_dir as rd

log = logging.getLogger("meshscope.dashboard")

MAX_DEPTH = 3
# An unknown run id rescans the folder at most this often (a run made since, a copied URL).
RESCAN_S = 2.0

_RUN_PARTS = {rd.TRACES, rd.STEPS, rd.COMMS, rd.REPORT}


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """One run found under the root. ``path`` is its resolved location (inside the root)."""
    run_id: str
    path: pathlib.Path
    sweep: str | None          # the id of the sweep folder holding it, None at the top
    has_run_json: bool
    found_as: str = ""         # collectors.run_dir.run_kind: what made it a run

    @property
    def report_dir(self) -> pathlib.Path:
        return rd.ReportDir.of_run(self.path).path

    @property
    def analysed(self) -> bool:
        """Whether ``meshscope analyze`` has written this run's report (checked each time: a
        run analysed on first open becomes analysed while the server runs)."""
        return rd.ReportDir(self.report_dir).summary.is_file()

    @property
    def kind(self) -> str:
        """What the run is, in words: a run directory, a folder of traces, rank folders, a
        folder of Flight Recorder dumps (``run_dir.run_kind``)."""
        if self.has_run_json:
            return "run directory"
        return self.found_as if self.found_as not in ("", "report") else "folder of traces"


class RunIndex:
    """The runs under ``root`` (module docstring); ``refresh()`` rescans, ``get(id)`` looks up."""

    def __init__(self, root: pathlib.Path):
        self.root = pathlib.Path(root).resolve()
        self.runs: dict[str, RunEntry] = {}
        self.sweeps: dict[str, list[str]] = {}
        self.refresh()

    def inside(self, p: pathlib.Path) -> bool:
        """Whether the real location of ``p`` lies inside the root."""
        try:
            return p.resolve().is_relative_to(self.root)
        except (OSError, RuntimeError):  # a symlink loop
            return False

    def refresh(self) -> dict[str, RunEntry]:
        runs: dict[str, RunEntry] = {}
        sweeps: dict[str, list[str]] = {}
        seen: set[pathlib.Path] = set()

        def walk(folder: pathlib.Path, depth: int, sweep: str | None):
            try:
                # Real folders before links, so a run reached both ways keeps its own name.
                children = sorted(os.scandir(folder), key=lambda e: (e.is_symlink(), e.name))
            except OSError as e:
                log.warning("runs folder: cannot list %s (%s)", folder, e.strerror)
                return
            for child in children:
                if child.name.startswith(".") or child.name in _RUN_PARTS:
                    continue
                p = pathlib.Path(child.path)
                try:
                    if not child.is_dir():
                        continue
                except OSError:
                    continue
                if child.is_symlink() and not self.inside(p):
                    log.warning("runs folder: %s is a symbolic link leading outside %s; "
                                "not served", p, self.root)
                    continue
                real = p.resolve()
                if real in seen:
                    continue
                seen.add(real)
                run_id = p.relative_to(self.root).as_posix()
                kind = rd.run_kind(real)
                if kind is not None:
                    runs[run_id] = RunEntry(run_id, real, sweep, kind == "run directory",
                                            kind)
                    if sweep is not None:
                        sweeps.setdefault(sweep, []).append(run_id)
                elif depth < MAX_DEPTH:
                    walk(p, depth + 1, run_id)

        if self.root.is_dir():
            walk(self.root, 1, None)
        self.runs, self.sweeps = runs, sweeps
        self._scanned = time.monotonic()
        return runs

    def get(self, run_id) -> RunEntry | None:
        """The run found under ``run_id``; None for anything else (not a string, unknown,
        a path of any kind that the scan did not produce)."""
        if not isinstance(run_id, str):
            return None
        entry = self.runs.get(run_id)
        if entry is None and time.monotonic() - self._scanned > RESCAN_S:
            # A run folder made since the last scan is found without the Runs page.
            self.refresh()
            entry = self.runs.get(run_id)
        if entry is None:
            return None
        # The folder may have been replaced by a link leading out since the scan.
        return entry if self.inside(self.root / entry.run_id) else None

    def sweep_runs(self, sweep_id) -> list[RunEntry]:
        return [self.runs[r] for r in self.sweeps.get(sweep_id, []) if r in self.runs] \
            if isinstance(sweep_id, str) else []
