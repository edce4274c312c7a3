"""Streaming ingest (``analysis/ingest/json_stream.py``) gives exactly what reading the whole file
gives, whatever the layout of the JSON, and hands anything odd to the whole-file reader; the
nesting check (``json_nesting.py``) and the splitting by hand (``json_split.py``) it relies on."""
import gzip
import json

import msgspec
import pytest

from meshscope.analysis.ingest import decode, event_table
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import json_nesting, json_split, json_stream
from conftest import ROOT, shared_trace


def _whole(raw):
    """The event table and metadata as the whole-file reader makes them."""
    table, _, meta = ingest._parse_whole(ingest.pathlib.Path("x"), raw, batch_events=100)
    return table, meta


def _streamed(raw, batch_bytes):
    stream = json_stream.EventStream(raw, decode.decode, batch_bytes=batch_bytes)
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
    gzip.compress(b'{"traceEvents": []}', mtime=0)[:-6],          # truncated gzip
])
def test_odd_input_falls_back(raw):
    stream = json_stream.EventStream(raw, decode.decode, batch_bytes=16)
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
        real = getattr(decode, name)
        monkeypatch.setattr(decode, name, lambda text, _real=real, _name=name: (
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
    spans = json_split.split_top(text)
    assert [json.loads(text[a:b]) for a, b in spans] == elements
    members = json_split.split_members(json.dumps({"k": elements, "z": 1}).encode())
    assert [(k, json.loads(v)) for k, v in members] == [("k", elements), ("z", 1)]
    deep = b"[" * 100_000 + b"]" * 100_000
    text = b"[1, " + deep + b", 3]"
    assert [text[a:b] for a, b in json_split.split_top(text)] == [b"1", deep, b"3"]
    assert json_split.split_top(b" [ ] ") == []


@pytest.mark.parametrize("text", [b"[1,", b"[1]]", b"x[1]", b"[1] x", b'["abc]', b"[1,,2]",
                                  b"[,]", b"[[1]", b"]", b"", b"{1: 2}"])
def test_split_top_refuses_what_is_not_one_container(text):
    with pytest.raises(msgspec.DecodeError):
        if text.startswith(b"{"):
            json_split.split_members(text)
        else:
            json_split.split_top(text)


@pytest.mark.parametrize("batch_bytes", [64, 4096, 1 << 20])
def test_a_deep_event_is_dropped_whatever_the_batches(batch_bytes, monkeypatch):
    """With the nesting budget raised beyond it, one event nested 10^5 levels deep among 600
    good ones: streamed in batches of any size or read whole, the table is the 600 good events
    and the deep one is counted (past the decoder's own limit)."""
    from meshscope.analysis.ingest import budgets
    monkeypatch.setenv(budgets.ENV["nesting"], str(1_000_000))
    events = _events(300)
    doc = {"traceEvents": events[:100] + ["DEEP"] + events[100:]}
    text = json.dumps(doc).replace('"DEEP"', '{"ph": "X", "args": {"x": ' + "[" * 100_000
                                   + "]" * 100_000 + "}}").encode()
    good, _ = _whole(json.dumps({"traceEvents": events}).encode())
    for table, _ in (_streamed(gzip.compress(text), batch_bytes), _whole(text)):
        assert table.equals(good)
        assert event_table.damage_of(table) == {
            ("traceEvents", "dropped", "nested deeper than the decoder's limit"): 1}


def test_decode_errors_are_msgspec_errors():
    with pytest.raises(msgspec.DecodeError):
        decode.decode(b'[{"ph": "X"}, {')
    assert decode.decode(b'[1, {"ph": "X", "args": [1]}]')[0].ph == "X"
    empty = event_table.to_frame(event_table.SCHEMA.empty_table())
    assert list(empty.columns) == event_table.SCHEMA.names and empty.empty
    assert str(empty["msg_bytes"].dtype) == "Int64" and str(empty["seq"].dtype) == "int64"


# -- issue 24: linear in its input whatever it holds; budgets enforced while reading ----------

_EV = b'{"ph":"X","name":"aten::mm","cat":"cpu_op","ts":1,"dur":2,"pid":1,"tid":1}'


def _hostile(kind: str, n: int) -> bytes:
    if kind == "whitespace":              # a long run of white space between two events
        body = _EV + b"," + b" " * n + _EV
    elif kind == "braces-in-a-string":    # "}," n/2 times inside one event's name
        body = _EV + b',{"ph":"X","name":"' + b"}," * (n // 2) + b'","ts":1,"dur":2}'
    else:                                 # white space before the traceEvents key
        return gzip.compress(b'{' + b" " * n + b'"traceEvents":[' + _EV + b']}', 1)
    return gzip.compress(b'{"traceEvents":[' + body + b']}', 1)


def _work(kind: str, n: int, monkeypatch) -> int:
    """Bytes the reader looked at: white space skipped, text handed to the decoder (every cut
    tried), text searched for the traceEvents key. A quadratic reader looks at ~n²/batch."""
    seen = [0]
    skip, finditer = json_stream._skip, json_stream._KEY.finditer

    def counting_skip(buf, i, first):
        end = skip(buf, i, first)
        seen[0] += end - i
        return end

    class Key:
        def finditer(self, text, *a):
            seen[0] += len(text)
            return finditer(text, *a)

    def counting_decode(text):
        seen[0] += len(text)
        return decode.decode(text)

    monkeypatch.setattr(json_stream, "_skip", counting_skip)
    monkeypatch.setattr(json_stream, "_KEY", Key())
    stream = json_stream.EventStream(_hostile(kind, n), counting_decode, batch_bytes=1 << 16)
    events = [e for batch in stream.batches() for e in batch]
    assert len(events) == (1 if kind == "whitespace-before-key" else 2)
    return seen[0]


@pytest.mark.parametrize("kind", ["whitespace", "braces-in-a-string", "whitespace-before-key"])
def test_reading_is_linear_in_the_input(kind, monkeypatch):
    """Four times the hostile text costs at most about four times the work (the issue: 4, 8 and
    16 MB of white space took 1.7, 3.6 and 11.6 s: quadratic)."""
    small, large = _work(kind, 1 << 20, monkeypatch), _work(kind, 4 << 20, monkeypatch)
    assert large <= 4.5 * small + (1 << 20), (small, large)


def test_a_bomb_is_refused_as_it_inflates():
    """Inflating stops at the budget: what was inflated is never more than budget + one
    piece, and the error names the budget and its flag."""
    import zlib
    from meshscope.analysis.ingest.budgets import BudgetExceeded
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    raw = z.compress(b'{"traceEvents":[') + z.compress(b" " * (64 << 20)) + z.flush()
    got = 0
    with pytest.raises(BudgetExceeded, match="--max-trace-bytes") as e:
        for piece in json_stream.chunks(raw, 1 << 19, limit=8 << 20):
            got += len(piece)
    assert got <= 8 << 20
    assert "8 MiB" in str(e.value)


def test_an_event_past_the_string_budget_is_refused_not_read_whole(monkeypatch):
    from meshscope.analysis.ingest import budgets
    monkeypatch.setenv(budgets.ENV["event_bytes"], str(1 << 20))
    raw = gzip.compress(b'{"traceEvents":[' + _EV + b',{"name":"' + b"x" * (4 << 20)
                        + b'"}]}', 1)
    with pytest.raises(ingest.InputError, match="an event longer than .*--max-event-bytes"):
        ingest._parse(ingest.pathlib.Path("rank0.json.gz"), raw, None)


def test_the_rank_memory_budget(monkeypatch):
    from meshscope.analysis.ingest import budgets
    monkeypatch.setenv(budgets.ENV["rank_memory"], str(64 << 10))
    raw = gzip.compress(b'{"traceEvents":[' + b",".join([_EV] * 20_000) + b']}', 1)
    with pytest.raises(ingest.InputError, match="event table grows beyond 64 KiB.*"
                                                "--max-rank-memory"):
        ingest._parse(ingest.pathlib.Path("rank0.json.gz"), raw, None)


# -- issue 24: the nesting budget, on the text as it is inflated ------------------------------

def _nested(levels: int, leaf) -> list:
    """``leaf`` inside ``levels`` lists: ``levels`` levels deep (by construction)."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


# Strings that would fool a bracket count: brackets, escaped quotes, runs of backslashes.
_TRICKY = ['[[[{{{', 'a\\"]]]}}}', '\\\\', '\\', '"[', '\\"{{{{', '}]}]']


@pytest.mark.parametrize("tricky", _TRICKY)
def test_nesting_counts_brackets_outside_strings_wherever_the_text_is_cut(tricky):
    """A value 7 levels deep whose strings hold brackets, escaped quotes and backslash runs:
    7 levels, whatever two pieces the text is cut into (each cut carries the open string and
    a run of backslashes across)."""
    text = json.dumps(_nested(6, {"k" + tricky: tricky, "x": [tricky]})).encode()
    # 6 lists, the object, its list: 8 levels; the strings add none.
    for cut in range(len(text) + 1):
        nesting = json_nesting.Nesting(1_000)
        nesting.feed(text[:cut])
        nesting.feed(text[cut:])
        assert nesting.deepest == 8, (cut, text)
        assert nesting.depth == 0 and not nesting.in_string


def test_nesting_past_the_budget_is_refused_while_reading():
    """65 levels against the budget of 64: refused, the message naming the budget and the
    flag; 64 levels pass. A trace's event sits 3 levels down (object, traceEvents, event)."""
    from meshscope.analysis.ingest.budgets import BudgetExceeded
    nesting = json_nesting.Nesting(64)
    nesting.feed(json.dumps(_nested(64, 1)).encode())
    assert nesting.deepest == 64
    with pytest.raises(BudgetExceeded, match=r"nested more than 64 levels deep \(budget 64; "
                                             r"raise it with --max-nesting\)"):
        json_nesting.Nesting(64).feed(json.dumps(_nested(65, 1)).encode())


def _deep_trace(levels_in_args: int, where: str = "event") -> bytes:
    deep = _nested(levels_in_args, 1)
    doc = {"traceEvents": [json.loads(_EV)] * 50, "meta": 0}
    if where == "event":
        doc["traceEvents"][10] = {**json.loads(_EV), "args": {"x": deep}}
    else:
        doc["meta"] = deep
    return json.dumps(doc).encode()


@pytest.mark.parametrize("where", ["event", "metadata"])
def test_a_deeply_nested_trace_is_refused_streamed_or_whole(where, monkeypatch):
    """A trace whose one event (or metadata) is nested 100 levels deep is refused at the
    default budget, streamed (gzip) or read whole, naming the budget; with the budget raised
    it is read, all 50 events kept."""
    from meshscope.analysis.ingest import budgets
    path = ingest.pathlib.Path("rank0.json.gz")
    text = _deep_trace(100, where)
    for read in (lambda: ingest._parse(path, gzip.compress(text, 1), None),
                 lambda: ingest._parse_whole(path, text),
                 lambda: ingest._parse_whole(path, gzip.compress(text, 1))):
        with pytest.raises(ingest.InputError, match="nested more than 64 levels deep.*"
                                                    "--max-nesting"):
            read()
    monkeypatch.setenv(budgets.ENV["nesting"], "200")
    table, _, _ = ingest._parse(path, gzip.compress(text, 1), None)
    assert table.num_rows == 50
