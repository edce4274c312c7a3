"""Parquet cache of per-rank event tables, keyed by the trace file's content.

An entry is two files: ``<cache_dir>/<key>.parquet``, the Arrow event table of
``analysis/ingest/event_table.py``, and ``<key>.memory.parquet``, the trace's ``[memory]`` events
(``analysis/ingest/memory_events.py``; written first, so an event table in place always has
it). The event table carries the trace's metadata (every top-level key but ``traceEvents``) stored
as JSON under the key ``meshscope.meta`` of the parquet file's key-value metadata, so table and
metadata are written and replaced together; the table's own schema metadata (what ingest dropped
or ignored as damaged, ``event_table.DAMAGE_KEY``) is kept beside it, so a cached load reports the
same problems as the first. ``key`` is the BLAKE2b hash (160 bits) of the file's
bytes as read — a ``.json.gz`` as stored, a plain ``.json`` as compressed while it is read
(``trace_file.read_bytes``) — and of the ingest settings that change the table, so a
trace edited in place, or read with another ``--comm-kernel-regex``, gets a new entry. The
file name, and so the rank taken from it, is not part of the key: the rank is worked out again
on every load.

``meshscope analyze`` keeps its cache in ``<report dir>/.cache/`` (``--no-cache`` skips it);
deleting that folder is always safe. A cache that cannot be written (read-only folder, full
disk) or an entry that cannot be read is ignored: the trace is parsed again. An entry is
written to a temporary file in the same folder, flushed to the disk, renamed into place and the
folder flushed too (``write``), so a crash leaves the old entry, the new one or none — never a
renamed file whose content was not yet on the disk.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from meshscope.collectors.run_dir import fsync_path

META_KEY = b"meshscope.meta"


def key(raw: bytes, settings: str) -> str:
    h = hashlib.blake2b(raw, digest_size=20)
    h.update(b"\0" + settings.encode())
    return h.hexdigest()


def entry(cache_dir: pathlib.Path, k: str) -> pathlib.Path:
    return pathlib.Path(cache_dir) / f"{k}.parquet"


def memory_entry(cache_dir: pathlib.Path, k: str) -> pathlib.Path:
    """The entry's ``[memory]`` events table (``memory_events.py``), beside it."""
    return pathlib.Path(cache_dir) / f"{k}.memory.parquet"


def read(cache_dir: pathlib.Path, k: str) -> tuple[pa.Table, pa.Table, dict] | None:
    """(table, memory table, metadata) of entry ``k``, or None when there is none usable."""
    path = entry(cache_dir, k)
    if not path.is_file():
        return None
    try:
        table = pq.read_table(path)
        meta = json.loads((table.schema.metadata or {})[META_KEY])
        memory = pq.read_table(memory_entry(cache_dir, k))
    except (OSError, KeyError, ValueError, RecursionError, pa.ArrowException):
        return None
    kept = {k: v for k, v in (table.schema.metadata or {}).items()
            if k.startswith(b"meshscope.") and k != META_KEY}
    return table.replace_schema_metadata(kept or None), memory, meta


def _write_one(cache_dir: pathlib.Path, table: pa.Table, dest: pathlib.Path) -> None:
    """``table`` as ``dest``, atomically and durably (a temporary file flushed to the disk,
    renamed into place)."""
    tmp = cache_dir / f".tmp-{os.getpid()}-{uuid.uuid4().hex}.parquet"
    try:
        pq.write_table(table, tmp)
        fsync_path(tmp)
        os.replace(tmp, dest)
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def write(cache_dir: pathlib.Path, k: str, table: pa.Table, meta: dict, *,
          memory: pa.Table) -> pathlib.Path | None:
    """Store an entry atomically and durably: the memory table first, then the event table
    (each a temporary file flushed to the disk and renamed into place), then the folder
    flushed — an event table in place always has its memory table beside it; None on
    failure."""
    cache_dir = pathlib.Path(cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        _write_one(cache_dir, memory, memory_entry(cache_dir, k))
        stored = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                META_KEY: json.dumps(meta).encode()})
        _write_one(cache_dir, stored, entry(cache_dir, k))
        fsync_path(cache_dir)
        return entry(cache_dir, k)
    except (OSError, ValueError, TypeError, RecursionError, pa.ArrowException):
        return None
