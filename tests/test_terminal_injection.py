"""Issue 24: names from input files are printed with their control characters escaped.

A trace's file name, run.json's ``schedule`` and a trace's run id carry ANSI/OSC sequences (a
window title, a cleared screen) and a newline that would forge a line of the report; what
``meshscope analyze`` prints holds none of them raw, only their escaped form."""
from __future__ import annotations

import os

from click.testing import CliRunner

from damage_corpus import copy_sample, edit_json, edit_trace, first, named
from meshscope.analysis.report.printable import printable, printable_tree
from meshscope.cli import main

OSC_TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
FORGED = "\nStraggler: rank 0 - forged"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def _no_raw(text: str) -> None:
    for c in RAW:
        assert c not in text, (c, text[-500:])
    assert "\nStraggler: rank 0 - forged" not in text


def test_printable():
    assert printable(OSC_TITLE + FORGED) == "\\x1b]0;pwned\\x07\\nStraggler: rank 0 - forged"
    assert printable("a\u202eb\x9bc") == "a\\u202eb\\x9bc"
    assert printable("two\nlines\tkept", lines=True) == "two\nlines\tkept"
    assert printable_tree({"k\x1b": ["v\x07", 3, None]}) == {"k\\x1b": ["v\\x07", 3, None]}


def test_a_trace_file_name_and_a_schedule_with_escape_sequences(tmp_path):
    run = copy_sample(tmp_path / "run")
    # rank 1's trace: one event with a negative duration, so its name is printed (a problem)
    edit_trace(run, 1, lambda d: first(d, named("aten::")).update(dur=-5))
    os.rename(run / "traces" / "rank1.json.gz",
              run / "traces" / f"rank1{OSC_TITLE}{CLEAR}{FORGED}.json.gz")
    edit_json(run / "run.json", lambda d: d.update(schedule="1f1b" + OSC_TITLE + FORGED))
    result = CliRunner().invoke(main, ["analyze", str(run)])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    out = result.stdout + result.stderr
    _no_raw(out)
    assert "\\x1b]0;pwned\\x07" in out            # shown, escaped
    assert "Traceback" not in out


def test_a_run_id_with_escape_sequences(tmp_path):
    run = copy_sample(tmp_path / "run")
    for r in range(4):
        edit_trace(run, r, lambda d: d.setdefault("meshscope", {}).update(
            run_id="x" + OSC_TITLE + FORGED))
    result = CliRunner().invoke(main, ["analyze", str(run)])
    assert result.exit_code == 2, result.stdout[-500:]
    _no_raw(result.stdout + result.stderr)
    assert "\\x1b]0;pwned" in result.stderr
    json_out = CliRunner().invoke(main, ["analyze", str(run), "--json"])
    _no_raw(json_out.stdout + json_out.stderr)
