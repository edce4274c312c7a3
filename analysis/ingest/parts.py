"""One large trace on every core: its events read in parts by worker processes.

A rank's trace is one file, and reading it — inflating, decoding every event, building the
columns — is CPU-bound Python: read as one stream (``events._parse``) it keeps one core busy
while the others wait. ``read(path, raw, comm_kernel_re)`` reads it on every core instead,
when this process was given worker processes for it (``on_cores``: the analysis of a single
trace, ``analysis/ingest/pool.py``) and the file is large enough to gain (``worth_it``):

1. **Cut** (here): the file is inflated once (ISA-L; a gzip stream cannot be inflated from the
   middle) and the text of ``traceEvents`` is cut into parts of about ``PART_BYTES`` at event
   boundaries — after a ``}`` that a ``,`` follows — without decoding anything
   (``json_stream.EventStream.parts``). The text before and after the events (the metadata)
   is read and checked here, as the one-stream reader does.
2. **Read** (in the workers, ``_read_part``): each part is checked against the nesting budget
   from the depth at which events lie, cut into batches, decoded and typed, its columns built
   and joined into chunks, its events classified — the one-stream reader's own code
   (``decode.decode``, ``batch_columns.batch``, ``accumulator.Accumulator``). At most
   ``IN_FLIGHT_PER_WORKER`` parts per worker are out at once, so what is held in text is
   bounded whatever the size of the file.
3. **Join** (here, in file order, ``accumulator.Accumulator.merge``): the rows numbered on, the
   collective metadata placed at its rows, the damage added up, the budgets (``--max-events``,
   ``--max-rank-memory``) counted over the whole trace; then the table is finished as the one
   stream's is (the trace's span checked, the ``[memory]`` table, ``end_us``).

The table is the one-stream reader's, row for row and column for column (the cached table
included; ``tests/test_ingest_parts.py`` compares them on every shared trace): each row is an
event of the file, in file order, made by the same code. Where the two could differ, or
anything goes wrong, ``read`` raises ``Odd`` and the caller reads the trace as one stream,
which then gives today's table, message or refusal exactly:

- a part holds a ``B`` or ``E`` event (a pair's row stands where its ``E`` is within its
  batch of the stream, which a part cannot know);
- the typed decoder refused a batch (the generic decoder that reads it then re-encodes
  arguments, and which events share that batch decides which are re-encoded);
- a cut fell inside a string (the parts around it do not decode), the file's layout is one
  the cutter does not follow, or a part's nesting is past the budget;
- a budget is reached (the one stream stops where it did, with the message it gave), or a
  worker was lost.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import multiprocessing as mp
import os
import pathlib
import re
import threading
from concurrent.futures import Executor, ProcessPoolExecutor

import pyarrow as pa

from meshscope.analysis.ingest import accumulator
from meshscope.analysis.ingest import allocator
from meshscope.analysis.ingest import batch_columns
from meshscope.analysis.ingest import budgets as _budgets
from meshscope.analysis.ingest import decode
from meshscope.analysis.ingest import events
from meshscope.analysis.ingest import json_nesting
from meshscope.analysis.ingest import json_stream
from meshscope.analysis.ingest import start_method
from meshscope.analysis.ingest.validate import Damage

# Text per part: large enough that a part's columns come back in one chunk and the cost of
# a task is small beside its work, small enough that two workers share a 54 MB trace.
PART_BYTES = 8 << 20
IN_FLIGHT_PER_WORKER = 2
# Text a worker checks for nesting at once (the check's arrays are a few times this).
NESTING_SLICE = 1 << 20
# Files smaller than this are read as one stream: the workers cost about a quarter more CPU
# than one stream (the text sent to them, the columns sent back, the forks), which the 54 MB
# reference trace (2.9 MB gzipped) did not earn back with another process on the second core
# (`meshscope analyze` 1.7 s in one stream, 2.0-2.2 s in parts; docs/benchmarks.md). A gzip of
# 4 MB holds about 75 MB of JSON.
MIN_GZIP_BYTES = 4 << 20
MIN_TEXT_BYTES = 64 << 20


class Odd(Exception):
    """The trace is not to be read in parts (module docstring): read it as one stream."""


@dataclasses.dataclass
class _Cores:
    workers: int
    # Whether this process ran one thread when the block began: its workers are then forked
    # (quick), even if a progress bar's timer thread started since — that thread never runs
    # what a worker does. Otherwise they come from a fork server (``start_method.context``).
    fork: bool
    executor: Executor | None = None
    owned: bool = True              # started here (else given: ``on_cores(executor=…)``)
    started: int = 0                # worker pools started so far


_CORES: _Cores | None = None
# Why the last trace was read as one stream after all (None: it was read in parts, or never
# tried); for the tests and the benchmark.
LAST_ODD: str | None = None


@contextlib.contextmanager
def on_cores(workers: int | None = None, executor: Executor | None = None):
    """Within the block, a large trace (``worth_it``) is read by ``workers`` processes
    (default: one per core), started at the first such trace and ended on leaving; or on
    ``executor``, any ``concurrent.futures.Executor`` (not shut down here). With fewer than
    two workers and no executor nothing changes."""
    global _CORES
    n = (os.cpu_count() or 1) if workers is None else workers
    if (n < 2 and executor is None) or _CORES is not None:
        yield
        return
    _CORES = _Cores(max(n, 1), fork=threading.active_count() == 1 and
                    "fork" in mp.get_all_start_methods(), executor=executor,
                    owned=executor is None)
    events.parts_reader = read_if_worth_it
    try:
        yield
    finally:
        events.parts_reader = None
        cores, _CORES = _CORES, None
        if cores.owned and cores.executor is not None:
            cores.executor.shutdown(wait=True, cancel_futures=True)


def has_cores() -> bool:
    """Whether this process was given more cores than its own (``on_cores`` in force): the
    analysis of a single trace may then run its parts beside each other
    (``analysis/report/rank_work.py``)."""
    return _CORES is not None and _CORES.workers > 1


def worth_it(raw: bytes) -> bool:
    """Whether ``raw`` is read in parts here (``on_cores`` in force and a large file)."""
    if _CORES is None:
        return False
    text_bytes = getattr(raw, "text_bytes", None)    # an uncompressed file, held compressed
    if text_bytes is not None:                      # (``trace_file.Packed``): by its text
        return text_bytes >= MIN_TEXT_BYTES
    gz = raw[:2] == json_stream.GZIP_MAGIC
    return len(raw) >= (MIN_GZIP_BYTES if gz else MIN_TEXT_BYTES)


def _executor() -> Executor:
    if _CORES.executor is None:
        if _CORES.fork:
            context = mp.get_context("fork")
        else:
            context = start_method.context()
        _CORES.executor = ProcessPoolExecutor(max_workers=_CORES.workers, mp_context=context,
                                              initializer=start_method.die_with_parent)
        _CORES.started += 1
    return _CORES.executor


def read_if_worth_it(path: pathlib.Path, raw: bytes, comm_kernel_re: re.Pattern | None
                     ) -> tuple[pa.Table, pa.Table, dict, str | None] | None:
    """``read``, when ``raw`` is worth reading in parts (``worth_it``) and can be; None when it
    is to be read as one stream (``events.parts_reader``, which ``on_cores`` sets)."""
    if not worth_it(raw):
        return None
    try:
        return read(path, raw, comm_kernel_re)
    except Odd:
        return None


def read(path: pathlib.Path, raw: bytes, comm_kernel_re: re.Pattern | None
         ) -> tuple[pa.Table, pa.Table, dict, str | None]:
    """(event table, memory table, metadata, layout) of the trace ``raw``, read in parts
    (module docstring); ``Odd`` when it is to be read as one stream instead."""
    global LAST_ODD
    LAST_ODD = None
    try:
        return _read(raw, comm_kernel_re)
    except Odd as e:
        LAST_ODD = str(e)
        raise
    except Exception as e:          # noqa: BLE001 - whatever it is, one stream says it right
        LAST_ODD = f"{type(e).__name__}: {e}"
        raise Odd(LAST_ODD) from None


def _read(raw: bytes, comm_kernel_re: re.Pattern | None
          ) -> tuple[pa.Table, pa.Table, dict, str | None]:
    executor = _executor()
    in_flight = IN_FLIGHT_PER_WORKER * _CORES.workers
    stream = json_stream.EventStream(raw, None, batch_bytes=events.BATCH_BYTES)
    env = _budgets.environment()
    reading = batch_columns.Reading()
    acc = accumulator.Accumulator(comm_kernel_re, reading)
    pending: collections.deque = collections.deque()
    try:
        with allocator.system_allocator():
            for text, last in stream.parts(PART_BYTES):
                pending.append(executor.submit(_read_part, text, stream.events_depth, last,
                                               comm_kernel_re, env))
                del text
                while len(pending) >= in_flight:
                    _join(acc, pending.popleft().result())
            tail = None
            while pending:
                tail = _join(acc, pending.popleft().result())
            stream.set_tail(tail)
            table = acc.finish()
    finally:
        for f in pending:
            f.cancel()
        _release()
    if reading.legacy:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               events.READ_KEY: reading.to_json()})
    return table, reading.memory_table, stream.meta, stream.layout


def _release() -> None:
    """End the workers once a trace is read: the rest of its analysis may fork this process
    (``pool.Beside``), which is safe only while it runs one thread; the next large trace
    starts them again."""
    if _CORES is not None and _CORES.executor is not None and _CORES.owned:
        _CORES.executor.shutdown(wait=True, cancel_futures=True)
        _CORES.executor = None


def _join(acc: "accumulator.Accumulator", part: "accumulator.Part") -> bytes | None:
    """Join ``part`` to ``acc``; the text after the events when it is the last part."""
    if part.odd is not None:
        raise Odd(part.odd)
    acc.merge(part)
    return part.tail


def _read_part(text: bytes, depth: int, last: bool, comm_kernel_re: re.Pattern | None,
               env: dict) -> "accumulator.Part":
    """One part's ``accumulator.Part`` (in a worker): the events of ``text`` (whole events
    separated by commas, lying ``depth`` levels deep in the file; the ``last`` part runs on
    to the end of the file, and its ``tail`` is the text after the events), read as the
    one-stream reader reads them; its ``odd`` set when the part is not to be joined (module
    docstring)."""
    _budgets.set_environment(env)
    limits = _budgets.current()
    # The part is read as a bare array: its "[" is one level, the file's are ``depth``.
    inner = dataclasses.replace(limits, nesting=limits.nesting - (depth - 1),
                                trace_bytes=max(limits.trace_bytes, len(text) + 2))
    reading = batch_columns.Reading()
    acc = accumulator.Accumulator(comm_kernel_re, reading)
    try:
        with allocator.system_allocator():
            if last:
                # The last part runs on to the end of the file: read as a stream, which finds
                # where the events end and keeps the text after them.
                stream = json_stream.EventStream(b"[" + text, decode.decode,
                                                 batch_bytes=events.BATCH_BYTES, budgets=inner)
                del text
                batches = stream.batches(keep_tail=True)
            else:
                # A run of whole events: its nesting checked, then decoded in place, batch by
                # batch, in one buffer with a spare byte at either end.
                nesting = json_nesting.Nesting(inner.nesting)
                nesting.feed(b"[")
                for i in range(0, len(text), NESTING_SLICE):
                    nesting.feed(text[i:i + NESTING_SLICE])
                buf = bytearray(len(text) + 2)
                buf[1:-1] = text
                del text
                stream = None
                batches = json_stream.batches_in(buf, decode.decode, events.BATCH_BYTES)
            for evs in batches:
                if isinstance(evs, decode.Decoded):
                    return _odd("a batch the typed decoder refused")
                acc.add(evs)
                if reading.be_events:
                    return _odd("B/E events")
            if stream is not None and stream.layout != "array":
                return _odd("a part that is not a run of events")
            part = acc.part()
            part.tail = stream.tail if stream is not None else None
            return part
    except Exception as e:          # noqa: BLE001 - the one stream says what it is
        return _odd(f"{type(e).__name__}: {e}")


def _odd(why: str) -> "accumulator.Part":
    """A part that is not to be joined, and why."""
    return accumulator.Part({}, [], 0, 0, 0, Damage(), collections.Counter(), {}, 0, 0,
                             odd=why)
