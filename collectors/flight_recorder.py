"""Flight Recorder: the last N collectives each rank issued, kept by PyTorch's c10d.

PyTorch records every collective and point-to-point operation of every process group in a ring
buffer of ``TORCH_FR_BUFFER_SIZE`` entries (gloo and NCCL alike in torch 2.13): group, sequence
number, op, sizes, dtypes, state, and — where the backend measures them — start and completion
times. ``dump`` writes this rank's buffer to ``comms/rank{R}.json``:

```
{"schema_version": 1, "rank": R, "reason": "end" | "exception" | "terminated",
 "error": "…" | null, "dumped_at_unix_s": …, "torch_version": …,
 "flight_recorder": {… PyTorch's own JSON dump, unchanged except as noted …}}
```

The runner dumps at the end of a run, when a collective times out or a rank raises, and when
torchrun stops a rank. Timing fields the backend leaves empty (gloo does not measure
``time_discovered_started_ns`` / ``time_discovered_completed_ns``; PyTorch writes 0) are
stored as ``null``: empty stays empty, never invented.

PyTorch's own dumps are pickles. ``load_pickle_dump`` reads them without executing anything: its
unpickler refuses every class and the result must consist of plain data (dict, list, tuple,
str, bytes, int, float, bool, None), else ``UnsafePickleError``.
"""
from __future__ import annotations

import io
import json
import pathlib
import pickle
import time

from .run_dir import COMMS, write_json_atomic

FR_SCHEMA_VERSION = 1
DEFAULT_BUFFER_SIZE = 20000
EMPTY_WHEN_ZERO = ("time_discovered_started_ns", "time_discovered_completed_ns")


def comms_path(run: pathlib.Path, rank: int) -> pathlib.Path:
    return pathlib.Path(run) / COMMS / f"rank{rank}.json"


def _torch_dump() -> dict:
    import torch._C._distributed_c10d as c10d

    data = json.loads(c10d._dump_fr_trace_json(True, False))
    for entry in data.get("entries", []):
        for key in EMPTY_WHEN_ZERO:
            if entry.get(key) == 0:
                entry[key] = None
    return data


def dump(run: pathlib.Path, rank: int, reason: str, error: str | None = None) -> pathlib.Path:
    """Write this rank's Flight Recorder buffer; never raises (a dump must not mask the error
    that prompted it) — a failure to dump is recorded in the file instead."""
    import torch

    record = {"schema_version": FR_SCHEMA_VERSION, "rank": rank, "reason": reason,
              "error": error, "dumped_at_unix_s": time.time(), "torch_version": torch.__version__}
    try:
        record["flight_recorder"] = _torch_dump()
    except Exception as e:  # noqa: BLE001 - report, don't mask
        record["flight_recorder"] = None
        record["dump_error"] = f"{type(e).__name__}: {e}"
    path = comms_path(run, rank)
    write_json_atomic(path, record)
    return path


class UnsafePickleError(ValueError):
    """A pickle that is not plain data; the message names the file and what was refused."""


PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain data "
                                     f"(dict, list, tuple, str, int, float, bool, None)")


def _check_plain(obj, depth=0):
    if depth > 200:
        raise ValueError("nesting deeper than 200 levels")
    if not isinstance(obj, PLAIN):
        raise ValueError(f"object of type {type(obj).__name__}")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_plain(k, depth + 1)
            _check_plain(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _check_plain(v, depth + 1)


def load_pickle_dump(path: pathlib.Path) -> dict:
    """A PyTorch Flight Recorder pickle, loaded as plain data only."""
    path = pathlib.Path(path)
    try:
        obj = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
        _check_plain(obj)
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, AttributeError) as e:
        raise UnsafePickleError(f"{path}: not a plain-data pickle ({e})") from None
    if not isinstance(obj, dict):
        raise UnsafePickleError(f"{path}: expected a dict at the top level")
    return obj


def read_dump(path: pathlib.Path) -> dict:
    """A ``comms/rank{R}.json`` written by ``dump``; ValueError naming the file if unusable."""
    path = pathlib.Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable Flight Recorder dump ({e})") from None
    if not isinstance(data, dict) or data.get("schema_version") != FR_SCHEMA_VERSION:
        raise ValueError(f"{path}: unknown Flight Recorder dump schema "
                         f"{data.get('schema_version') if isinstance(data, dict) else None!r}")
    try:
        data["rank"] = int(data["rank"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: Flight Recorder dump without a rank") from None
    return data
