"""Serving the dashboard safely: which folders it serves, what it answers to requests naming
other paths, what a damaged report shows, where it binds, and a run analysed on first open.

The runs folder is built per test from the shipped samples: analysed runs, a sweep folder, a
folder that is not a run, a hidden one, a symbolic link leading out of the folder and one
staying inside. Pages are asked for through Dash's own callback endpoint (the request the
browser sends), so what is checked is what a browser would receive.
"""
from __future__ import annotations

import contextlib
import http.client
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest

from meshscope.dashboard.app import create_app, page_request
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.server import path_allowed

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SAMPLE = "dp2-pp2-1f1b"
NO_TRACES = shutil.ignore_patterns("traces", ".cache")


def _runs_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(SAMPLES / SAMPLE, root / "a-run", ignore=NO_TRACES)
    for name in ("dp4-ddp", SAMPLE):
        shutil.copytree(SAMPLES / name, root / "sweep-w4" / name, ignore=NO_TRACES)
    (root / "not-a-run" / "notes").mkdir(parents=True)
    shutil.copytree(SAMPLES / SAMPLE, root / ".hidden", ignore=NO_TRACES)
    outside = tmp_path / "elsewhere" / "secret-run"
    shutil.copytree(SAMPLES / "dp4-ddp", outside, ignore=NO_TRACES)
    (root / "link-out").symlink_to(outside, target_is_directory=True)
    (root / "link-in").symlink_to(root / "sweep-w4" / "dp4-ddp", target_is_directory=True)
    return root


@pytest.fixture
def runs_folder(tmp_path):
    return _runs_folder(tmp_path)


def test_index_serves_runs_and_sweeps_only(runs_folder):
    index = RunIndex(runs_folder)
    # link-in reaches sweep-w4/dp4-ddp again (served once, under its own name); link-out
    # leads outside the folder; .hidden and not-a-run are no runs.
    assert sorted(index.runs) == ["a-run", "sweep-w4/dp2-pp2-1f1b", "sweep-w4/dp4-ddp"]
    assert index.sweeps == {"sweep-w4": ["sweep-w4/dp2-pp2-1f1b", "sweep-w4/dp4-ddp"]}
    assert index.runs["a-run"].sweep is None
    assert all(e.path.is_relative_to(runs_folder.resolve()) for e in index.runs.values())


@pytest.mark.parametrize("run_id", ["../a-run", "/etc/passwd", str(SAMPLES / SAMPLE),
                                    "a-run/../a-run", "%2e%2e%2fa-run", "a-run/report",
                                    "link-out", "sweep-w4", "not-a-run", ".hidden", "",
                                    None, 3, ["a-run"]])
def test_ids_that_are_not_served_runs_get_nothing(runs_folder, run_id):
    assert RunIndex(runs_folder).get(run_id) is None


def _page(app, path: str, search: str) -> str:
    """What the browser receives for the page at ``path?search`` (Dash's callback request)."""
    r = app.server.test_client().post("/_dash-update-component",
                                      json=page_request(app, path, search))
    assert r.status_code == 200
    return r.get_data(as_text=True).replace("\\u002f", "/")   # Dash's JSON writes / as \u002f


@pytest.mark.parametrize("search", ["?run=../a-run", "?run=/etc/passwd", "?run=link-out",
                                    "?run=%2e%2e%2Fa-run", "?run=sweep-w4", "?run=nope"])
def test_unknown_run_id_gives_the_unknown_run_message(runs_folder, search):
    text = _page(create_app(runs_folder), "/overview", search)
    assert "Unknown run: there is no run of that name in this dashboard" in text
    assert "breakdown-graph" not in text and str(runs_folder.parent) not in text


def test_no_run_gives_the_no_run_message(runs_folder):
    text = _page(create_app(runs_folder), "/overview", "")
    assert "No run selected: pick one on the Runs page." in text


def test_a_served_run_shows_its_numbers(runs_folder):
    text = _page(create_app(runs_folder), "/overview", "?run=sweep-w4/dp4-ddp")
    assert '"id":"breakdown-graph"' in text and '"dp=4"' in text


@pytest.mark.parametrize("damage", ["summary", "table"])
def test_damaged_report_says_unreadable_and_shows_no_path_or_exception(runs_folder, damage):
    report = runs_folder / "a-run" / "report"
    if damage == "summary":
        (report / "summary.json").write_text('{"schema_version": 2, "ranks": [0, ')
    else:
        (report / "breakdown.parquet").write_bytes(b"PAR1 this is not parquet")
    text = _page(create_app(runs_folder), "/overview", "?run=a-run")
    # --no-cache: a plain re-run would reuse the damaged report (its key still matches)
    assert "Report unreadable — run `meshscope analyze --no-cache a-run` to rewrite it" in text
    for leak in (str(runs_folder), str(ROOT), "Traceback", "Error", "Exception", "parquet"):
        assert leak not in text, leak


@pytest.mark.parametrize("raw,decoded,ok", [
    ("/", "/", True), ("/overview?run=a", "/overview", True),
    ("/_dash-update-component", "/_dash-update-component", True),
    ("/_dash-component-suites/dash/deps/react@18.v3_0_0m1.min.js",
     "/_dash-component-suites/dash/deps/react@18.v3_0_0m1.min.js", True),
    ("/export/html?run=a", "/export/html", True),
    ("/../etc/passwd", "/../etc/passwd", False),
    ("/%2e%2e/etc/passwd", "/../etc/passwd", False),
    ("/..%2fetc%2fpasswd", "/../etc/passwd", False),
    ("/%252e%252e/run.json", "/%2e%2e/run.json", False),
    ("/assets/..\\run.json", "/assets/..\\run.json", False),
    ("//etc/passwd", "//etc/passwd", False),
    ("/etc/passwd", "/etc/passwd", False),
    ("/samples/dp4-ddp/run.json", "/samples/dp4-ddp/run.json", False),
    ("/_dash-component-suites/../../run.json", "/_dash-component-suites/../../run.json",
     False),
    ("/overview%00", "/overview\x00", False),
])
def test_guard_lets_through_only_the_apps_own_paths(raw, decoded, ok):
    assert path_allowed(raw, decoded) is ok


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(runs_dir, log: pathlib.Path, *extra):
    """``meshscope dashboard RUNS_DIR`` on a free port, its log in ``log``: (process, port);
    stopped on exit."""
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "meshscope", "dashboard",
                                 str(runs_dir), "--port", str(port), *extra], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dashboard exited {proc.returncode}:\n{log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"dashboard did not answer in 60 s:\n{log.read_text()}")
                time.sleep(0.2)
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _get(port, raw_path, method="GET"):
    """One request with the path sent exactly as written (no client-side normalising)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.putrequest(method, raw_path, skip_accept_encoding=True)
    c.endheaders()
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body, dict(r.getheaders())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server over a runs folder for the tests that only read."""
    root = _runs_folder(tmp_path_factory.mktemp("served"))
    with served(root, root.parent / "server.log") as (proc, port):
        yield proc, port, root


def test_server_binds_loopback_by_default_and_says_so(server):
    proc, port, root = server
    listening = [c.laddr for c in psutil.Process(proc.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening and all(a.ip == "127.0.0.1" and a.port == port for a in listening)
    log = (root.parent / "server.log").read_text()
    assert f"meshscope dashboard on http://127.0.0.1:{port}/ over {root}" in log


@pytest.mark.parametrize("raw", [
    "/../run.json", "/%2e%2e/%2e%2e/etc/passwd", "/..%2f..%2f..%2fetc%2fpasswd",
    "/a-run/run.json", "/a-run/report/summary.json", "/link-out/run.json", "/etc/passwd",
    "/assets/../../run.json", "/_dash-component-suites/../../../../etc/passwd",
    "//etc/passwd", "/%252e%252e/run.json", "/export/html/../../run.json",
])
def test_requests_for_other_paths_get_nothing(server, raw):
    _, port, _ = server
    status, body, _ = _get(port, raw)
    assert status == 404 and body == b"not found\n"


def test_a_script_dash_does_not_serve_is_not_found_and_logs_no_traceback(server):
    """Issue 46, case 11: a bogus component-suite path answered 500 with a traceback in the
    log (Dash's DependencyException); it is a 404 like any other unknown path."""
    _, port, root = server
    for raw in ("/_dash-component-suites/dash/deps/nope.js",
                "/_dash-component-suites/dash/dcc/nope.js.map"):
        status, body, _ = _get(port, raw)
        assert (status, body) == (404, b"not found\n"), raw
    assert "Traceback" not in (root.parent / "server.log").read_text()


@pytest.mark.parametrize("query", ["?run=../a-run", "?run=link-out", "?run=/etc/passwd",
                                   "?run=%2e%2e%2fa-run", "?run=sweep-w4", ""])
def test_exports_of_other_paths_get_nothing(server, query):
    _, port, _ = server
    for kind in ("html", "perfetto"):
        status, body, _ = _get(port, f"/export/{kind}{query}")
        assert status == 404 and body == b"unknown or unanalysed run\n"


def test_pages_and_exports_of_a_served_run(server):
    _, port, root = server
    status, body, headers = _get(port, "/overview?run=a-run")
    assert status == 200 and b"<title>meshscope</title>" in body
    assert headers.get("X-Frame-Options") == "DENY"
    assert headers.get("Server") == "meshscope"          # no framework or version named
    status, body, headers = _get(port, "/export/html?run=a-run")
    assert status == 200 and body.startswith(b"<!DOCTYPE html>")
    assert str(root).encode() not in body
    assert _get(port, "/overview", method="PUT")[0] == 405


@pytest.mark.slow
def test_a_run_not_analysed_is_analysed_on_first_open(tmp_path):
    """A run directory with traces and no report: opening it starts `meshscope analyze`, the
    page shows the progress, then the report."""
    root = tmp_path / "runs"
    shutil.copytree(SAMPLES / SAMPLE, root / "fresh", ignore=shutil.ignore_patterns("report"))
    app = create_app(root)
    first = _page(app, "/overview", "?run=fresh")
    assert "This run had not been analysed yet" in first and "analysis-progress" in first
    assert '"disabled":false' in first.replace(" ", "")      # the page polls
    deadline = time.monotonic() + 300
    while not (root / "fresh" / "report" / "summary.json").is_file():
        assert time.monotonic() < deadline, "analysis did not finish in 300 s"
        time.sleep(1)
    text = ""
    while time.monotonic() < deadline:
        text = _page(app, "/overview", "?run=fresh")
        if "breakdown-graph" in text or "analysis failed" in text:
            break
        time.sleep(1)
    assert '"id":"breakdown-graph"' in text, text[-2000:]
    assert str(root) not in text


def test_not_a_directory_is_refused_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "meshscope", "dashboard",
                           str(tmp_path / "nope")], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ})
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"meshscope: error: {tmp_path / 'nope'}: no such directory"


def test_an_analysis_that_fails_says_why_without_server_paths(tmp_path):
    """A run of which nothing can be analysed (every trace cut to garbage, no step timers or
    Flight Recorder dumps to fall back on): the analysis started on first open fails, and the
    page gives its one-line reason with the runs folder taken out."""
    root = tmp_path / "runs"
    shutil.copytree(SAMPLES / SAMPLE, root / "broken",
                    ignore=shutil.ignore_patterns("report", "comms", "steps"))
    for f in (root / "broken" / "traces").iterdir():
        f.write_bytes(b"\x1f\x8b not really gzip")
    app = create_app(root)
    text = _page(app, "/overview", "?run=broken")
    deadline = time.monotonic() + 120
    while "analysis failed" not in text and time.monotonic() < deadline:
        time.sleep(0.5)
        text = _page(app, "/overview", "?run=broken")
    assert "The analysis failed: " in text and "rank0.json.gz" in text
    assert str(root) not in text and str(tmp_path) not in text and "Traceback" not in text
