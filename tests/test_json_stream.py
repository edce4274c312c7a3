"""Streaming ingest (``analysis/json_stream.py``) gives exactly what reading the whole file gives,
whatever the layout of the JSON, and hands anything odd to the whole-file reader."""
import gzip
import json

import msgspec
import pytest

from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import json_stream
from conftest import ROOT, shared_trace


def _whole(raw):
    """The event table and metadata as the whole-file reader makes them."""
    return ingest._parse_whole(ingest.pathlib.Path("x"), raw, batch_events=100)


def _streamed(raw, batch_bytes):
    stream = json_stream.EventStream(raw, ingest._decode, batch_bytes=batch_bytes)
    return ingest.parse_events(stream.batches()), stream.meta


def _events(n):
    out = []
    for i in range(n):
        out.append({"ph": "X", "cat": "cpu_op", "name": f"op}},{{\"x\": [{i}", "pid": 1,
                    "tid": 2, "ts": 100 + i, "dur": 1 + i % 3,
                    "args": {"nested": {"a": [1, {"b": "},]"}]}, "Input Dims": [[i, 2]]}})
        out.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": 0,
                    "tid": 7, "ts": 101 + i, "dur": 2,
                    "args": {"device": 0, "stream": 7, "correlation": i,
                             "Collective name": "send", "In msg nelems": i, "dtype": "Float",
                             "Group size": 2, "Process Group Ranks": "[0, 1]"}})
        out.append({"ph": "f", "id": i, "ts": 1})
    return out


LAYOUTS = {
    "kineto-like": lambda ev: json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 3},
                                          "traceEvents": ev, "traceName": "t"}, indent=2),
    "compact, events first": lambda ev: json.dumps({"traceEvents": ev, "x": {"y": [1, 2]}},
                                                   separators=(",", ":")),
    "key text inside a string first": lambda ev: json.dumps(
        {"note": 'say "traceEvents": [ here', "traceEvents": ev}),
    "empty array": lambda ev: json.dumps({"a": 1, "traceEvents": [], "b": 2}),
    # Chrome's JSON Array Format: the events alone, with or without the closing bracket.
    "bare array": lambda ev: json.dumps(ev),
    "bare array, unclosed": lambda ev: json.dumps(ev, indent=1)[:-1].rstrip() + ",\n",
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("batch_bytes", [64, 1000, 1 << 20])
def test_stream_equals_whole_file(layout, batch_bytes):
    text = LAYOUTS[layout](_events(300)).encode()
    for raw in (text, gzip.compress(text), gzip.compress(text[:5000]) + gzip.compress(text[5000:])):
        table, meta = _streamed(raw, batch_bytes)
        want_table, want_meta = _whole(raw)
        assert table.equals(want_table) and meta == want_meta
    if layout != "empty array":
        assert table.num_rows == 600


@pytest.mark.parametrize("raw", [
    b'[{"ph": "X"}] x',                                 # a bare array with text after it
    b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1',   # ends inside an event
    b'{"traceEvents": [{"ph": "X", "ts": 1}]',           # ends after the array
    b'{"a": 1}',
    gzip.compress(b'{"traceEvents": []}')[:-6],          # truncated gzip
])
def test_odd_input_falls_back(raw):
    stream = json_stream.EventStream(raw, ingest._decode, batch_bytes=16)
    with pytest.raises(json_stream.Fallback):
        list(stream.batches())


@pytest.mark.parametrize("rel", [
    "gpu/hta/nccl_parser_config/nccl_data.json.gz",
    "gpu/tracelens/traces/b200/eager_trace.json.gz",
    "cpu/hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
])
def test_real_traces_stream_like_whole_file(rel):
    raw = shared_trace(rel).read_bytes()
    table, meta = _streamed(raw, 1 << 16)
    want_table, want_meta = _whole(raw)
    assert table.equals(want_table) and meta == want_meta


@pytest.mark.parametrize("trace", [
    ROOT / "samples" / "dp2-pp2-1f1b" / "traces" / "rank0.json.gz",
    "gpu/hta/nccl_parser_config/nccl_data.json.gz",
    "cpu/hta/cpu_only/hist_05cd72fe_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
])
def test_typed_decoder_is_used_on_real_traces(monkeypatch, trace):
    """The generic and the one-by-one decoders are for odd events only: on real traces every
    batch is decoded typed in one go, and every complete event of the file (counted here by
    the standard library's JSON reader) is in the table, with no problem reported."""
    path = trace if isinstance(trace, ingest.pathlib.Path) else shared_trace(trace)
    calls = []
    for name in ("_lenient", "_one_by_one"):
        real = getattr(ingest, name)
        monkeypatch.setattr(ingest, name, lambda text, _real=real, _name=name: (
            calls.append(_name), _real(text))[1])
    got = ingest.load_trace(path, rank_regex=r"rank-?(\d+)")
    want = sum(1 for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
               if e.get("ph") == "X")
    assert calls == [] and got.problems == []
    assert len(got.events) == want


def test_split_top_finds_the_elements_at_any_depth():
    """Element ranges of hand-made arrays and objects: strings holding brackets, commas and
    escaped quotes, nesting far beyond the decoder's limit; each range decodes (by the standard
    library) to the element json.dumps wrote."""
    elements = [{"a": [1, "],[{"], "b": "x\\\"y"}, 2, "s,]", [[[]]], {}, None]
    text = json.dumps(elements, indent=1).encode()
    spans = json_stream.split_top(text)
    assert [json.loads(text[a:b]) for a, b in spans] == elements
    members = json_stream.split_members(json.dumps({"k": elements, "z": 1}).encode())
    assert [(k, json.loads(v)) for k, v in members] == [("k", elements), ("z", 1)]
    deep = b"[" * 100_000 + b"]" * 100_000
    text = b"[1, " + deep + b", 3]"
    assert [text[a:b] for a, b in json_stream.split_top(text)] == [b"1", deep, b"3"]
    assert json_stream.split_top(b" [ ] ") == []


@pytest.mark.parametrize("text", [b"[1,", b"[1]]", b"x[1]", b"[1] x", b'["abc]', b"[1,,2]",
                                  b"[,]", b"[[1]", b"]", b"", b"{1: 2}"])
def test_split_top_refuses_what_is_not_one_container(text):
    with pytest.raises(msgspec.DecodeError):
        if text.startswith(b"{"):
            json_stream.split_members(text)
        else:
            json_stream.split_top(text)


@pytest.mark.parametrize("batch_bytes", [64, 4096, 1 << 20])
def test_a_deep_event_is_dropped_whatever_the_batches(batch_bytes):
    """One event nested 10^5 levels deep among 600 good ones: streamed in batches of any size
    or read whole, the table is the 600 good events and the deep one is counted."""
    events = _events(300)
    doc = {"traceEvents": events[:100] + ["DEEP"] + events[100:]}
    text = json.dumps(doc).replace('"DEEP"', '{"ph": "X", "args": {"x": ' + "[" * 100_000
                                   + "]" * 100_000 + "}}").encode()
    good, _ = _whole(json.dumps({"traceEvents": events}).encode())
    for table, _ in (_streamed(gzip.compress(text), batch_bytes), _whole(text)):
        assert table.equals(good)
        assert ingest.damage_of(table) == {
            ("traceEvents", "dropped", "nested deeper than the decoder's limit"): 1}


def test_decode_errors_are_msgspec_errors():
    with pytest.raises(msgspec.DecodeError):
        ingest._decode(b'[{"ph": "X"}, {')
    assert ingest._decode(b'[1, {"ph": "X", "args": [1]}]')[0].ph == "X"
    empty = ingest.to_frame(ingest.SCHEMA.empty_table())
    assert list(empty.columns) == ingest.SCHEMA.names and empty.empty
    assert str(empty["msg_bytes"].dtype) == "Int64" and str(empty["seq"].dtype) == "int64"
