"""Issue 46, case 9: an uncompressed trace is streamed like a compressed one, never held whole.

``trace_file.read_bytes`` compresses a plain ``.json`` trace as it reads it (``Packed``), and
from then on it is read as a ``.json.gz`` is: inflated a piece at a time. White space — the
issue's gigabyte of it in a ``.pt.trace.json`` cost 1.14 GB of RSS — costs no memory wherever
JSON allows it: before the document, between events, after the document
(``json_stream``). Measured on the command itself, as ``tests/test_hostile_memory.py`` does: a
trace padded with ~200 MB of white space is analysed in the memory of the same trace unpadded,
and into the same report; the samples' traces, uncompressed, give the reports of the
``.json.gz`` files.
"""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT
from meshscope.analysis.ingest import decode
from meshscope.analysis.ingest import json_stream
from meshscope.analysis.ingest import trace_file
from test_hostile_memory import WRAPPER      # a command's peak RSS with its workers'

SAMPLE = ROOT / "samples" / "dp2-pp2-1f1b"
PAD = 200 << 20                  # white space added to the padded trace, in three runs


def _analyze_measured(folder, out) -> int:
    """``meshscope analyze folder --out out`` under a wrapper: the largest resident set of the
    command and any worker it started (``RUSAGE_CHILDREN``), in bytes."""
    r = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, "-m", "meshscope",
                        "analyze", str(folder), "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return int(r.stdout.rsplit("MAXRSS_KB=", 1)[1]) * 1024


def _report(folder) -> tuple[dict, dict]:
    """(summary.json without ``generated`` and ``source``, every table) of a report."""
    summary = json.loads((folder / "summary.json").read_text())
    summary.pop("generated")
    summary.pop("source")
    return summary, {p.name: pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))}


def _assert_same_report(a, b) -> None:
    (sa, ta), (sb, tb) = _report(a), _report(b)
    assert sa == sb
    assert sorted(ta) == sorted(tb) and ta
    for name in ta:
        pd.testing.assert_frame_equal(ta[name], tb[name], obj=name)


def _write_padded(path, text: bytes, pad: int) -> None:
    """``text`` with ``pad`` bytes of white space in three runs: before the document, between
    two events and after the document."""
    cut = text.index(b"},", len(text) // 2) + 2
    block = b" \n\t\r" * (1 << 18)
    with open(path, "wb") as f:
        for piece in (b"", text[:cut], text[cut:]):
            f.write(piece)
            for _ in range(pad // 3 // len(block)):
                f.write(block)


def test_a_trace_padded_with_200_mb_of_white_space_costs_no_memory(tmp_path):
    """The issue's case, scaled: the padded file is read in the memory of the unpadded one
    (the growth well under a quarter of the file; it was the whole file, and more) and gives
    its report."""
    work = tmp_path / "padded"
    try:
        folder = work / "traces"
        folder.mkdir(parents=True)
        trace = folder / "rank0.pt.trace.json"
        text = gzip.decompress((SAMPLE / "traces" / "rank0.json.gz").read_bytes())
        trace.write_bytes(text)
        plain_peak = _analyze_measured(folder, work / "plain")
        _write_padded(trace, text, PAD)               # the same file name: the same report
        size = trace.stat().st_size
        assert size > PAD
        padded_peak = _analyze_measured(folder, work / "report")
        print(f"peak RSS: {plain_peak / 2**20:.0f} MiB for {len(text) / 2**20:.1f} MiB of "
              f"trace, {padded_peak / 2**20:.0f} MiB padded to {size / 2**20:.0f} MiB")
        assert padded_peak - plain_peak < size / 4, (plain_peak, padded_peak, size)
        _assert_same_report(work / "plain", work / "report")
    finally:
        shutil.rmtree(work, ignore_errors=True)       # 200 MB: not kept with the temp folders


def test_the_samples_uncompressed_give_the_reports_of_the_compressed(tmp_path):
    """Real traces: each of a sample's ``.json.gz`` gunzipped to ``.json`` (the run folder
    otherwise as it is) gives the same report, table for table."""
    from click.testing import CliRunner
    from meshscope.cli import main

    plain = tmp_path / "plain"
    shutil.copytree(SAMPLE, plain, ignore=shutil.ignore_patterns("report"))
    for gz in sorted((plain / "traces").glob("*.json.gz")):
        gz.with_name(gz.name[:-3]).write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    for folder, out in ((SAMPLE, tmp_path / "gz-report"), (plain, tmp_path / "plain-report")):
        r = CliRunner().invoke(main, ["analyze", str(folder), "--out", str(out), "--no-cache"])
        assert r.exit_code == 0, r.output
    _assert_same_report(tmp_path / "gz-report", tmp_path / "plain-report")


def test_a_plain_file_is_held_compressed(tmp_path):
    """``read_bytes``: a plain file's text compressed as it is read (``Packed``, its size
    kept), a ``.json.gz`` as it is stored; both stream to the same text."""
    text = gzip.decompress((SAMPLE / "traces" / "rank1.json.gz").read_bytes())
    plain = tmp_path / "rank1.json"
    plain.write_bytes(text)
    raw = trace_file.read_bytes(plain)
    assert isinstance(raw, trace_file.Packed) and raw.text_bytes == len(text)
    assert len(raw) < len(text) / 5
    assert b"".join(json_stream.chunks(raw)) == text
    stored = (SAMPLE / "traces" / "rank1.json.gz").read_bytes()
    got = trace_file.read_bytes(SAMPLE / "traces" / "rank1.json.gz")
    assert got == stored and not isinstance(got, trace_file.Packed)
    # The whole-file reader (a file that cannot be streamed) gets the text back.
    assert bytes(trace_file.decompress(plain, raw)) == text
    assert trace_file.read_bytes(plain) == raw, "the same file, the same bytes: the cache key"


_EV = b'{"ph":"X","name":"aten::mm","cat":"cpu_op","ts":1,"dur":2,"pid":1,"tid":1}'


def _events_and_meta(raw: bytes, batch_bytes: int = 1 << 12):
    stream = json_stream.EventStream(raw, decode.decode, batch_bytes=batch_bytes)
    events = [(e.name, e.ts) for batch in stream.batches() for e in batch]
    return events, stream.meta


@pytest.mark.parametrize("where", ["before", "before-key", "between", "after-events", "after"])
def test_white_space_anywhere_is_read_as_without_it(where):
    """White space where JSON allows it — more than the reader's limits on the text before
    ``traceEvents`` and after it — reads as the trace without it, streamed."""
    n = 3 * max(json_stream.HEAD_LIMIT, 64 << 20) // 2
    pad = b" \n" * (n // 2)
    parts = dict.fromkeys(["before", "before-key", "between", "after-events", "after"], b"")
    parts[where] = pad
    text = (parts["before"] + b'{"schemaVersion": 1,' + parts["before-key"]
            + b'"traceEvents": [' + _EV + b"," + parts["between"] + _EV + b"]"
            + parts["after-events"] + b', "note": "a  b"}' + parts["after"])
    raw = gzip.compress(text, 1)
    assert _events_and_meta(raw) == ([("aten::mm", 1.0)] * 2,
                                     {"schemaVersion": 1, "note": "a  b"})


def test_white_space_inside_a_string_is_kept():
    """A run of white space that lies inside a string of the metadata is text: kept as it is."""
    spaces = b" " * (3 << 20)
    text = (b'{"note": "' + spaces + b'", "traceEvents": [' + _EV + b'], "tail": "' + spaces
            + b'"}')
    events, meta = _events_and_meta(gzip.compress(text, 1))
    assert len(events) == 1
    assert meta == {"note": spaces.decode(), "tail": spaces.decode()}


def test_white_space_between_events_is_not_held_by_the_parts_reader():
    """The reader of a large trace in parts (``EventStream.parts``, ``ingest/parts.py``) keeps
    a run of white space between events as one space: no part grows with it (a run longer than
    one event's budget was held to that budget, then refused)."""
    events = (_EV + b",") * 2000
    pad = b" " * (96 << 20)
    text = b'{"traceEvents": [' + events + pad + events + pad + _EV + b'], "a": 1}'
    stream = json_stream.EventStream(gzip.compress(text, 1), None, batch_bytes=1 << 16)
    parts = list(stream.parts(1 << 18))
    assert max(len(t) for t, _ in parts) < 1 << 19
    tail = b'], "a": 1}'
    last, is_last = parts[-1]
    assert is_last and last.endswith(tail)
    joined = b"".join(t + (b"" if end else b",") for t, end in parts)[:-len(tail)]
    assert decode.decode(b"[" + joined + b"]") == decode.decode(
        b"[" + (events * 2) + _EV + b"]")
    stream.set_tail(b', "a": 1}')
    assert stream.meta == {"a": 1}
