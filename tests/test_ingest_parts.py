"""One trace read in parts on several workers (``analysis/ingest/parts.py``) gives the table of
the same trace read as one stream — row for row, column for column, its ``[memory]`` table, its
metadata, its damage and what was read — on every shared real trace, on damaged and hostile
ones, and under every budget; where the parts could differ (B/E pairs, a cut inside a string,
a batch the typed decoder refuses, a budget reached) the trace is read as one stream instead,
which then gives exactly today's table or refusal.

Most tests run the parts on an executor that runs each task at once in this process (any
``concurrent.futures.Executor`` may carry them), with parts of 64 KB so that even the small
shared traces are cut into many; one slow test runs them on worker processes."""
from __future__ import annotations

import concurrent.futures
import gzip
import json
import pathlib
import subprocess
import sys
import threading

import pytest

from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest import budgets, event_table, parts
from meshscope.analysis.ingest import events as ingest
from conftest import ROOT, SHARED_TRACES, shared_trace

SHARED = sorted(SHARED_TRACES.rglob("*.json*")) if SHARED_TRACES.is_dir() else []
REFERENCE = "gpu/hta/df_index_resolver/df_index_resolver.json.gz"


class _Here(concurrent.futures.Executor):
    """Runs each task as it is submitted, in this process."""

    def submit(self, fn, *args, **kwargs):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to whoever asks the future
            future.set_exception(e)
        return future


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 64 KB, every file large enough to be read in parts."""
    monkeypatch.setattr(parts, "PART_BYTES", 64 << 10)
    monkeypatch.setattr(parts, "MIN_GZIP_BYTES", 0)
    monkeypatch.setattr(parts, "MIN_TEXT_BYTES", 0)


def _one_stream(path: pathlib.Path):
    assert parts._CORES is None
    return ingest._parse(path, path.read_bytes(), None)


def _in_parts(path: pathlib.Path, executor=None):
    with parts.on_cores(2, executor=executor or _Here()):
        return ingest._parse(path, path.read_bytes(), None)


def _same(a, b) -> None:
    """Two readings' (event table, memory table, metadata) hold the same: the frames the
    analysis reads, the memory tables, the metadata (what was read included), the damage."""
    (ta, ma, meta_a), (tb, mb, meta_b) = a, b
    assert ta.num_rows == tb.num_rows
    assert event_table.to_frame(ta).equals(event_table.to_frame(tb))
    assert ta.schema.remove_metadata() == tb.schema.remove_metadata()
    assert ma.equals(mb)
    assert meta_a == meta_b
    assert event_table.damage_of(ta) == event_table.damage_of(tb)
    assert ingest._read_info(ta) == ingest._read_info(tb)


@pytest.mark.skipif(not SHARED, reason="../shared/traces is absent")
@pytest.mark.parametrize("path", SHARED, ids=lambda p: str(p.relative_to(SHARED_TRACES)))
def test_every_shared_trace_in_parts_is_the_one_stream_table(path, small_parts):
    got = _in_parts(path)
    assert parts.LAST_ODD is None, f"read as one stream after all: {parts.LAST_ODD}"
    _same(got, _one_stream(path))


def _events(n: int, name=lambda i: f"aten::op{i % 7}") -> list[dict]:
    out = [{"ph": "X", "cat": "cpu_op", "name": name(i), "pid": 1, "tid": 1 + i % 2,
            "ts": 1_000 + 3 * i, "dur": 2, "args": {"correlation": i}} for i in range(n)]
    out.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1_500,
                "dur": 5, "args": {"device": 0, "stream": 7, "correlation": 3}})
    return out


def _write(path: pathlib.Path, doc) -> pathlib.Path:
    path.write_bytes(gzip.compress(json.dumps(doc, indent=1).encode(), 1))
    return path


def test_a_trace_with_metadata_after_its_events(tmp_path, small_parts):
    """The metadata after ``traceEvents`` — a list of objects like deviceProperties, whose
    ``}, {`` looks like a boundary between events — is read from the last part."""
    doc = {"schemaVersion": 1, "traceEvents": _events(6000),
           "deviceProperties": [{"id": i, "name": "GPU"} for i in range(8)],
           "distributedInfo": {"rank": 3}}
    path = _write(tmp_path / "rank3.json.gz", doc)
    got = _in_parts(path)
    assert parts.LAST_ODD is None
    _same(got, _one_stream(path))
    assert got[2]["deviceProperties"][7] == {"id": 7, "name": "GPU"}


def test_a_bare_array_without_its_closing_bracket(tmp_path, small_parts):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(_events(5000))[:-1] + ",\n")
    got = _in_parts(path)
    assert parts.LAST_ODD is None
    _same(got, _one_stream(path))
    assert got[0].num_rows == 5001


def test_damaged_events_are_dropped_and_counted_alike(tmp_path, small_parts):
    evs = _events(6000)
    for i in range(0, 6000, 97):
        evs[i]["dur"] = -1                      # a negative duration
    for i in range(5, 6000, 131):
        del evs[i]["ts"]                        # no start
    for i in range(7, 6000, 173):
        evs[i]["args"]["correlation"] = 2 ** 70     # beyond 64 bits
    evs.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1,
                "tid": 1, "ts": 1_000, "dur": -5})
    path = _write(tmp_path / "rank0.json.gz", {"traceEvents": evs})
    got = _in_parts(path)
    assert parts.LAST_ODD is None
    _same(got, _one_stream(path))
    damage = event_table.damage_of(got[0])
    assert damage[("dur", "dropped", "a negative duration")] == 63
    assert damage[("ts", "dropped", "missing")] == 46


def test_be_pairs_are_read_as_one_stream(tmp_path, small_parts):
    """A pair's row stands where its ``E`` is within its batch: only one stream knows it."""
    evs = _events(4000)
    evs[2000:2000] = [{"ph": "B", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1,
                       "ts": 5_000}, {"ph": "E", "pid": 1, "tid": 1, "ts": 5_050}]
    path = _write(tmp_path / "rank0.json.gz", {"traceEvents": evs})
    got = _in_parts(path)
    assert parts.LAST_ODD == "B/E events"
    _same(got, _one_stream(path))
    assert ingest.read_format(got[0])["be_pairs"] == 1


def test_a_cut_inside_a_string_is_found_and_read_as_one_stream(tmp_path, small_parts):
    """Every event's name holds ``}, {``: some cuts fall inside a name, the parts around them
    do not decode, and the trace is read as one stream — the same table."""
    path = _write(tmp_path / "rank0.json.gz",
                  {"traceEvents": _events(8000, name=lambda i: f"op}}, {{{i % 5}")})
    got = _in_parts(path)
    assert parts.LAST_ODD is not None
    _same(got, _one_stream(path))
    assert set(event_table.to_frame(got[0])["name"].unique()) >= {"op}, {0", "op}, {4"}


def test_a_batch_the_typed_decoder_refuses_is_read_as_one_stream(tmp_path, small_parts):
    evs = _events(6000)
    evs[3000]["args"] = [1, 2]                  # args that are not an object
    path = _write(tmp_path / "rank0.json.gz", {"traceEvents": evs})
    got = _in_parts(path)
    assert parts.LAST_ODD == "a batch the typed decoder refused"
    _same(got, _one_stream(path))


def _refusal(path: pathlib.Path, with_parts: bool) -> str:
    def load():
        return ingest.load_trace(path)
    with pytest.raises(InputError) as e:
        if with_parts:
            with parts.on_cores(2, executor=_Here()):
                load()
        else:
            load()
    return str(e.value)


@pytest.mark.parametrize("budget,value,words", [
    ("events", 3000, "more than 3,000 events"),
    ("rank_memory", 96 << 10, "grows beyond 96 KiB"),
    ("nesting", 6, "nested more than 6 levels deep"),
    ("event_bytes", 768 << 10, "an event longer than 786,432 bytes"),
])
def test_budgets_refuse_as_the_one_stream_does(tmp_path, small_parts, monkeypatch, budget,
                                                value, words):
    evs = _events(6000)
    evs[4000]["args"]["deep"] = [[[[[[[1]]]]]]]         # 9 levels in the file
    evs[4500]["args"]["long"] = "x" * (1 << 20)         # 1 MiB of one string
    path = _write(tmp_path / "rank0.json.gz", {"traceEvents": evs})
    monkeypatch.setenv(budgets.ENV[budget], str(value))
    got = _refusal(path, with_parts=True)
    assert parts.LAST_ODD is not None
    assert got == _refusal(path, with_parts=False)
    assert words in got


def test_the_cache_holds_the_one_stream_table(tmp_path, small_parts):
    """A table read in parts is cached; a hit serves it without parsing; it is the table of
    one stream."""
    path = shared_trace("gpu/hta/nccl_parser_config/nccl_data.json.gz")
    cache = tmp_path / "cache"
    with parts.on_cores(2, executor=_Here()):
        before = ingest.PARSE_COUNT
        first = ingest.load_trace(path, cache_dir=cache)
        assert parts.LAST_ODD is None and ingest.PARSE_COUNT == before + 1
        again = ingest.load_trace(path, cache_dir=cache)
        assert ingest.PARSE_COUNT == before + 1, "served from the cache"
    plain = ingest.load_trace(path)
    assert first.events.equals(plain.events) and again.events.equals(plain.events)
    assert first.memory.equals(plain.memory) and first.problems == plain.problems


@pytest.mark.slow
def test_worker_processes_read_the_reference_trace_as_one_stream(monkeypatch):
    """The 54 MB reference trace in parts of 4 MB on two worker processes."""
    monkeypatch.setattr(parts, "PART_BYTES", 4 << 20)
    monkeypatch.setattr(parts, "MIN_GZIP_BYTES", 0)
    path = shared_trace(REFERENCE)
    with parts.on_cores(2):
        got = ingest._parse(path, path.read_bytes(), None)
        assert parts._CORES.started == 1, "read on worker processes"
        assert parts._CORES.executor is None, "ended once the trace is read"
    assert parts.LAST_ODD is None
    _same(got, _one_stream(path))


# Run in a fresh interpreter (as ``_BESIDE_IN_A_FRESH_PROCESS`` below, and for the same
# reason): one trace's rank_work, in one process and then on two cores, its tables beside the
# timeline made in a fork.
_RANK_WORK_BESIDE = """
import pathlib, sys
import pandas as pd
from meshscope.analysis.ingest import parts, pool
from meshscope.analysis.report import rank_work

path = pathlib.Path(sys.argv[1])
plain = rank_work.rank_work(path, rank_work.RankOptions())
parts.MIN_GZIP_BYTES = 0               # the reference trace read in parts
rank_work.BESIDE_EVENTS = 0            # and its tables made beside its timeline
forks = []


class Counted(pool.Beside):
    def __init__(self, *args):
        super().__init__(*args)
        forks.append(self._pid is not None)


pool.Beside = Counted
with parts.on_cores(2):
    beside = rank_work.rank_work(path, rank_work.RankOptions())
assert forks == [True], ("made in a forked process", forks)
pd.testing.assert_frame_equal(beside.operations, plain.operations, check_exact=True)
pd.testing.assert_frame_equal(beside.operators, plain.operators, check_exact=True)
assert list(beside.gpu) == list(plain.gpu) and list(beside.memory) == list(plain.memory)
for name in plain.gpu:
    pd.testing.assert_frame_equal(beside.gpu[name], plain.gpu[name], check_exact=True)
for name in plain.memory:
    pd.testing.assert_frame_equal(beside.memory[name], plain.memory[name], check_exact=True)
assert beside.timeline.steps == plain.timeline.steps
assert beside.notes == plain.notes and beside.problems == plain.problems
print("ok")
"""


@pytest.mark.slow
def test_a_rank_s_tables_made_beside_its_timeline_are_the_same():
    """``rank_work`` of one trace on every core — its events in parts, its operations,
    memory, operator and kernel tables in a forked process beside the timeline
    (``pool.Beside``) — gives the result of ``rank_work`` in one process."""
    path = shared_trace(REFERENCE)
    proc = subprocess.run([sys.executable, "-c", _RANK_WORK_BESIDE, str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# Run in a fresh interpreter: ``pool.Beside`` forks only while this process runs at most one
# other thread, which a test process that has run other tests (a Dask cluster's, a server's
# threads) cannot promise.
_BESIDE_IN_A_FRESH_PROCESS = """
import os
from meshscope.analysis.ingest import pool

parent = os.getpid()


def fails(x):
    raise ValueError(f"no {x}")


def exits(x):
    if os.getpid() != parent:
        os._exit(9)                     # the forked copy vanishes, as one killed for memory
    return x * 2


made = pool.Beside(sum, [1, 2, 3])
assert made._pid is not None, "forked"
assert made.result() == 6
raising = pool.Beside(fails, "table")
assert raising._pid is not None, "forked"
try:
    raising.result()
except ValueError as e:
    assert str(e) == "no table", e
else:
    raise AssertionError("the copy's exception was not raised here")
lost = pool.Beside(exits, 21)
assert lost._pid is not None, "forked"
assert lost.result() == 42, "run here after the copy was lost"
print("ok")
"""


@pytest.mark.slow
def test_beside_gives_the_value_or_the_exception_of_the_call_here():
    """``pool.Beside``: the value of ``fn(*args)`` made in a forked copy; a call that raises
    raises the same here; a copy that is lost has its call run here."""
    proc = subprocess.run([sys.executable, "-c", _BESIDE_IN_A_FRESH_PROCESS], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_beside_runs_the_call_here_while_other_threads_run():
    """With two threads besides this one (a fork would copy locks they may hold), nothing is
    forked: the call runs here, with the same value."""
    from meshscope.analysis.ingest import pool

    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        here = pool.Beside(sum, [1, 2, 3])
        assert here._pid is None
        assert here.result() == 6
    finally:
        stop.set()
        for t in threads:
            t.join()
