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

PyTorch's own dumps are pickles. ``load_pickle_dump`` reads them without executing anything,
through the one plain-data unpickler (``collectors/plain_pickle.py``: opcodes walked before
anything is unpickled, every class refused, plain data only), else ``UnsafePickleError``.

Reading, validated at the boundary: ``read_dump(path)`` decodes a dump with bounds
(``schema.read_document``) and checks it against the typed records below (``Dump``,
``TorchDump``, ``Entry``; their JSON Schema ships as ``collectors/schemas/
flight_recorder.schema.json``, generated from them by ``json_schema()``): every field the
analysis reads has its type, integers are within 64 bits, ranks below 2²⁰, and the rank the dump
claims must be the one its file name says (``rank3.json`` holds rank 3). A dump that is not is
refused with ``RunDirError`` (a ``ValueError``) naming the file, the field as a JSON path and
what is wrong; the analysis then names it under the report's problems and leaves that rank out
of the Flight Recorder comparison (``analysis/report/inputs.load_dumps``). ``read_dump`` returns
the typed ``Dump``: the fields the records name, those of an entry the records leave out (stack
frames, for one) dropped.
"""
from __future__ import annotations

import json
import pathlib
import re
import time
from typing import Annotated, Any, Literal

import msgspec

from . import plain_pickle, schema
from .plain_pickle import UnsafePickleError
from .run_dir import COMMS, RunDirError, write_json_atomic
from .run_info import MAX_WORLD_SIZE

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


# -- the typed records a dump is checked against ---------------------------------------------

Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)]


class Entry(msgspec.Struct, gc=False):
    """One operation of PyTorch's Flight Recorder buffer (the fields meshscope reads; others
    are allowed). ``process_group``: (name, description); the sequence number that matters is
    ``p2p_seq_id`` for point-to-point operations, else ``collective_seq_id``."""
    process_group: tuple[str, str]
    profiling_name: str
    collective_seq_id: Count
    p2p_seq_id: Count
    is_p2p: bool = False
    state: str | None = None
    record_id: Count | None = None
    pg_id: Count | None = None
    op_id: Count | None = None
    input_sizes: list[list[Count]] | None = None
    output_sizes: list[list[Count]] | None = None
    input_dtypes: list[str] | None = None
    output_dtypes: list[str] | None = None
    time_created_ns: Count | None = None
    time_discovered_started_ns: Count | None = None
    time_discovered_completed_ns: Count | None = None
    timeout_ms: Count | None = None
    retired: bool | None = None
    thread_id: str | None = None
    thread_name: str | None = None


class GroupConfig(msgspec.Struct, gc=False):
    """A process group as the dump describes it; ``ranks`` a list, or its text (``"[0, 1]"``)."""
    name: str | None = None
    desc: str | None = None
    ranks: str | list[Rank] | None = None


class TorchDump(msgspec.Struct):
    """PyTorch's own dump (``_dump_fr_trace_json``; the pickle holds the same)."""
    version: str | None = None
    entries: list[Entry] = []
    pg_config: dict[str, GroupConfig] = {}
    pg_status: dict[str, Any] = {}
    nccl_comm_state: Any = None
    comm_lib_version: str | None = None


class Dump(msgspec.Struct):
    """``comms/rank{R}.json`` as ``dump`` writes it (module docstring)."""
    schema_version: Literal[1]
    rank: Rank
    flight_recorder: TorchDump | None
    reason: str | None = None
    error: str | None = None
    dumped_at_unix_s: float | None = None
    torch_version: str | None = None
    dump_error: str | None = None


def json_schema() -> dict:
    """The JSON Schema of a dump, from the records above (shipped as
    ``collectors/schemas/flight_recorder.schema.json``)."""
    out = msgspec.json.schema(Dump)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://meshscope.invalid/schemas/flight_recorder.schema.json",
            "title": f"meshscope comms/rank<R>.json (Flight Recorder dump), schema_version "
                     f"{FR_SCHEMA_VERSION}", **out}


def _typed(data, kind, path: pathlib.Path, what: str):
    """``data`` checked against record ``kind``; RunDirError naming the field otherwise."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as e:
        problem, _, where = str(e).partition(" - at `")
        raise RunDirError(f"{path}: {where.rstrip('`') or '$'}: {problem} (not a usable "
                          f"{what})") from None


def load_pickle_dump(path: pathlib.Path) -> dict:
    """A PyTorch Flight Recorder pickle, loaded as plain data only and checked against
    ``TorchDump``; ``UnsafePickleError`` naming the file otherwise."""
    path = pathlib.Path(path)
    try:
        obj = plain_pickle.loads(path.read_bytes())
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{path}: {e}") from None
    except OSError as e:
        raise UnsafePickleError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(obj, dict):
        raise UnsafePickleError(f"{path}: expected a dict at the top level")
    try:
        _typed(obj, TorchDump, path, "Flight Recorder pickle")
    except RunDirError as e:
        raise UnsafePickleError(str(e)) from None
    return obj


_RANK_IN_NAME = re.compile(r"^rank(\d+)\.json$")


def read_dump(path: pathlib.Path) -> Dump:
    """A ``comms/rank{R}.json`` written by ``dump``, checked and typed (module docstring);
    RunDirError (a ValueError) naming the file, the field and the problem when it cannot be
    used."""
    path = pathlib.Path(path)
    raw = schema.read_bytes(path, "Flight Recorder dump")
    try:        # a usable dump, decoded straight into its records (3× faster than by dicts)
        dump = _DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        dump = _checked(path, raw)      # the same document, read again to name what is wrong
    m = _RANK_IN_NAME.match(path.name)
    if m and int(m.group(1)) != dump.rank:
        raise RunDirError(f"{path}: $.rank: the dump claims rank {dump.rank}, but its file name "
                          f"says rank {int(m.group(1))}")
    return dump


_DECODER = msgspec.json.Decoder(Dump)


def _checked(path: pathlib.Path, raw: bytes) -> Dump:
    """``raw`` as a ``Dump``, or RunDirError naming the first thing that keeps it from being
    one: not JSON, not an object, an unknown schema version, no rank, then the field."""
    data = schema.read_document(path, "Flight Recorder dump", raw)
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: $: expected a Flight Recorder dump (an object), got "
                          f"{schema.short(data)}")
    if data.get("schema_version") != FR_SCHEMA_VERSION:
        raise RunDirError(f"{path}: $.schema_version: unknown Flight Recorder dump schema "
                          f"{schema.short(data.get('schema_version'))} (this meshscope reads "
                          f"version {FR_SCHEMA_VERSION})")
    if "rank" not in data:
        raise RunDirError(f"{path}: $.rank: Flight Recorder dump without a rank")
    return _typed(data, Dump, path, "Flight Recorder dump")
