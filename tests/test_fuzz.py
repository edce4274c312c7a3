"""Property-based fuzzing (hypothesis) of the readers at meshscope's boundary.

Random mutations of real documents — events of a shipped sample trace, the sample's run.json and
Flight Recorder dump, a plain-data pickle of that dump — never make a reader raise anything but
the project's own input errors (``InputError``, ``RunDirError``, ``UnsafePickleError``), within
bounded time (hypothesis' deadline) and Python memory (tracemalloc's peak) per case. What a
reader accepts is usable: every event of an ingested table has a string name, a finite start and
a finite, non-negative duration; a run.json that is read has a world of at most 2^20 ranks and
groups inside it; an accepted dump goes through the Flight Recorder diagnosis.

A mutation replaces a value anywhere in the document (found by a random walk from its root)
with a hostile one — integers beyond 64 bits, floats beyond any double, negative or huge
numbers, strings for numbers, lists nested 1,000 to 3,000 levels deep — or deletes a key, or
inserts an element that is not an object.
"""
from __future__ import annotations

import copy
import gzip
import json
import os
import pickle
import tracemalloc

import pandas as pd
from hypothesis import HealthCheck, given, settings, strategies as st

from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.records import flight_recorder as hangs
from meshscope.analysis.records.fr_table import FlightRecords
from meshscope.analysis.report import inputs
from meshscope.collectors.flight_recorder import (UnsafePickleError, load_pickle_dump,
                                                  read_dump, read_torch_dump)
from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.run_info import MAX_WORLD_SIZE
from meshscope.collectors.run_json import read_run_info
from conftest import ROOT

SAMPLE = ROOT / "samples" / "dp2-pp2-1f1b"
OURS = (InputError, RunDirError, UnsafePickleError)
PEAK_BYTES = 256 << 20            # Python allocations of one case, at most
# MESHSCOPE_FUZZ_EXAMPLES=2000 fuzzes longer, with fresh random cases (CI: 60, the same each run).
EXAMPLES = int(os.environ.get("MESHSCOPE_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=EXAMPLES or 60, deadline=10_000, database=None,
                derandomize=not EXAMPLES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def _sample_events() -> dict:
    """A few hundred real events of rank 1 (every kind: steps, ops, gloo ranges, c10d calls,
    flows) with the trace's metadata: a small real document to mutate."""
    doc = json.loads(gzip.decompress((SAMPLE / "traces" / "rank1.json.gz").read_bytes()))
    events = doc["traceEvents"]
    keep = [e for e in events if str(e.get("name", "")).startswith(
        ("ProfilerStep", "gloo:", "c10d::", "meshscope/"))][:60]
    keep += events[:200:2] + [e for e in events if e.get("ph") != "X"][:20]
    doc["traceEvents"] = keep
    return doc


EVENTS_DOC = _sample_events()
RUN_DOC = json.loads((SAMPLE / "run.json").read_text())
DUMP_DOC = json.loads((SAMPLE / "comms" / "rank1.json").read_text())
DEEP = "\u0000DEEP{}\u0000"
# Imports and caches (the schema validator, pyarrow's kernels) warmed up once, outside the time
# and memory each case is allowed.
read_run_info(SAMPLE), read_dump(SAMPLE / "comms" / "rank1.json")
ingest.load_trace(SAMPLE / "traces" / "rank1.json.gz")

hostile = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63, 2**64, 2**70, -(2**63) - 1, 10**30, 0, -1, 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e300, -1e300, 1e308, 5e-324, -0.0]),
    st.text(max_size=20), st.sampled_from(["12", "four", "", "NaN", "[0, 1]"]),
    st.booleans(), st.none(),
    st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=4),
    st.lists(st.lists(st.integers(min_value=-5, max_value=2**70), max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.integers(min_value=1000, max_value=3000).map(lambda n: DEEP.format(n)),
)


def _render(doc) -> bytes:
    """JSON text of ``doc`` with each deep marker replaced by that many nested lists, and
    ``inf`` written as a number beyond any double (``1e400``)."""
    text = json.dumps(doc).replace("Infinity", "1e400")
    while "\\u0000DEEP" in text:
        i = text.index('"\\u0000DEEP')
        j = text.index('\\u0000"', i + 1)
        n = int(text[i + 11:j])
        text = text[:i] + "[" * n + "]" * n + text[j + 7:]
    return text.encode()


@st.composite
def mutated(draw, doc, n_max=4):
    """``doc`` with one to ``n_max`` mutations (module docstring)."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, n_max))):
        node, parent, key = doc, None, None
        for _ in range(draw(st.integers(0, 6))):
            if isinstance(node, dict) and node:
                k = draw(st.sampled_from(sorted(node, key=str)))
            elif isinstance(node, list) and node:
                k = draw(st.integers(0, len(node) - 1))
            else:
                break
            node, parent, key = node[k], node, k
        action = draw(st.sampled_from(["set", "set", "set", "delete", "insert"]))
        if parent is None:
            continue
        if action == "delete" and isinstance(parent, dict):
            parent.pop(key)
        elif action == "insert" and isinstance(parent, list):
            parent.insert(key, draw(hostile))
        else:
            parent[key] = draw(hostile)
    return doc


class _Bounded:
    """Python allocations of the block stay under ``PEAK_BYTES`` (tracemalloc)."""

    def __enter__(self):
        tracemalloc.start()
        return self

    def __exit__(self, *exc):
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        if exc[0] is None:
            assert peak < PEAK_BYTES, f"peak {peak / 2**20:.0f} MiB"
        return False


# -- the event decoder -----------------------------------------------------------------------

def _check_events(trace: ingest.RankTrace) -> None:
    ev = trace.events
    assert ev["name"].map(type).eq(str).all()
    for col in ("ts_us", "dur_us", "end_us"):
        assert pd.Series(ev[col]).map(lambda x: x == x and abs(x) != float("inf")).all()
    assert (ev["dur_us"] >= 0).all()
    assert (ev["msg_bytes"].dropna() >= 0).all() and (ev["in_nelems"].dropna() >= 0).all()
    assert isinstance(trace.rank, int) and 0 <= trace.rank < MAX_WORLD_SIZE
    assert all(isinstance(p, str) and str(trace.path) in p for p in trace.problems)


def _accepted(reader, path):
    """``reader(path)`` within the time and memory bounds; None when it refuses the file with
    one of meshscope's own input errors (anything else fails the test)."""
    with _Bounded():
        try:
            return reader(path)
        except OURS:
            return None


def _ingest_checked(path) -> None:
    """Ingest ``path``: refused with our error, or usable."""
    trace = _accepted(ingest.load_trace, path)
    if trace is not None:
        _check_events(trace)


@FUZZ
@given(doc=mutated(EVENTS_DOC, n_max=6), gz=st.booleans())
def test_event_decoder_on_mutated_real_events(tmp_path_factory, doc, gz):
    path = tmp_path_factory.mktemp("fuzz") / ("rank1.json.gz" if gz else "rank1.json")
    text = _render(doc)
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    _ingest_checked(path)


@FUZZ
@given(data=st.data())
def test_event_decoder_on_cut_and_flipped_bytes(tmp_path_factory, data):
    """The raw text of real events, truncated or with bytes overwritten: the streaming reader
    and the whole-file reader never raise anything but ``InputError``."""
    text = _render(EVENTS_DOC)
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, len(text) - 1))
        text = text[:i] + data.draw(st.binary(min_size=0, max_size=3)) + text[i + 1:]
    if data.draw(st.booleans()):
        text = text[:data.draw(st.integers(1, len(text)))]
    path = tmp_path_factory.mktemp("fuzz") / "rank1.json"
    path.write_bytes(text)
    _ingest_checked(path)


# -- run.json --------------------------------------------------------------------------------

@FUZZ
@given(doc=mutated(RUN_DOC))
def test_run_json_reader_on_mutated_run_json(tmp_path_factory, doc):
    run = tmp_path_factory.mktemp("run")
    (run / "run.json").write_bytes(_render(doc))
    with _Bounded():
        try:
            info = read_run_info(run)
        except OURS:
            return
        assert info.world_size <= MAX_WORLD_SIZE
        assert len(info.default_group.ranks) == info.world_size
        for rank in info.coordinates:
            assert rank < info.world_size
            info.groups_of(rank), info.stage_peers(rank)
        assert all(r < info.world_size for g in info.process_groups for r in g.ranks)
        gathered = inputs.gather(run)
        assert gathered.run is not None or gathered.problems


# -- Flight Recorder dumps -------------------------------------------------------------------

@FUZZ
@given(doc=mutated(DUMP_DOC))
def test_dump_reader_on_mutated_dumps(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("comms") / "rank1.json"
    path.write_bytes(_render(doc))
    dump = _accepted(read_dump, path)
    if dump is not None:
        assert dump.rank == 1
        hangs.diagnose(FlightRecords.of([dump, read_dump(SAMPLE / "comms" / "rank0.json")]),
                       None, pd.DataFrame())


def _as_pickle(doc) -> bytes:
    """The sample dump's ``flight_recorder`` part as PyTorch pickles it (tuples included)."""
    fr = copy.deepcopy(doc["flight_recorder"])
    for e in fr["entries"]:
        e["process_group"] = tuple(e["process_group"])
    return pickle.dumps(fr, protocol=pickle.HIGHEST_PROTOCOL)


@FUZZ
@given(data=st.data())
def test_pickle_loader_on_damaged_pickles(tmp_path_factory, data):
    raw = bytearray(_as_pickle(DUMP_DOC))
    for _ in range(data.draw(st.integers(1, 6))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(1, len(raw)))]
    path = tmp_path_factory.mktemp("fr") / "rank1.pkl"
    path.write_bytes(bytes(raw))
    dump = _accepted(load_pickle_dump, path)
    assert dump is None or isinstance(dump, dict)
    # Read as the analysis reads PyTorch's own dumps: typed, then judged beside a sound rank.
    typed = _accepted(lambda p: read_torch_dump(p, 1, "pickle"), path)
    if typed is not None:
        assert typed.rank == 1
        hangs.diagnose(FlightRecords.of([typed, read_dump(SAMPLE / "comms" / "rank0.json")]),
                       None, pd.DataFrame())


@FUZZ
@given(doc=mutated(DUMP_DOC["flight_recorder"]))
def test_torch_json_dump_reader_on_mutated_dumps(tmp_path_factory, doc):
    """PyTorch's JSON form of a dump (``_dump_fr_trace_json``), mutated, read as a folder of
    them is: refused with one of our errors, or typed and judged."""
    path = tmp_path_factory.mktemp("fr") / "_dump_1.json"
    path.write_bytes(_render(doc))
    dump = _accepted(lambda p: read_torch_dump(p, 1, "json"), path)
    if dump is not None:
        hangs.diagnose(FlightRecords.of([dump, read_dump(SAMPLE / "comms" / "rank0.json")]),
                       None, pd.DataFrame())


def test_the_undamaged_documents_are_accepted(tmp_path):
    """The fuzzers start from documents the readers accept (so a refusal is the mutation's)."""
    (tmp_path / "run.json").write_bytes(_render(RUN_DOC))
    assert read_run_info(tmp_path).world_size == 4
    (tmp_path / "rank1.json").write_bytes(_render(DUMP_DOC))
    assert read_dump(tmp_path / "rank1.json").rank == 1
    (tmp_path / "rank1.pkl").write_bytes(_as_pickle(DUMP_DOC))
    assert load_pickle_dump(tmp_path / "rank1.pkl")["entries"]
    (tmp_path / "rank1.json.gz").write_bytes(gzip.compress(_render(EVENTS_DOC)))
    trace = ingest.load_trace(tmp_path / "rank1.json.gz")
    assert trace.problems == [] and len(trace.events) == sum(
        1 for e in EVENTS_DOC["traceEvents"] if e.get("ph") == "X")
