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
stored as ``null``: empty stays empty, never invented. Where ``TORCH_FR_DUMP_TEMP_FILE`` names
a prefix (PyTorch's own variable: where NCCL's watchdog writes its dumps on a timeout),
``dump`` also writes the buffer in PyTorch's own format, ``<prefix><rank>`` — the pickle of
``_dump_fr_trace()``, byte for byte what PyTorch writes (``write_torch_dump``): a gloo job
then leaves the files an NCCL job leaves, for ``torchfrtrace`` and for ``meshscope analyze``.

PyTorch's own dumps are pickles. ``load_pickle_dump`` reads them without executing anything,
through the one plain-data unpickler (``collectors/plain_pickle.py``: its own interpreter of
the plain-data opcodes, every class or call refused as it is reached, str dict keys and 64-bit
integers only, nesting, places and memory counted as the data is built — time and memory in
proportion to the file's size), else ``UnsafePickleError``. ``read_torch_dump`` reads such a
file — or PyTorch's JSON form of it (``_dump_fr_trace_json``) — as the ``Dump`` of the rank
its name gives (``_dump_3``, ``nccl_trace_rank_3``: PyTorch's dumps do not hold their rank;
``torch_dump_name``), checked like the runner's own.

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
import os
import pathlib
import re
import sys
import threading
import time
from typing import Annotated, Any, Literal

import msgspec

from . import fr_forms, plain_pickle, schema
from .plain_pickle import UnsafePickleError
from .run_dir import RunDirError, comms_path, write_json_atomic
from .run_info import MAX_WORLD_SIZE

FR_SCHEMA_VERSION = 1
DEFAULT_BUFFER_SIZE = 20000
EMPTY_WHEN_ZERO = ("time_discovered_started_ns", "time_discovered_completed_ns")


def _torch_dump() -> dict:
    import torch._C._distributed_c10d as c10d

    data = json.loads(c10d._dump_fr_trace_json(True, False))
    for entry in data.get("entries", []):
        for key in EMPTY_WHEN_ZERO:
            if entry.get(key) == 0:
                entry[key] = None
    return data


# One dump at a time in a process: a rank that raises dumps from its main thread while the
# launcher's SIGTERM may make its handler dump too; two writers at once shared one temporary
# file (one rename failed, leaving it behind) and the later overwrote the error. The first
# error a process dumped with stays its reason (``_FIRST``): what stopped it.
_DUMP_LOCK = threading.RLock()
DUMP_WAIT_S = 30.0
_FIRST: dict[str, str | None] = {}


def hold_dumps(timeout_s: float = DUMP_WAIT_S) -> None:
    """Wait for a dump another thread of this process is writing, then keep any other from
    starting — for a process about to end with ``os._exit`` (``process_exit.leave_now``), which
    would cut that dump short and leave its temporary file behind: a rank whose main thread
    raised ends while its SIGTERM thread dumps, or the SIGTERM thread ends while the main
    thread dumps. Never released: the process is leaving. A dump that hangs is waited for
    ``timeout_s`` at most."""
    _DUMP_LOCK.acquire(timeout=timeout_s)


def dump(run: pathlib.Path, rank: int, reason: str, error: str | None = None) -> pathlib.Path:
    """Write this rank's Flight Recorder buffer; never raises (a dump must not mask the error
    that prompted it) — a failure to dump is recorded in the file instead. Dumps of one
    process are written one at a time; once it has dumped with an error, a later dump (on
    SIGTERM, at the end) keeps that reason and error, with the newer buffer."""
    held = _DUMP_LOCK.acquire(timeout=DUMP_WAIT_S)   # a dump that hangs must not hang this one
    try:
        if reason == "exception" and "reason" not in _FIRST:
            _FIRST.update(reason=reason, error=error)
        elif "reason" in _FIRST:
            reason, error = _FIRST["reason"] or reason, _FIRST["error"]
        return _dump(run, rank, reason, error)
    finally:
        if held:
            _DUMP_LOCK.release()


def _dump(run: pathlib.Path, rank: int, reason: str, error: str | None) -> pathlib.Path:
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
    try:        # PyTorch's own format too, where its variable asks for it (write_torch_dump)
        write_torch_dump(rank)
    except Exception as e:  # noqa: BLE001 - report, don't mask
        print(f"meshscope: rank {rank}: PyTorch's Flight Recorder dump not written: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
    return path


# -- the typed records a dump is checked against ---------------------------------------------

Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)]


class Frame(msgspec.Struct, gc=False):
    """One Python frame of the stack an operation was issued from (the dump's ``frames``)."""
    name: str | None = None
    filename: str | None = None
    line: Count | None = None


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
    frames: list[Frame] | None = None


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


def load_pickle_dump(path: pathlib.Path, *, mapped: bool = False) -> dict:
    """A PyTorch Flight Recorder pickle, loaded as plain data only and checked against
    ``TorchDump``; ``UnsafePickleError`` naming the file otherwise. ``mapped``: an older
    format version's fields mapped onto today's first (``fr_forms.normalise``; ``RunDirError``
    naming the file, the field and the version where they cannot be)."""
    path = pathlib.Path(path)
    try:
        raw = path.read_bytes()
        obj = plain_pickle.loads(raw, int_keys=mapped)
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{path}: {e}") from None
    except OSError as e:
        raise UnsafePickleError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(obj, dict):
        raise UnsafePickleError(f"{path}: expected a dict at the top level")
    if mapped:
        fr_forms.normalise(obj, path)
    try:
        _typed(obj, TorchDump, path, "Flight Recorder pickle")
    except RunDirError as e:
        raise UnsafePickleError(str(e)) from None
    return obj


# -- PyTorch's own dump files ----------------------------------------------------------------

# Where PyTorch writes a rank's dump (``<prefix><rank>``, a pickle): NCCL's watchdog on a
# timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``) and ``torchfrtrace``'s reader take the prefix from
# these variables (the second is the older name); NCCL's default is /tmp/nccl_trace_rank_.
TORCH_DUMP_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
def torch_dump_prefix() -> str | None:
    """The dump prefix PyTorch's variables name (``TORCH_DUMP_ENV``), None when unset."""
    for var in TORCH_DUMP_ENV:
        value = os.environ.get(var, "").strip()
        if value:
            return value
    return None


def write_torch_dump(rank: int) -> pathlib.Path | None:
    """This rank's buffer in PyTorch's own format — the pickle of ``_dump_fr_trace()``, the
    bytes NCCL's watchdog writes on a timeout — at ``<prefix><rank>`` when
    ``TORCH_FR_DUMP_TEMP_FILE`` names a prefix (gloo writes none of its own); None otherwise.
    Written through a temporary file and a rename."""
    prefix = torch_dump_prefix()
    if prefix is None:
        return None
    import torch._C._distributed_c10d as c10d

    raw = c10d._dump_fr_trace()
    path = pathlib.Path(f"{prefix}{rank}")
    path.parent.mkdir(parents=True, exist_ok=True)
    # One temporary file per writing thread (mode as the umask says).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(raw)
    os.replace(tmp, path)
    return path


def read_torch_dump(path: pathlib.Path, rank: int, form: str) -> Dump:
    """One of PyTorch's own dumps (a pickle, or its JSON form: ``form``) as the ``Dump`` of
    ``rank`` (the rank its file name gives: PyTorch's dumps do not hold it), checked like
    ``read_dump``'s: at most ``schema.MAX_BYTES`` bytes, plain data only (a pickle is read by
    ``load_pickle_dump``: nothing in it is executed), every field the analysis reads typed.
    ``UnsafePickleError`` for a pickle that is not plain data, ``RunDirError`` naming the file,
    the field and the problem otherwise (both ``ValueError``)."""
    path = pathlib.Path(path)
    what = "Flight Recorder dump"
    if form == "pickle" and fr_forms.sniff(path) == "json":    # TorchComms' dump_json, saved
        form = "json"                                          # under a name of its own
    if not 0 <= rank < MAX_WORLD_SIZE:
        raise RunDirError(f"{path}: its name gives rank {rank}, beyond any job "
                          f"({MAX_WORLD_SIZE:,} ranks at most)")
    if form == "json":
        raw = schema.read_bytes(path, what)
        try:
            fr = _TORCH_DECODER.decode(raw)
            if fr.version is None or (fr_forms.version_of({"version": fr.version}) or
                                      (9, 0))[0] > fr_forms.NEWEST_MAJOR:
                raise msgspec.DecodeError("a version to check")
        except (msgspec.DecodeError, RecursionError):
            data = schema.read_document(path, what, raw)
            if not isinstance(data, dict):
                raise RunDirError(f"{path}: $: expected PyTorch's Flight Recorder dump (an "
                                  f"object), got {schema.short(data)}") from None
            fr = _typed(fr_forms.normalise(data, path), TorchDump, path, f"PyTorch {what}")
    else:
        try:
            size = path.stat().st_size
        except OSError as e:
            raise RunDirError(f"{path}: cannot read ({e.strerror})") from None
        if size > schema.MAX_BYTES[what]:
            raise RunDirError(f"{path}: {size:,} bytes, larger than any {what} "
                              f"({schema.MAX_BYTES[what] >> 20} MiB at most)")
        fr = _typed(load_pickle_dump(path, mapped=True), TorchDump, path, f"PyTorch {what}")
    for e in fr.entries:            # PyTorch writes 0 where the backend measured nothing
        for key in EMPTY_WHEN_ZERO:
            if getattr(e, key) == 0:
                setattr(e, key, None)
    return Dump(schema_version=FR_SCHEMA_VERSION, rank=rank, flight_recorder=fr)


_TORCH_DECODER = msgspec.json.Decoder(TorchDump)


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
