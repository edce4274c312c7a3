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
    b'[{"ph": "X"}]',                                   # legacy array layout: no traceEvents
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


def test_typed_decoder_is_used_on_real_traces(monkeypatch):
    """The generic (slow) decoder is only for odd events: real traces never need it."""
    def refuse(text):
        raise AssertionError("the lenient decoder was used")

    monkeypatch.setattr(ingest, "_lenient", refuse)
    ingest.load_trace(ROOT / "samples" / "dp2-pp2-1f1b" / "traces" / "rank0.json.gz")
    ingest.load_trace(shared_trace("gpu/hta/nccl_parser_config/nccl_data.json.gz"))


def test_decode_errors_are_msgspec_errors():
    with pytest.raises(msgspec.DecodeError):
        ingest._decode(b'[{"ph": "X"}, {')
    assert ingest._decode(b'[1, {"ph": "X", "args": [1]}]')[0].ph == "X"
    empty = ingest.to_frame(ingest.SCHEMA.empty_table())
    assert list(empty.columns) == ingest.SCHEMA.names and empty.empty
    assert str(empty["msg_bytes"].dtype) == "Int64" and str(empty["seq"].dtype) == "int64"
