"""Every ``meshscope`` command × each exit code it documents × representative inputs — good,
damaged, absent, an unmeasured quantity, a zero baseline, three runs — through the command line
(issue 52 item 6). The documented codes: 0 done; 1 a ``compare --fail-if`` condition failed
(docs/compare.md); 2 bad input, one line ``meshscope: error: …`` on stderr (cli/common.py,
docs/damaged-input.md), click's usage errors included. A traceback anywhere, or any exception
other than the ``SystemExit`` that carries the code, fails the cell.

The cells run in-process through click's ``CliRunner`` — the same ``main`` group the
``meshscope`` executable calls, minus its process exit — on copies of the shipped ``samples/``
(their reports are reused, nothing is re-analysed, and nothing is written into samples/); a few
run the real entry point in a fresh interpreter (``python -m meshscope``), and the dashboard's
clean shutdown is watched on a real server process."""
from __future__ import annotations

import gzip
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from conftest import ROOT, meshscope
from meshscope.cli import main

SAMPLES = ("dp2-pp2-1f1b", "dp2-pp2-slow-rank1", "dp4-ddp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    """Copies of three shipped samples (reports included), a run whose report is damaged, a
    folder of damaged traces, an empty folder, a bad model file: the grid's inputs."""
    root = tmp_path_factory.mktemp("grid")
    for name in SAMPLES:
        shutil.copytree(ROOT / "samples" / name, root / name)
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", root / "damaged-report")
    (root / "damaged-report" / "report" / "breakdown.parquet").write_bytes(b"not parquet")
    broken = root / "damaged-traces"
    broken.mkdir()
    (broken / "rank0.json").write_text('{"traceEvents": [{"ph": "X", "na')
    (broken / "rank1.json.gz").write_bytes(gzip.compress(b"")[:10])
    (root / "empty").mkdir()
    (root / "model.json").write_text("{not json")
    (root / "a-file").write_text("a file, not a folder")
    return root


@dataclass(frozen=True)
class Cell:
    command: str
    case: str
    args: tuple[str, ...]       # {R}: the runs folder of the fixture
    code: int
    needle: str = ""            # in stderr (exit 2) or stdout (exit 0 and 1)


R = "{R}"
GOOD, SLOW, DDP = f"{R}/dp2-pp2-1f1b", f"{R}/dp2-pp2-slow-rank1", f"{R}/dp4-ddp"
CELLS = [
    # analyze
    Cell("analyze", "good", ("analyze", GOOD), 0, "step"),
    Cell("analyze", "absent", ("analyze", f"{R}/absent-a"), 2,
         "absent-a: no such file or directory"),
    Cell("analyze", "damaged traces", ("analyze", f"{R}/damaged-traces"), 2, "truncated"),
    Cell("analyze", "no traces", ("analyze", f"{R}/empty"), 2, "no trace files"),
    Cell("analyze", "bad flag", ("analyze", GOOD, "--rank-regex", "("), 2, "--rank-regex"),
    # compare: the gate's three outcomes, each cause of exit 2
    Cell("compare", "good, no gate", ("compare", GOOD, SLOW), 0, "step"),
    Cell("compare", "regression beyond noise",
         ("compare", GOOD, SLOW, "--fail-if", "step_time>+5%"), 1, "FAIL: step_time>+5%"),
    Cell("compare", "improvement", ("compare", SLOW, GOOD, "--fail-if", "step_time>+5%"), 0,
         "pass"),
    Cell("compare", "same run", ("compare", GOOD, GOOD, "--fail-if", "step_time>+5%"), 0,
         "pass"),
    Cell("compare", "three runs, one regressed",
         ("compare", GOOD, GOOD, SLOW, "--fail-if", "step_time>+5%"), 1,
         "[dp2-pp2-slow-rank1] FAIL"),
    Cell("compare", "three runs, none regressed",
         ("compare", SLOW, GOOD, GOOD, "--fail-if", "step_time>+5%"), 0, "pass"),
    Cell("compare", "unmeasured quantity",
         ("compare", GOOD, SLOW, "--fail-if", "idle.sync>+1ms"), 2, "does not measure idle.sync"),
    Cell("compare", "unmeasured, allowed",
         ("compare", GOOD, SLOW, "--fail-if", "idle.sync>+1ms", "--allow-unmeasured"), 0,
         "not checked"),
    Cell("compare", "zero baseline",
         ("compare", DDP, DDP, "--fail-if", "exposed_comm.pp>+10%"), 2,
         "a change relative to it has no meaning"),
    Cell("compare", "zero baseline, absolute change",
         ("compare", DDP, DDP, "--fail-if", "exposed_comm.pp>+1ms"), 0, "pass"),
    Cell("compare", "misspelt quantity", ("compare", GOOD, SLOW, "--fail-if", "step_tim>+5%"),
         2, "step_time"),
    Cell("compare", "wrong unit", ("compare", GOOD, SLOW, "--fail-if", "step_time>+5GiB"), 2,
         "step_time"),
    Cell("compare", "one run", ("compare", GOOD), 2, "two or more runs"),
    Cell("compare", "absent", ("compare", GOOD, f"{R}/absent-c"), 2, "absent-c"),
    Cell("compare", "damaged report", ("compare", GOOD, f"{R}/damaged-report"), 2,
         "not readable parquet"),
    Cell("compare", "damaged traces", ("compare", GOOD, f"{R}/damaged-traces"), 2,
         "truncated"),
    Cell("compare", "unwritable --junit",
         ("compare", GOOD, SLOW, "--junit", f"{R}/a-file/gate.xml"), 2, "cannot write"),
    # report (the static HTML)
    Cell("report", "good", ("report", GOOD, "--html", f"{R}/good.html"), 0, "report written"),
    Cell("report", "absent", ("report", f"{R}/absent-r", "--html", f"{R}/x.html"), 2,
         "absent-r: no such directory"),
    Cell("report", "damaged report", ("report", f"{R}/damaged-report", "--html", f"{R}/x.html"),
         2, "meshscope analyze --no-cache"),
    Cell("report", "damaged traces",
         ("report", f"{R}/damaged-traces", "--html", f"{R}/x.html"), 2, "truncated"),
    Cell("report", "unwritable", ("report", GOOD, "--html", f"{R}/a-file/x.html"), 2,
         "cannot write"),
    # export (Perfetto)
    Cell("export", "good", ("export", GOOD, "--perfetto", f"{R}/good.json.gz"), 0,
         "trace written"),
    Cell("export", "absent", ("export", f"{R}/absent-e", "--perfetto", f"{R}/x.json"), 2,
         "absent-e: no such directory"),
    Cell("export", "damaged traces",
         ("export", f"{R}/damaged-traces", "--perfetto", f"{R}/x.json"), 2, "rank0.json"),
    Cell("export", "unwritable", ("export", GOOD, "--perfetto", f"{R}/a-file/x.json"), 2,
         "cannot write"),
    # schema
    Cell("schema", "good", ("schema", "summary"), 0, "$schema"),
    Cell("schema", "unknown document", ("schema", "nope"), 2, "nope"),
    # plan
    Cell("plan", "good", ("plan", "--world", "4"), 0, "layout"),
    Cell("plan", "absent model file", ("plan", "--model-json", f"{R}/nope.json"), 2,
         "does not exist"),
    Cell("plan", "damaged model file", ("plan", "--model-json", f"{R}/model.json", "--world",
                                        "4"), 2, "model.json"),
    Cell("plan", "unknown model", ("plan", "--model", "nope", "--world", "4"), 2, "nope"),
    # the training commands: refused before any process starts
    Cell("run", "impossible layout", ("run", "--layout", "dp=2,pp=64", "--out", f"{R}/r"), 2,
         "pp=64"),
    Cell("run", "unknown schedule", ("run", "--schedule", "zigzag", "--out", f"{R}/r"), 2,
         "zigzag"),
    Cell("sweep", "unknown dimension", ("sweep", "--world", "4", "--dims", "dp,xx", "--out",
                                        f"{R}/s"), 2, "xx"),
    Cell("bench-comm", "bad sizes", ("bench-comm", "--sizes", "lots", "--out", f"{R}/b"), 2,
         "LOTS"),
    Cell("demo", "out is a file", ("demo", "--out", f"{R}/a-file", "--no-serve"), 2, "a-file"),
    # dashboard (port in use: below)
    # {P}: a port held by the test, so that a cell that should have refused never serves.
    Cell("dashboard", "absent", ("dashboard", f"{R}/absent-d", "--port", "{P}"), 2,
         "absent-d: no such directory"),
    Cell("dashboard", "a file", ("dashboard", f"{R}/a-file", "--port", "{P}"), 2, "a-file"),
    # history, index, query, mcp (issue 50; docs/history.md, docs/agents.md)
    Cell("history", "good", ("history", GOOD, SLOW, DDP), 0, "kept apart: dp4-ddp"),
    Cell("history", "regression against the baseline",
         ("history", GOOD, SLOW, "--fail-if", "step_time>+5%"), 1, "FAIL: step_time>+5%"),
    Cell("history", "misspelt quantity", ("history", GOOD, SLOW, "--fail-if", "step_tim>+5%"),
         2, "did you mean 'step_time'"),
    Cell("history", "no report", ("history", f"{R}/empty"), 2, "holds no analysed report"),
    Cell("index", "add", ("index", "add", GOOD, "--index", f"{R}/grid-index.sqlite"), 0,
         "1 added"),
    Cell("index", "add absent", ("index", "add", f"{R}/absent-i", "--index",
                                 f"{R}/grid-index.sqlite"), 2, "not a folder"),
    Cell("index", "list, no index", ("index", "list", "--index", f"{R}/none.sqlite"), 2,
         "no index here"),
    Cell("query", "no index", ("query", "SELECT 1", "--index", f"{R}/none.sqlite"), 2,
         "no index here"),
    Cell("mcp", "no root", ("mcp",), 2, "--root"),
    Cell("mcp", "reports inside a root", ("mcp", "--root", R, "--reports", f"{R}/server"), 2,
         "must lie outside"),
]


def invoke(args, runs_dir: pathlib.Path, port: int = 0):
    """``meshscope ARGS`` in this process: the result, after checking that it ended by
    ``SystemExit`` (or returned) and printed no traceback."""
    result = CliRunner().invoke(main, [a.replace(R, str(runs_dir)).replace("{P}", str(port))
                                       for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{type(result.exception).__name__}: {result.exception}\n{result.output[-3000:]}"
    assert "Traceback" not in result.output, result.output[-3000:]
    return result


@pytest.fixture(scope="module")
def held_port():
    """A port held by a listening socket of this module."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{c.command}:{c.case}")
def test_exit_code(cell: Cell, runs, held_port):
    result = invoke(cell.args, runs, held_port)
    shown = result.stderr if cell.code == 2 else result.stdout
    assert result.exit_code == cell.code, \
        f"exit {result.exit_code}, not {cell.code}\n{result.output[-3000:]}"
    assert cell.needle in shown, shown[-3000:]
    if cell.code == 2:
        # One line naming the problem: meshscope's own, or click's usage error ("Error: …",
        # after its usage lines); a note before it (e.g. "analysing it first") is allowed.
        errors = [line for line in result.stderr.splitlines()
                  if line.startswith(("meshscope: error: ", "Error: "))]
        assert len(errors) == 1 and cell.needle in errors[0], result.stderr
    assert not (runs / "absent-a").exists(), "a refused analysis left a folder behind"


# Commands being added while this grid was written: their cells come with them.
BEING_ADDED: set[str] = set()


def test_every_command_is_in_the_grid():
    """A command added without cells here fails this test (and the grid's promise)."""
    covered = {c.command for c in CELLS}
    assert covered <= set(main.list_commands(None))
    assert set(main.list_commands(None)) - covered <= BEING_ADDED


def test_every_documented_code_of_compare_is_reached():
    assert {c.code for c in CELLS if c.command == "compare"} == {0, 1, 2}


def test_dashboard_on_a_port_in_use_is_one_line_and_exit_2(runs, held_port):
    result = invoke(("dashboard", f"{R}/dp2-pp2-1f1b", "--port", "{P}"), runs, held_port)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [f"meshscope: error: cannot serve on 127.0.0.1:{held_port} "
                      f"(Address already in use)"], result.stderr


# The real entry point (python -m meshscope), as a shell or CI job sees it.

def test_the_executable_exits_1_on_a_regression_and_2_on_bad_input(runs):
    regression = meshscope("compare", runs / "dp2-pp2-1f1b", runs / "dp2-pp2-slow-rank1",
                           "--fail-if", "step_time>+5%")
    assert regression.returncode == 1, regression.stderr
    zero = meshscope("compare", runs / "dp4-ddp", runs / "dp4-ddp",
                     "--fail-if", "exposed_comm.pp>+10%")
    assert zero.returncode == 2 and "Traceback" not in zero.stderr, zero.stderr
    assert zero.stderr.startswith("meshscope: error: --fail-if 'exposed_comm.pp>+10%'"), \
        zero.stderr


def test_the_dashboard_stops_cleanly_on_sigterm(runs, tmp_path):
    """Served on a free port, stopped as a service manager stops it (SIGTERM): exit 0, no
    traceback, the port free again."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    log = tmp_path / "dashboard.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "meshscope", "dashboard",
                                 str(runs / "dp2-pp2-1f1b"), "--port", str(port)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and "error" not in text.lower(), text
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))          # free: the server closed its socket
