"""Read one rank's Kineto trace (``.json`` or ``.json.gz``) into an event table.

``load_trace`` returns a ``RankTrace``: the rank, the trace's metadata (every top-level key but
``traceEvents``, and ``FORMAT_KEY``: what was read, ``read_format``), ``notes`` (how it was
read, when that is not today's Kineto trace), and ``events``, a DataFrame with one row per
complete event (``ph == "X"``, or a ``B``/``E`` pair), in file order, whose columns are
documented with their schema in ``analysis/ingest/event_table.py``.

Every generation of the format is read into this one table, so that nothing downstream
(classification, timeline, instances) knows which it was: a trace of **PyTorch 1.8** (the first
Kineto traces) has its categories renamed to today's, **``B``/``E`` pairs** are read as
complete events (both: ``analysis/ingest/batch_columns.py``), and **a bare JSON array** of
events (Chrome's JSON Array Format, its closing ``]`` optional) is a trace without metadata
(``json_stream.py``, ``trace_file.py``).

Which it was is in ``meta[FORMAT_KEY]`` and a line of ``notes``. A trace that nothing names a
rank (no ``distributedInfo``, no rank in its name, no ``--rank-regex``: ``rank_naming.py``) is
read as rank 0, ``meta[RANKLESS_KEY]`` set and a note added; ``report.inputs.resolve_identities``
refuses it when it is not the only trace. A trace in which nothing is understood — no event that
is compute, communication or memory (``UNDERSTOOD_KINDS``) — is refused (``InputError``, naming
its categories), never read as a rank that did nothing.

How it is read: the file's bytes are read (``trace_file.read_bytes``), inflated and cut into
batches of events on the fly (``analysis/ingest/json_stream.py``), so the whole text of a trace
is never in memory; each batch is decoded with msgspec into small typed structs
(``analysis/ingest/decode.py``), its columns are built at once
(``analysis/ingest/batch_columns.py``), and classification runs once per distinct (name,
category). Every ``CONSOLIDATE_BYTES`` of batches (``analysis/ingest/accumulator.py``), their
columns are joined into one chunk each, the string columns dictionary-encoded and the chunk's
``kind`` classified, and the memory the C library's allocator then holds free is given back
(``allocator.py``): the memory of the batches is reused by the next ones, and a rank's peak is
its table plus bounded buffers (``tests/test_memory_relation.py``). The frame is made column by
column, each Arrow column freed as it is converted (``event_table.to_frame``). A large trace
analysed alone is read on every core instead (``analysis/ingest/parts.py``): cut into parts
that worker processes read with this same code (``accumulator.Accumulator``, one per part),
joined in file order (``Accumulator.merge``) into the same table. A file that cannot be
streamed (an unusual layout, or damage) is read whole instead (``trace_file.py``), which also
names what is wrong with it. With ``cache_dir``, the table is stored as parquet under
``<cache_dir>/<key>.parquet`` with the metadata as JSON in the file's key-value metadata
(``analysis/ingest/cache.py``); the key is the BLAKE2b hash of the file's bytes plus the ingest
version and the ``comm_kernel_re`` pattern, so an edited trace or a different pattern is never
served from a stale entry. The rank is not cached: it is worked out on every load.

Damaged input (docs/damaged-input.md): every field is typed where it is read. An event whose
fields are unusable is dropped and an unusable argument ignored on its event
(``batch_columns.py``); an element of ``traceEvents`` that is not an object, that holds a number
beyond the decoder's range or is nested deeper than its limit is dropped (``decode.py``); an
event whose start or duration is impossible for the trace as a whole
(``validate.event_bounds``) is dropped as the table is finished (``Accumulator.finish``). Each
is counted (``validate.Damage``, kept with the table, in the cache too) and becomes one line of
``RankTrace.problems`` per kind: the file, the field, how many events, why. A trace that loses
more than ``validate.MAX_DROPPED_SHARE`` of its events is refused (``InputError``). The
metadata the analysis reads is checked by ``validate.trace_meta``.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Callable, Iterable

import msgspec
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from meshscope.analysis.ingest import accumulator
from meshscope.analysis.ingest import allocator
from meshscope.analysis.ingest import batch_columns
from meshscope.analysis.ingest import classify
from meshscope.analysis.ingest import decode
from meshscope.analysis.ingest import event_table
from meshscope.analysis.ingest import json_stream
from meshscope.analysis.ingest import memory_events
from meshscope.analysis.ingest import rank_naming
from meshscope.analysis.ingest import trace_file
from meshscope.analysis.ingest import cache as trace_cache
from meshscope.analysis.ingest import validate
from meshscope.analysis.ingest.validate import Damage
from meshscope.analysis.ingest import budgets as _budgets
from meshscope.analysis.ingest.budgets import BudgetExceeded
from meshscope.analysis.errors import InputError

# Bump when the table's columns or their meaning change: it is part of the cache key.
# (5: impossible events are dropped and counted, no longer clamped. 6: PyTorch 1.8 categories,
# B/E pairs and bare arrays are read; the format read is in the metadata. 7: matrix
# multiplications keep their shapes in call_args. 8: name, cat, lane and kind are
# dictionary-encoded. 9: so are the collective metadata's strings and call_args. 10: the
# allocator's [memory] events are read into their own table, cached beside the events.
# 11: and damage names each ProfilerStep range dropped. 12: events with no known phase are
# dropped and counted, events without pid/tid counted.)
INGEST_VERSION = 12
BATCH_EVENTS = 8192             # events per batch when a trace is read whole
BATCH_BYTES = 1 << 19           # text per batch when it is streamed (fastest on a 54 MB trace)
# How many times a trace's JSON was parsed in this process (a cache hit does not parse).
PARSE_COUNT = 0

# Key of ``RankTrace.meta`` that says what was read (``read_format``), and the key that marks a
# trace read as rank 0 because nothing gave it a rank (``load_trace``).
FORMAT_KEY = "meshscope_format"
RANKLESS_KEY = "meshscope_rankless"
UNDERSTOOD_KINDS = (classify.COMPUTE, classify.COMMUNICATION, classify.MEMORY)


@dataclasses.dataclass
class RankTrace:
    path: pathlib.Path
    rank: int
    events: pd.DataFrame
    meta: dict
    # One line per kind of damage met reading the file: the file, the field, how many events,
    # why (``validate.Damage.lines``, ``validate.trace_meta``).
    problems: list[str] = dataclasses.field(default_factory=list)
    # One line per thing a reader of the report should know about how the file was read: an
    # older format, a bare array, B/E pairs, a rank assumed (``read_format``, ``load_trace``).
    notes: list[str] = dataclasses.field(default_factory=list)
    # The allocator's [memory] events, one row each (``memory_events.py``): empty for a trace
    # recorded without ``profile_memory``.
    memory: pd.DataFrame = dataclasses.field(default_factory=memory_events.empty)
    # What ingest dropped or ignored, by field and reason (``validate.Damage``): the trust
    # checks count it (``analysis/trust/rank_checks.py``).
    damage: Damage = dataclasses.field(default_factory=Damage)

    @property
    def on_gpu(self) -> bool:
        return bool(self.events["device"].any())


# Key of the event table's schema metadata under which what was met reading it is kept
# (``_read_info``).
READ_KEY = b"meshscope.read"


def parse_events(batches: Iterable[list[decode.Event]], *,
                 comm_kernel_re: re.Pattern | None = None) -> pa.Table:
    """The event table (``event_table.py``) of batches of decoded events, as an Arrow table;
    what was dropped or ignored is in its schema metadata under ``event_table.DAMAGE_KEY``
    (``event_table.damage_of``). ``parse_trace`` gives the ``[memory]`` events' table too."""
    return parse_trace(batches, comm_kernel_re=comm_kernel_re)[0]


def parse_trace(batches: Iterable[list[decode.Event]], *,
                comm_kernel_re: re.Pattern | None = None) -> tuple[pa.Table, pa.Table]:
    """(event table, memory table): the event table of ``parse_events`` and the allocator's
    ``[memory]`` events (``memory_events.py``); what was dropped or ignored of either is in
    the event table's damage.

    Arrow allocates through the C library's allocator meanwhile: the many short-lived
    per-batch arrays made pyarrow's default (mimalloc) pool hold ~40 MB more at the peak of a
    216k-event trace.
    """
    with allocator.system_allocator():
        return _parse_events(batches, comm_kernel_re)


def _read_info(table: pa.Table) -> dict:
    """What was met making ``table``: ``legacy`` (PyTorch 1.8 category → events), ``pairs``
    (B/E pairs read as complete events; ``parse_events``) and ``layout`` (``array`` for a bare
    array of events, else absent; ``_parse``)."""
    text = (table.schema.metadata or {}).get(READ_KEY)
    return json.loads(text) if text else {"legacy": {}, "pairs": 0}


def _parse_events(batches: Iterable[list[decode.Event]], comm_kernel_re: re.Pattern | None
                  ) -> tuple[pa.Table, pa.Table]:
    table = _parse_events_of(batches, comm_kernel_re, reading := batch_columns.Reading())
    if reading.legacy or reading.pairs:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               READ_KEY: reading.to_json()})
    return table, reading.memory_table


def _parse_events_of(batches: Iterable[list[decode.Event]], comm_kernel_re: re.Pattern | None,
                     reading: batch_columns.Reading) -> pa.Table:
    acc = accumulator.Accumulator(comm_kernel_re, reading)
    for evs in batches:
        acc.add(evs)
    return acc.finish()


def _with_layout(table: pa.Table, layout: str | None) -> pa.Table:
    """``table`` with the file's layout (``object``, ``array``) among what was read."""
    if layout in (None, "object"):
        return table
    info = {**_read_info(table), "layout": layout}
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          READ_KEY: json.dumps(info).encode()})


def read_format(table: pa.Table) -> dict:
    """What was read (``RankTrace.meta[FORMAT_KEY]``): ``name``, ``kineto`` or ``pytorch-1.8``
    (its categories were renamed), with ``+json-array`` for a bare array of events and
    ``+B/E`` when duration pairs were read; ``layout`` (``object`` or ``array``),
    ``legacy_categories`` (PyTorch 1.8 category → events) and ``be_pairs``."""
    info = _read_info(table)
    layout = info.get("layout", "object")
    name = "pytorch-1.8" if info["legacy"] else "kineto"
    name += "+json-array" if layout == "array" else ""
    name += "+B/E" if info["pairs"] else ""
    return {"name": name, "layout": layout,
            "legacy_categories": info["legacy"], "be_pairs": info["pairs"]}


def format_notes(path: pathlib.Path, fmt: dict) -> list[str]:
    """A line per way in which the file was not today's Kineto trace (``read_format``)."""
    if not isinstance(fmt, dict):
        return []
    out = []
    legacy = fmt.get("legacy_categories") or {}
    if legacy:
        renamed = ", ".join(f"{c} as {batch_columns.LEGACY_CATEGORIES.get(c, c)}"
                            for c in sorted(legacy))
        out.append(f"{path}: read as a PyTorch 1.8 trace (categories {renamed}; its "
                   f"ProfilerStep, DataLoader and Optimizer ranges as user annotations)")
    if fmt.get("layout") == "array":
        out.append(f"{path}: read as a bare JSON array of events (Chrome's JSON Array "
                   f"Format): the trace has no metadata")
    if fmt.get("be_pairs"):
        n = fmt["be_pairs"]
        out.append(f"{path}: {n:,} duration event{'s' * (n != 1)} written as B/E pairs, "
                   f"read as complete events")
    return out


# The reader of one large trace in parts on worker processes, while ``parts.on_cores`` is in
# force (it sets this and unsets it on leaving; ``analysis/ingest/parts.py``): (path, bytes,
# collective-kernel pattern) → (event table, memory table, metadata, layout), or None when the
# trace is to be read here as one stream. None: every trace is read as one stream.
PartsReader = Callable[[pathlib.Path, bytes, "re.Pattern | None"],
                       "tuple[pa.Table, pa.Table, dict, str | None] | None"]
parts_reader: PartsReader | None = None


def _parse(path: pathlib.Path, raw: bytes, comm_kernel_re: re.Pattern | None,
           batch_bytes: int | None = None) -> tuple[pa.Table, pa.Table, dict]:
    """(event table, memory table, metadata): streamed (``json_stream``, ``batch_bytes`` of
    text per batch, default ``BATCH_BYTES``), or, for a file that cannot be streamed,
    decompressed whole and split with msgspec (which also names what is wrong with a damaged
    file). The metadata holds what was read under ``FORMAT_KEY`` (``read_format``)."""
    in_parts = parts_reader(path, raw, comm_kernel_re) if (
        batch_bytes is None and parts_reader is not None) else None
    if in_parts is not None:    # else read as one stream, below: its table or its refusal
        table, memory, meta, layout = in_parts
        table = _with_layout(table, layout)
        return table, memory, {**meta, FORMAT_KEY: read_format(table)}
    stream = json_stream.EventStream(raw, decode.decode, batch_bytes=batch_bytes or BATCH_BYTES)
    try:
        try:
            table, memory = parse_trace(stream.batches(), comm_kernel_re=comm_kernel_re)
            table = _with_layout(table, stream.layout)
            meta = stream.meta
        except json_stream.Fallback:
            table, memory, meta = _parse_whole(path, raw, comm_kernel_re)
    except BudgetExceeded as e:
        raise InputError(path, str(e)) from None
    return table, memory, {**meta, FORMAT_KEY: read_format(table)}


def _parse_whole(path: pathlib.Path, raw: bytes, comm_kernel_re: re.Pattern | None = None,
                 batch_events: int = BATCH_EVENTS) -> tuple[pa.Table, pa.Table, dict]:
    """The whole-file reader: decompress, split with msgspec, parse ``batch_events`` at a time
    (the event table, the memory table and the metadata)."""
    data = trace_file.decompress(path, raw)
    meta, raws, meta_damage = trace_file.split(path, data)
    layout = "object" if meta is not None else "array"
    meta = meta if meta is not None else {}
    del data
    batches = (decode.decode(b"[" + b",".join(raws[i:i + batch_events]) + b"]")
               for i in range(0, len(raws), batch_events))
    try:
        table, memory = parse_trace(batches, comm_kernel_re=comm_kernel_re)
    except msgspec.DecodeError as e:
        raise InputError(path, trace_file.json_problem(e)) from None
    if meta_damage:
        damage = event_table.damage_of(table)
        damage.update(meta_damage)
        table = event_table.with_damage(table, damage)
    return _with_layout(table, layout), memory, meta


def _cache_key(raw: bytes, comm_kernel_re: re.Pattern | None) -> str:
    """The cache key of a trace read with these settings. Budgets other than the defaults are
    part of it: a budget refuses a trace while it is read, so a table cached under other
    budgets is never taken in place of that reading (a cached trace read again with a lower
    ``--max-events`` is refused as the first reading would have been)."""
    extra = f"v{INGEST_VERSION}" + (f"|{comm_kernel_re.pattern}" if comm_kernel_re else "")
    budget = _budgets.non_default(_budgets.current())
    if budget is not None:
        extra += "|budgets " + ",".join(f"{k}={v}" for k, v in sorted(budget.items()))
    return trace_cache.key(raw, extra)


def _strings(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A name column as plain strings (for the few checks that read the values)."""
    return column.cast(pa.large_string()) if pa.types.is_dictionary(column.type) else column


def _usable(path: pathlib.Path, table: pa.Table, damage: Damage, memory_rows: int = 0) -> None:
    """InputError when the trace has no complete event left, lost more than
    ``validate.MAX_DROPPED_SHARE`` of them to damage (its numbers would be bent), or holds
    nothing that is understood: no event that is compute, communication or memory
    (``UNDERSTOOD_KINDS``; only annotations or unknown categories), which would make an
    all-zero report."""
    dropped, kept = damage.dropped, table.num_rows
    why = damage.summary()
    if kept == 0:
        memory_rows = 0
        raise InputError(path, "the trace has no complete ('X', or 'B'/'E' pair) events" +
                         (f" left: {why}" if dropped else ""))
    kept += memory_rows                 # the [memory] events kept count as kept events
    if dropped > validate.MAX_DROPPED_SHARE * (dropped + kept):
        raise InputError(path, f"too damaged to analyse: {dropped:,} of {dropped + kept:,} "
                               f"events unusable; {why}")
    # The kinds present, from the codes (a cast of the whole column to strings cost 16 bytes
    # an event at the peak of a load).
    if not set(pc.unique(table.column("kind")).to_pylist()) & set(UNDERSTOOD_KINDS):
        counts = sorted(((c["counts"], c["values"] or "(none)")
                         for c in pc.value_counts(_strings(table.column("cat"))).to_pylist()),
                        key=lambda nc: (-nc[0], nc[1]))
        shown = ", ".join(f"{c} ({n:,})" for n, c in counts[:6])
        more = f" and {len(counts) - 6} more" if len(counts) > 6 else ""
        raise InputError(path, f"nothing in it was understood: none of its {kept:,} events is "
                               f"an operator, kernel or memcpy: categories {shown}{more}")


def load_trace(path: pathlib.Path, *, comm_kernel_re: re.Pattern | None = None,
               rank_regex: re.Pattern | str | None = None,
               cache_dir: pathlib.Path | None = None) -> RankTrace:
    """One rank's trace as a ``RankTrace``; ``InputError`` naming the file when unusable.

    ``rank_regex``: see ``rank_naming.rank_of``. ``cache_dir``: where parquet copies of event
    tables are kept (created on first use; a cache that cannot be read or written is ignored).
    ``problems``: one line per kind of damage met (module docstring).
    """
    global PARSE_COUNT
    path = pathlib.Path(path)
    raw = trace_file.read_bytes(path)
    key = _cache_key(raw, comm_kernel_re) if cache_dir is not None else None
    hit = trace_cache.read(cache_dir, key) if key else None
    if hit is not None:
        table, memory, meta = hit
    else:
        PARSE_COUNT += 1
        table, memory, meta = _parse(path, raw, comm_kernel_re)
        del raw
        if key and table.num_rows:
            trace_cache.write(cache_dir, key, table, meta, memory=memory)
    damage = event_table.damage_of(table)
    _usable(path, table, damage, memory.num_rows)
    meta, meta_problems = validate.trace_meta(meta)
    problems = damage.lines(path) + [f"{path}: {p}" for p in meta_problems]
    notes = format_notes(path, meta.get(FORMAT_KEY))
    rank, info = (rank_naming.rank_of(path, meta, rank_regex, missing_ok=True),
                  validate.info_rank(meta))
    if rank is None:
        # Nothing names a rank: rank 0, if it is the only trace (the analysis refuses several
        # such files: ``report.inputs.resolve_identities``).
        rank, meta[RANKLESS_KEY] = 0, True
        notes.append(f"{path}: no rank in the trace (no distributedInfo.rank) nor in its file "
                     f"name: read as rank 0, the only trace")
    else:
        meta.pop(RANKLESS_KEY, None)
    if info is not None and rank != info:
        problems.append(f"{path}: distributedInfo.rank is {info}, but its name says rank "
                        f"{rank} (--rank-regex): read as rank {rank}")
    # The table's only reference is handed over, so that each column is freed as it is
    # converted (``event_table.to_frame``): the cache hit's tuple and this function's name let
    # it go.
    owned, hit = [table], None
    del table
    return RankTrace(path=path, rank=rank, events=event_table.to_frame(owned, release=True),
                     meta=meta, problems=problems, notes=notes, damage=damage,
                     memory=memory_events.to_frame(memory))
