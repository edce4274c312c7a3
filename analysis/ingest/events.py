"""Read one rank's Kineto trace (``.json`` or ``.json.gz``) into an event table.

``load_trace`` returns a ``RankTrace``: the rank, the trace's metadata (every top-level key but
``traceEvents``, and ``FORMAT_KEY``: what was read, ``read_format``), ``notes`` (how it was
read, when that is not today's Kineto trace), and ``events``, a DataFrame with one row per
complete event (``ph == "X"``, or a ``B``/``E`` pair), in file order (a pair where its ``E`` is):

=========== ======== ============================================================
column      dtype    meaning
=========== ======== ============================================================
name        category event name (the frame's ten string columns are pandas
                     categoricals: codes into their sorted distinct values, missing
                     where null, ``CATEGORICAL``; dictionary-encoded in the Arrow
                     table and its cache, ``NAMES``)
cat         category Kineto category as today's profiler names it (``cpu_op``,
                     ``kernel``, ``user_annotation``…; PyTorch 1.8's renamed, below)
ts_us       float    start, µs on the trace's clock
dur_us      float    duration, µs
lane        category ``gpu:<device>:<stream>`` for device events, ``cpu:<pid>:<tid>`` else
device      bool     True for GPU kernels / memcpy / memset
kind        category one of ``classify.KINDS``
correlation int      launch correlation id linking a GPU event to its CPU runtime
                     call (``cuda_runtime`` / ``cuda_driver``); -1 where absent
end_us      float    ts_us + dur_us
coll_name   category collective name as the trace spells it (``allreduce``,
                     ``_allgather_base``, ``all_reduce`` from ``gloo:all_reduce``);
                     null on events that carry no collective metadata
in_nelems   Int64    input elements (``In msg nelems``, or ``Input Dims`` of a
                     ``gloo:``/``nccl:`` range); null where unknown
out_nelems  Int64    output elements (``Out msg nelems``); null where unknown
dtype       category element type, canonical torch name (``float32``, ``bfloat16``);
                     the trace's spelling when unknown
pg_name     category process group name (``"0"``, ``"3"``)
pg_desc     category process group description (``default_pg``, ``mesh_tp``…)
pg_ranks    category global ranks of the group, comma-separated (``"0,1"``)
group_size  Int64    ranks in the group (``Group size``, else the count of pg_ranks)
seq         int      the collective's sequence number in its group (``Seq``); -1
                     where absent
msg_bytes   Int64    bytes S of the collective as nccl-tests defines them:
                     max(in_nelems, out_nelems) × element size; for ranges with only
                     ``Input Dims``, the input tensor's bytes
call_args   category on ``c10d::`` calls and matrix multiplications (``aten::mm``,
                     ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``) only: their
                     recorded arguments as JSON text, ``{"dims": Input Dims, "types":
                     Input type, "scalars": Concrete Inputs}`` (the peer of a send/recv,
                     the output and input buffers of an all_to_all:
                     ``analysis/comm/instances.py``; a GEMM's shapes:
                     ``analysis/gpu/kernels.py``); null elsewhere
=========== ======== ============================================================

Where the collective metadata comes from is spelled out in ``analysis/ingest/comm_meta.py``.

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
category). Every ``CONSOLIDATE_BYTES`` of batches, their columns are joined into one chunk
each, the string columns dictionary-encoded and the chunk's ``kind`` classified
(``_consolidate``), and the memory the C library's allocator then holds free is given back
(``_trim``): the memory of the batches is reused by the next ones, and a rank's peak is its
table plus bounded buffers (``tests/test_memory_relation.py``). The frame is made column by
column, each Arrow column freed as it is converted (``to_frame``). A large trace analysed alone
is read on every core instead (``analysis/ingest/parts.py``): cut into parts that worker
processes read with this same code (``Accumulator``, one per part), joined here in file
order (``Accumulator.merge``) into the same table. A file that cannot be streamed (an unusual
layout, or damage) is read whole instead (``trace_file.py``), which also names what is wrong
with it. With ``cache_dir``, the table is stored as parquet under ``<cache_dir>/<key>.parquet``
with the metadata as JSON in the file's key-value metadata (``analysis/ingest/cache.py``); the
key is the BLAKE2b hash of the file's bytes plus the ingest version and the ``comm_kernel_re``
pattern, so an edited trace or a different pattern is never served from a stale entry. The
rank is not cached: it is worked out on every load.

Damaged input (docs/damaged-input.md): every field is typed where it is read. An event whose
fields are unusable is dropped and an unusable argument ignored on its event
(``batch_columns.py``); an element of ``traceEvents`` that is not an object, that holds a number
beyond the decoder's range or is nested deeper than its limit is dropped (``decode.py``); an
event whose start or duration is impossible for the trace as a whole
(``validate.event_bounds``) is dropped here. Each is counted (``validate.Damage``, kept with the
table, in the cache too) and becomes one line of ``RankTrace.problems`` per kind: the file, the
field, how many events, why. A trace that loses more than ``validate.MAX_DROPPED_SHARE`` of its
events is refused (``InputError``). The metadata the analysis reads is checked by
``validate.trace_meta``.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import pathlib
import re
from typing import Callable, Iterable

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from meshscope.analysis.ingest import batch_columns
from meshscope.analysis.ingest import classify
from meshscope.analysis.ingest import comm_meta
from meshscope.analysis.ingest import decode
from meshscope.analysis.ingest import json_stream
from meshscope.analysis.ingest import memory_events
from meshscope.analysis.ingest import rank_naming
from meshscope.analysis.ingest import trace_file
from meshscope.analysis.ingest import cache as trace_cache
from meshscope.analysis.ingest import validate
from meshscope.analysis.ingest.dictionaries import joined_codes as _joined_codes
from meshscope.analysis.ingest.dictionaries import one_dictionary as _one_dictionary
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
CONSOLIDATE_BYTES = 8 << 20    # a rank's batches are joined into column chunks this large
# How many times a trace's JSON was parsed in this process (a cache hit does not parse).
PARSE_COUNT = 0

# Key of ``RankTrace.meta`` that says what was read (``read_format``), and the key that marks a
# trace read as rank 0 because nothing gave it a rank (``load_trace``).
FORMAT_KEY = "meshscope_format"
RANKLESS_KEY = "meshscope_rankless"
UNDERSTOOD_KINDS = (classify.COMPUTE, classify.COMMUNICATION, classify.MEMORY)

_NULLABLE_INT = ("in_nelems", "out_nelems", "group_size", "msg_bytes")
# The string columns are dictionary-encoded in the Arrow table and its cache (int32 codes into
# the distinct values: a trace has hundreds of names among millions of events, and the
# collective metadata and call_args are null on all but a few), pandas categoricals in the
# frame (``to_frame``).
NAMES = pa.dictionary(pa.int32(), pa.large_string())
SCHEMA = pa.schema([
    ("name", NAMES), ("cat", NAMES), ("ts_us", pa.float64()),
    ("dur_us", pa.float64()), ("lane", NAMES), ("device", pa.bool_()),
    ("kind", NAMES), ("correlation", pa.int64()), ("end_us", pa.float64()),
    ("coll_name", NAMES), ("in_nelems", pa.int64()), ("out_nelems", pa.int64()),
    ("dtype", NAMES), ("pg_name", NAMES), ("pg_desc", NAMES), ("pg_ranks", NAMES),
    ("group_size", pa.int64()), ("seq", pa.int64()), ("msg_bytes", pa.int64()),
    ("call_args", NAMES),
])


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

    @property
    def on_gpu(self) -> bool:
        return bool(self.events["device"].any())


class _Kinds:
    """``classify.classify`` of a chunk's events as a dictionary array (``kind``): once per
    distinct (name, category) pair of the chunk, each pair's label remembered from chunk to
    chunk."""

    def __init__(self, comm_kernel_re: re.Pattern | None):
        self.comm_kernel_re = comm_kernel_re
        self.labels: dict[tuple[str, str], str] = {}

    def __call__(self, name: pa.DictionaryArray, cat: pa.DictionaryArray) -> pa.DictionaryArray:
        n_idx = name.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        c_idx = cat.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        pairs, inverse = np.unique(n_idx * len(cat.dictionary) + c_idx, return_inverse=True)
        del n_idx, c_idx
        names, cats = name.dictionary.to_pylist(), cat.dictionary.to_pylist()
        ncat = len(cats)
        labels = []
        for p in pairs.tolist():
            key = (names[p // ncat], cats[p % ncat])
            label = self.labels.get(key)
            if label is None:
                label = self.labels[key] = classify.classify(
                    key[0], key[1], comm_kernel_re=self.comm_kernel_re)
            labels.append(label)
        codes: dict[str, int] = {}
        of_pair = np.array([codes.setdefault(label, len(codes)) for label in labels],
                           dtype=np.int32)
        indices = of_pair[inverse.reshape(-1)] if len(of_pair) else np.zeros(0, dtype=np.int32)
        return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()),
                                              pa.array(list(codes), pa.large_string()))


def _meta_columns(n: int, found: list[tuple[int, dict]]) -> dict[str, pa.Array]:
    """Collective metadata columns: null (``seq``: -1) except at the rows in ``found``; the
    strings dictionary-encoded (``NAMES``)."""
    found = sorted(found, key=lambda item: item[0])
    rows = np.array([i for i, _ in found], dtype=np.int64)
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    mask = pa.array(mask)
    out = {}
    for col in comm_meta.COLUMNS:
        kind = SCHEMA.field(col).type
        values = [m[col] for _, m in found]
        if pa.types.is_dictionary(kind):
            out[col] = _sparse_strings(n, rows, values)
            continue
        base = pa.array(np.full(n, -1, dtype=np.int64)) if col == "seq" else pa.nulls(n, kind)
        out[col] = pc.replace_with_mask(base, mask, pa.array(values, kind)) if found else base
    return out


def _sparse_strings(n: int, rows: np.ndarray, values: list) -> pa.DictionaryArray:
    """A dictionary-encoded column of ``n`` rows, null but at ``rows`` (``values``, str or
    None)."""
    codes: dict[str, int] = {}
    indices = np.full(n, -1, dtype=np.int32)
    indices[rows] = [-1 if v is None else codes.setdefault(v, len(codes)) for v in values]
    missing = indices < 0
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32(), mask=missing),
                                          pa.array(list(codes), pa.large_string()))


DAMAGE_KEY = b"meshscope.damage"
READ_KEY = b"meshscope.read"


def parse_events(batches: Iterable[list[decode.Event]], *,
                 comm_kernel_re: re.Pattern | None = None) -> pa.Table:
    """The event table (module docstring) of batches of decoded events, as an Arrow table;
    what was dropped or ignored is in its schema metadata under ``DAMAGE_KEY``
    (``damage_of``). ``parse_trace`` gives the ``[memory]`` events' table too."""
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
    with system_allocator():
        return _parse_events(batches, comm_kernel_re)


@contextlib.contextmanager
def system_allocator():
    """Within the block, Arrow allocates through the C library's allocator (``parse_trace``:
    the per-batch arrays of a read); the pool in force before is restored on leaving."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def damage_of(table: pa.Table) -> Damage:
    """What ingest dropped or ignored making ``table`` (``parse_events``)."""
    return Damage.from_json((table.schema.metadata or {}).get(DAMAGE_KEY))


def _with_damage(table: pa.Table, damage: Damage) -> pa.Table:
    if not damage:
        return table
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          DAMAGE_KEY: damage.to_json()})


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


def _consolidate(chunks: dict[str, list[pa.Array]], small: dict[str, list[pa.Array]],
                 kinds: "_Kinds") -> None:
    """The batches' small arrays of each column (``small``, emptied) joined into one chunk
    appended to ``chunks``, the string columns dictionary-encoded and the chunk's ``kind``
    classified (``_Kinds``). Done every ``CONSOLIDATE_BYTES`` of batches: the memory those
    arrays and the batches' decoding took is then free for the next batches to reuse, rather
    than left in small pieces among what is kept (the ingest's peak was twice the table), and
    what classifying takes is one chunk's."""
    if not small:
        return
    for k, parts in small.items():
        joined = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
        if k in _ENCODED:
            joined = pc.dictionary_encode(joined)
        chunks.setdefault(k, []).append(joined)
    chunks.setdefault("kind", []).append(kinds(chunks["name"][-1], chunks["cat"][-1]))
    small.clear()
    _trim()


_ENCODED = ("name", "cat", "lane", "call_args")     # dictionary-encoded as they are joined


def _malloc_trim():
    """The C library's ``malloc_trim`` (glibc), or None where there is none."""
    try:
        import ctypes
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def _trim() -> None:
    """Give the memory the C library's allocator holds free back to the system (where it can:
    glibc's ``malloc_trim``). Arrow allocates through that allocator while a trace is read
    (``parse_events``); the batches' memory freed at each ``_consolidate`` is left in pieces
    among the kept chunks, which the next, larger allocations cannot reuse."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _parse_events_of(batches: Iterable[list[decode.Event]], comm_kernel_re: re.Pattern | None,
                     reading: batch_columns.Reading) -> pa.Table:
    acc = Accumulator(comm_kernel_re, reading)
    for evs in batches:
        acc.add(evs)
    return acc.finish()


@dataclasses.dataclass
class Part:
    """What reading one part of a trace's ``traceEvents`` gave (``Accumulator.part``): its
    events' columns in chunks, their collective metadata by row, counts for the budgets, the
    damage met, PyTorch 1.8 categories met and the ``[memory]`` events' columns; ``odd``
    says why the part cannot be joined to the others (read the trace as one stream then:
    ``analysis/ingest/parts.py``), None when it can."""
    chunks: dict[str, list[pa.Array]]
    found: list[tuple[int, dict]]
    n: int
    seen: int
    held: int
    damage: Damage
    legacy: collections.Counter
    memory_chunks: dict[str, list[pa.Array]]
    memory_rows: int
    memory_bytes: int
    odd: str | None = None
    tail: bytes | None = None           # the last part's text after the events


class Accumulator:
    """The event table of a trace's batches, batch by batch (``add``), then as a table
    (``finish``): each batch's columns (``batch_columns.batch``) kept, joined into chunks every
    ``CONSOLIDATE_BYTES`` (``_consolidate``), the reading budgets checked as it grows.

    Parts of one trace read in other processes (``analysis/ingest/parts.py``) each fill an
    accumulator of their own, handed over as a ``Part`` (``part``) and joined here in file
    order (``merge``): the table is then the one of the whole trace read as one stream."""

    def __init__(self, comm_kernel_re: re.Pattern | None, reading: batch_columns.Reading):
        self.chunks: dict[str, list[pa.Array]] = {}
        self.found: list[tuple[int, dict]] = []
        self.damage = Damage()
        self.small: dict[str, list[pa.Array]] = {}
        self.kinds = _Kinds(comm_kernel_re)
        self.reading = reading
        self.n = self.seen = self.held = self.pending = 0
        self.budget = _budgets.current()

    def add(self, evs: list[decode.Event]) -> None:
        reading, budget = self.reading, self.budget
        self.seen += len(evs)
        if self.seen > budget.events:
            raise BudgetExceeded("events", f"more than {budget.events:,} events",
                                 budget.events)
        before = reading.memory_bytes
        cols, meta, hurt = batch_columns.batch(evs, reading)
        self.damage.update(hurt)
        if reading.memory_bytes > before:
            self.held += reading.memory_bytes - before
            self.pending += reading.memory_bytes - before
            if self.held > budget.rank_memory:
                raise BudgetExceeded("rank_memory", f"its event and memory tables grow beyond "
                                     f"{_budgets.human(budget.rank_memory)} ({self.n:,} events "
                                     f"and {reading.memory.rows:,} [memory] events read)",
                                     budget.rank_memory)
        if cols is None:
            if self.pending > CONSOLIDATE_BYTES:
                self._consolidate()
            return
        for k, arr in cols.items():
            self.small.setdefault(k, []).append(arr)
            self.held += arr.nbytes
            self.pending += arr.nbytes
        n = self.n
        self.found += [(n + i, m) for i, m in meta]
        self.n += len(cols["name"])
        if self.pending > CONSOLIDATE_BYTES:
            self._consolidate()
        if self.held > budget.rank_memory:
            raise BudgetExceeded("rank_memory", f"its event table grows beyond "
                                 f"{_budgets.human(budget.rank_memory)} ({self.n:,} events "
                                 f"read)", budget.rank_memory)

    def _consolidate(self) -> None:
        _consolidate(self.chunks, self.small, self.kinds)
        self.reading.memory.consolidate()
        self.pending = 0

    def part(self, odd: str | None = None) -> Part:
        """This accumulator's state, to be joined to the parts before it (``merge``)."""
        self._consolidate()
        memory = self.reading.memory
        return Part(chunks=self.chunks, found=self.found, n=self.n, seen=self.seen,
                     held=self.held, damage=self.damage, legacy=self.reading.legacy,
                     memory_chunks=memory.chunks, memory_rows=memory.rows,
                     memory_bytes=self.reading.memory_bytes, odd=odd)

    def merge(self, part: Part) -> None:
        """Join the next part of the trace (``part``) after what this holds: the same
        budgets, counted over the whole trace; the part's rows numbered after these."""
        budget = self.budget
        self.seen += part.seen
        if self.seen > budget.events:
            raise BudgetExceeded("events", f"more than {budget.events:,} events",
                                 budget.events)
        self.held += part.held
        if self.held > budget.rank_memory:
            raise BudgetExceeded("rank_memory", f"its event table grows beyond "
                                 f"{_budgets.human(budget.rank_memory)}", budget.rank_memory)
        for k, arrays in part.chunks.items():
            self.chunks.setdefault(k, []).extend(arrays)
        n = self.n
        self.found += [(n + i, m) for i, m in part.found]
        self.n += part.n
        self.damage.update(part.damage)
        self.reading.legacy.update(part.legacy)
        memory = self.reading.memory
        for k, arrays in part.memory_chunks.items():
            memory.chunks.setdefault(k, []).extend(arrays)
        memory.rows += part.memory_rows
        self.reading.memory_bytes += part.memory_bytes

    def finish(self) -> pa.Table:
        """The event table of every batch added and part merged (``parse_events``)."""
        self._consolidate()
        chunks, damage, reading, n = self.chunks, self.damage, self.reading, self.n
        found = self.found
        self.chunks, self.found = {}, []
        reading.unclosed(damage)
        if n == 0:
            reading.memory_table, _ = reading.memory.table(lambda ts: np.zeros(len(ts), bool))
            damage.drop("[memory].ts", "a trace without complete events", reading.memory.rows)
            return _with_damage(SCHEMA.empty_table(), damage)
        # Each column's chunks are let go, and their memory given back, as soon as it is
        # joined: the table is not held twice.
        arrays = {}
        for k in list(chunks):
            parts = chunks.pop(k)
            arrays[k] = _one_dictionary(parts) if pa.types.is_dictionary(
                SCHEMA.field(k).type) else pa.concat_arrays(parts)
            del parts
            _trim()
        ts_all = arrays["ts_us"].to_numpy(zero_copy_only=False)
        keep, out_of_bounds = validate.event_bounds(
            ts_all, arrays["dur_us"].to_numpy(zero_copy_only=False))
        damage.update(out_of_bounds)
        if not keep.all():
            lost = np.flatnonzero(~keep)
            names = pc.take(arrays["name"], pa.array(lost)).to_pylist()
            cats = pc.take(arrays["cat"], pa.array(lost)).to_pylist()
            damage.lose_steps(names, cats, np.ones(len(lost), dtype=bool),
                              "outside the trace's span, or longer than the trace")
        reading.memory_table, outside = reading.memory.table(
            functools.partial(validate.instants_within, event_ts=ts_all[keep]))
        damage.drop("[memory].ts", "a time outside the trace's span", outside)
        del ts_all
        arrays["end_us"] = pc.add(arrays["ts_us"], arrays["dur_us"])
        arrays.update(_meta_columns(n, found))
        table = pa.Table.from_arrays([arrays[f.name] for f in SCHEMA], schema=SCHEMA)
        if not keep.all():
            table = table.filter(pa.array(keep))
        return _with_damage(table, damage)


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
        damage = damage_of(table)
        damage.update(meta_damage)
        table = _with_damage(table, damage)
    return _with_layout(table, layout), memory, meta


def to_frame(table: pa.Table | list, *, release: bool = False) -> pd.DataFrame:
    """The pandas events table of an Arrow one (the module docstring's dtypes: categoricals for
    the string columns, nullable Int64 where documented). ``release``: each Arrow column is
    let go as soon as it is converted (the plain ones with ``self_destruct``), so that the
    table and the frame are not both held whole; ``table`` must not be used afterwards. Its
    memory is freed then only if nothing else holds the table: pass it as a list holding it
    alone (``[table]``, emptied here), which lets the caller drop its own reference."""
    if isinstance(table, list):
        table = table.pop()
    converted = {}
    for col in CATEGORICAL + _NULLABLE_INT:
        column = table.column(col)
        converted[col] = _categorical(column) if col in CATEGORICAL else \
            column.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        if release:
            table = table.drop_columns([col])
            del column
            _trim()
    rest = table.drop_columns([c for c in CATEGORICAL + _NULLABLE_INT
                               if c in table.column_names])
    del table
    df = rest.to_pandas(self_destruct=True, split_blocks=True) if release else rest.to_pandas()
    del rest
    for col, values in converted.items():
        df[col] = values
    return df[[f.name for f in SCHEMA]]


# Columns of strings held in the frame as integer codes into a table of their distinct values
# (pandas categoricals, missing where the table has null): a trace has a few hundred distinct
# names among millions of events, and the collective metadata's strings are null on all but
# the few events that carry them (as 8-byte string offsets they were a third of a tiny
# event's frame; as codes they take a byte or two).
CATEGORICAL = ("name", "cat", "lane", "kind", "coll_name", "dtype", "pg_name", "pg_desc",
               "pg_ranks", "call_args")


def _categorical(column: pa.ChunkedArray) -> pd.Categorical:
    """``column`` (strings, dictionary-encoded or not, in one or more chunks; nulls allowed)
    as a pandas categorical whose categories are its distinct values in sorted order, so that
    sorting and grouping by it order rows as the strings themselves would; a null is missing
    (code -1). Only the codes are copied, never the strings."""
    parts = column.chunks if column.num_chunks else [pa.array([], NAMES)]
    if not pa.types.is_dictionary(column.type):
        parts = [pc.dictionary_encode(p) for p in parts]
    codes, values = _joined_codes(parts)
    order = sorted(range(len(values)), key=values.__getitem__)
    rank = np.empty(len(values) + 1, dtype=np.int32)
    rank[order] = np.arange(len(values), dtype=np.int32)
    rank[-1] = -1                               # a null's code, -1, indexes this
    return pd.Categorical.from_codes(rank[codes],
                                     categories=pd.Index([values[i] for i in order], dtype=str))


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
    damage = damage_of(table)
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
    # converted (``to_frame``): the cache hit's tuple and this function's name let it go.
    owned, hit = [table], None
    del table
    return RankTrace(path=path, rank=rank, events=to_frame(owned, release=True), meta=meta,
                     problems=problems, notes=notes, memory=memory_events.to_frame(memory))
