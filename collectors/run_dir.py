"""The run directory: the contract between collection and analysis (docs/run-directory.md).

```
RUN/
  run.json      schema-versioned description of the run
  traces/       rank{R}.json.gz — one Kineto trace per rank, profiled steps only
  steps/        rank{R}.parquet — per-rank step timings and losses
  report/       written by ``meshscope analyze``
```
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import tempfile

RUN_SCHEMA_VERSION = 1
RUN_JSON = "run.json"
TRACES = "traces"
STEPS = "steps"
COMMS = "comms"
REPORT = "report"


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


def trace_path(run: pathlib.Path, rank: int) -> pathlib.Path:
    return pathlib.Path(run) / TRACES / f"rank{rank}.json.gz"


def steps_path(run: pathlib.Path, rank: int) -> pathlib.Path:
    return pathlib.Path(run) / STEPS / f"rank{rank}.parquet"


def write_json_atomic(path: pathlib.Path, data: dict) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
