"""The run directory: the contract between collection and analysis (docs/run-directory.md).

```
RUN/
  run.json      schema-versioned description of the run
  traces/       rank{R}.json.gz — one Kineto trace per rank, profiled steps only
  steps/        rank{R}.parquet — per-rank step timings and losses
  comms/        rank{R}.json — Flight Recorder dumps
  logs/         rank{R}.stdout.log, rank{R}.stderr.log, launcher.log
  memory/       rank{R}.pickle — memory snapshots (``--memory-snapshot``, CUDA only)
  report/       written by ``meshscope analyze``
```
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import re
import stat
import tempfile

RUN_SCHEMA_VERSION = 1
RUN_JSON = "run.json"
TRACES = "traces"
STEPS = "steps"
COMMS = "comms"
LOGS = "logs"                     # each rank's stdout/stderr and the launcher's log
MEMORY = "memory"                 # memory snapshots, rank{R}.pickle (--memory-snapshot, CUDA)
REPORT = "report"
SUMMARY = "summary.json"          # the report's summary, in REPORT
SWEEP_JSON = "sweep.json"         # a sweep's index, in the sweep's folder
PLAN_JSON = "plan.json"           # the plan a sweep ran, in the sweep's folder
COMPARISON_JSON = "comparison.json"   # `meshscope compare SWEEP --json`, in the sweep's folder
# What a trace file's name ends with (Kineto writes .json, .json.gz, .pt.trace.json …).
TRACE_SUFFIXES = (".json", ".json.gz")
# The JSON files a run folder (or a folder of runs) holds that are never traces: whoever looks
# for trace files (the analysis' inputs, the dashboard's run discovery) leaves these out.
NOT_TRACES = frozenset({RUN_JSON, SUMMARY, "config.json", SWEEP_JSON, PLAN_JSON,
                        COMPARISON_JSON})


CACHE = ".cache"                  # the report's cache folder: parsed traces, the report key
MARKER = ".meshscope-report"      # in REPORT: written with every report, names its writer
REPORT_KEY = "report.key"         # in CACHE: the digest of what the report was made from
INPUTS_MEMO = "inputs.json"       # in CACHE: each input's stat and content hash


@dataclasses.dataclass(frozen=True)
class ReportDir:
    """A report folder, ``RUN/report`` by default, and the name of every file in it: one
    ``<table>.parquet`` per table of ``analysis/report/tables.py``, ``summary.json``, and the
    ``.cache/`` folder with the report key, the inputs memo and one parquet copy per parsed
    trace (docs/report-format.md). Whoever opens a report's file asks this for its path."""
    path: pathlib.Path

    @classmethod
    def of_run(cls, run: pathlib.Path) -> "ReportDir":
        """The report of the run folder ``run`` (``run/report``); of a file analysed alone (a
        memory snapshot, one trace), the folder beside it named after it
        (``rank3.pickle`` → ``rank3.pickle.report``)."""
        run = pathlib.Path(run)
        if run.is_file():
            return cls(run.with_name(run.name + "." + REPORT))
        return cls(run / REPORT)

    @property
    def summary(self) -> pathlib.Path:
        return self.path / SUMMARY

    def table(self, name: str) -> pathlib.Path:
        """The parquet file of table ``name`` (``breakdown`` → ``breakdown.parquet``)."""
        return self.path / f"{name}.parquet"

    def tables(self) -> list[pathlib.Path]:
        """The parquet files the folder holds now, sorted by name."""
        return sorted(self.path.glob("*.parquet")) if self.path.is_dir() else []

    @property
    def cache(self) -> pathlib.Path:
        return self.path / CACHE

    @property
    def marker(self) -> pathlib.Path:
        """The file that says meshscope wrote this folder (``analysis/report/target.py``)."""
        return self.path / MARKER

    @property
    def key(self) -> pathlib.Path:
        return self.cache / REPORT_KEY

    @property
    def inputs_memo(self) -> pathlib.Path:
        return self.cache / INPUTS_MEMO


def now() -> str:
    """UTC now as run.json writes it (ISO 8601, seconds)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def versions() -> dict:
    """run.json's ``versions``: python, torch and meshscope."""
    import importlib.metadata as md

    import torch
    try:
        mine = md.version("meshscope")
    except md.PackageNotFoundError:
        mine = "unknown"
    return {"python": platform.python_version(), "torch": torch.__version__, "meshscope": mine}


class RunDirError(ValueError):
    """A run directory file that cannot be used; the message names the file and the problem."""


def not_regular(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file (a FIFO, a device…); None for
    a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return what
    return "not a regular file"


def unusable_file(path: pathlib.Path, run: pathlib.Path | None = None) -> str | None:
    """Why ``path`` must not be opened as an input (None when it may): it is not a regular file
    (a FIFO would hang the reader, a device such as /dev/zero never ends), or, with ``run``
    given, it is a link (or lies under one) that leads outside the folder ``run``. Nothing is
    opened to find out."""
    path = pathlib.Path(path)
    try:
        st = path.stat()
    except OSError:
        if path.is_symlink():
            return f"skipped, a broken link (to {os.readlink(path)})"
        return "skipped, cannot be read"
    if not stat.S_ISREG(st.st_mode):
        return f"skipped, {not_regular(st.st_mode)}, not a regular file"
    if run is not None:
        real, home = path.resolve(), pathlib.Path(run).resolve()
        if real != home and home not in real.parents:
            return f"skipped, a link leaving the run folder (to {real})"
    return None


# A folder named for one rank of a job: "0", "rank3", "rank-3", "worker_1", "gpu7", "node0" …
RANK_FOLDER_RE = re.compile(r"(?:rank|worker|proc|process|gpu|device|node)?[-_]?\d+",
                            re.IGNORECASE)


def _holds_traces(folder: pathlib.Path) -> bool:
    """Kineto traces in ``folder`` itself or in its ``traces/`` folder (regular files or
    links; meshscope's own JSON files are not traces)."""
    for d in (folder, folder / TRACES):
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.endswith(TRACE_SUFFIXES) and e.name not in NOT_TRACES \
                            and e.is_file():
                        return True
        except OSError:
            continue
    return False


def _rank_folders(folder: pathlib.Path) -> list[pathlib.Path]:
    """The sub-folders of ``folder`` named for a rank that hold traces, when every sub-folder
    holding traces is one of them (a job that wrote one folder per rank: ``result/0/``,
    ``result/1/``); [] otherwise."""
    found, other = [], False
    try:
        children = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    for e in children:
        if e.name.startswith(".") or e.name in (REPORT, STEPS, COMMS, LOGS):
            continue
        try:
            if not e.is_dir():
                continue
        except OSError:
            continue
        if _holds_traces(pathlib.Path(e.path)):
            if RANK_FOLDER_RE.fullmatch(e.name):
                found.append(pathlib.Path(e.path))
            else:
                other = True
    return [] if other else found


def _holds_torch_dumps(folder: pathlib.Path) -> bool:
    """PyTorch's own Flight Recorder dumps in ``folder`` itself (``_dump_<R>``,
    ``nccl_trace_rank_<R>``…: told by name, then by their first bytes, as
    ``collectors.torch_dumps.torch_dump_name`` / ``torch_dump_form`` say)."""
    from .torch_dumps import torch_dump_form, torch_dump_name

    try:
        with os.scandir(folder) as it:
            for e in it:
                named = torch_dump_name(e.name)
                if named and not e.name.startswith(".") and e.is_file() and \
                        torch_dump_form(pathlib.Path(e.path), named[2]) is None:
                    return True
    except OSError:
        pass
    return False


def run_kind(folder: pathlib.Path) -> str | None:
    """What makes ``folder`` one run — the one definition the dashboard's run discovery and
    ``meshscope analyze`` share: ``"run directory"`` (run.json), ``"report"`` (an analysed
    folder, ``report/summary.json``), ``"folder of traces"`` (Kineto traces in it or in its
    ``traces/``), ``"rank folders"`` (one sub-folder per rank, each holding its traces: named
    ``0``, ``rank3``, ``worker_1`` … — every trace-holding sub-folder such a name),
    ``"flight recorder dumps"`` (PyTorch's own dumps, ``_dump_<R>``, in it: a hung job's);
    None for a folder that is no run (it may hold runs)."""
    folder = pathlib.Path(folder)
    if (folder / RUN_JSON).is_file():
        return "run directory"
    if ReportDir.of_run(folder).summary.is_file():
        return "report"
    if _holds_traces(folder):
        return "folder of traces"
    if _rank_folders(folder):
        return "rank folders"
    if _holds_torch_dumps(folder):
        return "flight recorder dumps"
    return None


def trace_path(run: pathlib.Path, rank: int) -> pathlib.Path:
    return pathlib.Path(run) / TRACES / f"rank{rank}.json.gz"


def steps_path(run: pathlib.Path, rank: int) -> pathlib.Path:
    return pathlib.Path(run) / STEPS / f"rank{rank}.parquet"


def comms_path(run: pathlib.Path, rank: int) -> pathlib.Path:
    """Rank ``rank``'s Flight Recorder dump, in meshscope's form (``collectors/flight_recorder.py``)."""
    return pathlib.Path(run) / COMMS / f"rank{rank}.json"


def log_paths(run: pathlib.Path, rank: int) -> tuple[pathlib.Path, pathlib.Path]:
    """Rank ``rank``'s stdout and stderr as the launcher leaves them (``parallel/launch.py``
    has torchrun write them under these names)."""
    logs = pathlib.Path(run) / LOGS
    return logs / f"rank{rank}.stdout.log", logs / f"rank{rank}.stderr.log"


def snapshot_path(run: pathlib.Path, rank: int) -> pathlib.Path:
    """Rank ``rank``'s memory snapshot (``meshscope run --memory-snapshot``, CUDA only)."""
    return pathlib.Path(run) / MEMORY / f"rank{rank}.pickle"


def write_json_atomic(path: pathlib.Path, data: dict) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def fsync_path(path: pathlib.Path) -> None:
    """Flush a file's content, or a folder's list of entries, to the disk (``fsync`` of a
    read-only descriptor does both on Linux). A file system that cannot (``EINVAL``: some
    network and virtual ones) is left as it is: the write is then atomic but not durable."""
    flags = os.O_RDONLY
    if pathlib.Path(path).is_dir():
        flags |= getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

