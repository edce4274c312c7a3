"""The event table built batch by batch, and from parts read in other processes.

An ``Accumulator`` takes a trace's batches of decoded events one at a time (``add``): each
batch's columns (``batch_columns.batch``) are kept, and every ``CONSOLIDATE_BYTES`` of them
are joined into one chunk per column (``_consolidate``): the string columns dictionary-encoded,
the chunk's events classified once per distinct (name, category) (``_Kinds``), and the memory
the C library's allocator then holds free given back (``allocator.trim``), so that the next
batches reuse it rather than grow the peak. The reading budgets (``--max-events``,
``--max-rank-memory``) are checked as it grows. ``finish`` then joins the chunks into the Arrow
table (``event_table.SCHEMA``): events whose start or duration is impossible for the trace
dropped and counted, the ``[memory]`` table made, ``end_us`` added and the collective metadata
placed at its rows (``_meta_columns``).

A large trace read in parts (``parts.py``) fills one accumulator per part in the worker
processes, each handed back as a ``Part`` (``Accumulator.part``) and joined in file order
(``Accumulator.merge``): the table is then the one of the whole trace read as one stream.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from meshscope.analysis.ingest import allocator
from meshscope.analysis.ingest import batch_columns
from meshscope.analysis.ingest import budgets as _budgets
from meshscope.analysis.ingest import classify
from meshscope.analysis.ingest import comm_meta
from meshscope.analysis.ingest import decode
from meshscope.analysis.ingest import event_table
from meshscope.analysis.ingest import validate
from meshscope.analysis.ingest.budgets import BudgetExceeded
from meshscope.analysis.ingest.dictionaries import one_dictionary as _one_dictionary
from meshscope.analysis.ingest.validate import Damage

CONSOLIDATE_BYTES = 8 << 20    # a rank's batches are joined into column chunks this large


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
    strings dictionary-encoded (``event_table.NAMES``)."""
    found = sorted(found, key=lambda item: item[0])
    rows = np.array([i for i, _ in found], dtype=np.int64)
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    mask = pa.array(mask)
    out = {}
    for col in comm_meta.COLUMNS:
        kind = event_table.SCHEMA.field(col).type
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
    allocator.trim()


_ENCODED = ("name", "cat", "lane", "call_args")     # dictionary-encoded as they are joined


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
        """The event table of every batch added and part merged (``events.parse_events``)."""
        self._consolidate()
        chunks, damage, reading, n = self.chunks, self.damage, self.reading, self.n
        found = self.found
        self.chunks, self.found = {}, []
        reading.unclosed(damage)
        if n == 0:
            reading.memory_table, _ = reading.memory.table(lambda ts: np.zeros(len(ts), bool))
            damage.drop("[memory].ts", "a trace without complete events", reading.memory.rows)
            return event_table.with_damage(event_table.SCHEMA.empty_table(), damage)
        # Each column's chunks are let go, and their memory given back, as soon as it is
        # joined: the table is not held twice.
        arrays = {}
        for k in list(chunks):
            parts = chunks.pop(k)
            arrays[k] = _one_dictionary(parts) if pa.types.is_dictionary(
                event_table.SCHEMA.field(k).type) else pa.concat_arrays(parts)
            del parts
            allocator.trim()
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
        table = pa.Table.from_arrays([arrays[f.name] for f in event_table.SCHEMA],
                                     schema=event_table.SCHEMA)
        if not keep.all():
            table = table.filter(pa.array(keep))
        return event_table.with_damage(table, damage)
