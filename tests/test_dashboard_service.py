"""The dashboard as a shared service (issue 24, item 4), against the real server
(``meshscope dashboard`` in a child process, asked over HTTP as a browser would):

- analyses it starts are bounded each: a run whose trace is a FIFO (it never ends) and one
  linked to ``/dev/zero`` (it never stops giving bytes) are named as failed within their
  limits, a good run opened after them is analysed meanwhile, and stopping the server leaves
  no process behind;
- ``Host`` headers other than the allowed names are refused (DNS rebinding), and with a token
  set every request must carry it; binding beyond loopback without one prints a warning;
- pages and exports of a run the server analysed show no server path;
- the Perfetto export refuses a run whose traces resolve outside the run;
- the report cache is bounded in bytes: resident memory after requests over many runs does
  not grow with the number of runs;
- twenty concurrent first requests all answer (no race importing jsonschema).
"""
from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time

import psutil
import pytest
from conftest import processes_under
from test_dashboard_server import SAMPLE, SAMPLES, _get, served

from meshscope.dashboard.app import create_app, page_request
from meshscope.dashboard.server import host_allowed, host_name, token_ok


def _request(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def _page(port, body_app, path, search, headers=None) -> str:
    """What the browser receives for the page at ``path?search`` from the real server."""
    body = json.dumps(page_request(body_app, path, search))
    status, data = _request(port, "POST", "/_dash-update-component", body,
                            {"Content-Type": "application/json", **(headers or {})})
    assert status == 200, (status, data[:300])
    return data.decode().replace("\\u002f", "/")        # Dash's JSON writes / as \u002f


def _wait_page(port, body_app, run_id, until, limit_s):
    deadline = time.monotonic() + limit_s
    while True:
        text = _page(port, body_app, "/overview", f"?run={run_id}")
        if until(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


def _bad_run(root: pathlib.Path, name: str) -> pathlib.Path:
    """A run directory (run.json kept) with no report, step timers or dumps, whose only trace
    is replaced by the caller."""
    run = root / name
    shutil.copytree(SAMPLES / SAMPLE, run,
                    ignore=shutil.ignore_patterns("report", "comms", "steps", "logs"))
    for f in (run / "traces").iterdir():
        f.unlink()
    return run


@pytest.mark.slow
def test_hostile_runs_are_bounded_and_end_with_the_server(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(SAMPLES / SAMPLE, root / "good", ignore=shutil.ignore_patterns("report"))
    os.mkfifo(_bad_run(root, "fifo") / "traces" / "rank0.json")
    _slow_run(root)
    (_bad_run(root, "zero") / "traces" / "rank0.json").symlink_to("/dev/zero")
    body_app = create_app(root)              # builds request bodies only; starts nothing
    limit = 20
    with served(root, tmp_path / "server.log", "--analysis-timeout", str(limit),
                "--analysis-memory", "1024", "--analysis-workers", "2") as (proc, port):
        # The hanging run first: it holds one worker, the others go on.
        for run_id in ("fifo", "zero", "good"):
            _page(port, body_app, "/overview", f"?run={run_id}")
        opened = time.monotonic()
        good = _wait_page(port, body_app, "good",
                          lambda t: "breakdown-graph" in t or "analysis failed" in t, 300)
        assert '"id":"breakdown-graph"' in good, good[-1500:]
        zero = _wait_page(port, body_app, "zero", lambda t: "analysis failed" in t, 300)
        assert "The analysis failed: " in zero, zero[-1500:]
        fifo = _wait_page(port, body_app, "fifo", lambda t: "analysis failed" in t,
                          limit + 120)
        assert "The analysis failed: " in fifo, fifo[-1500:]
        # Named: the run (and the file) refused, or the limit that stopped it.
        for run_id, text in (("fifo", fifo), ("zero", zero)):
            assert f"The analysis failed: {run_id}" in text or \
                "the dashboard's limit" in text or "stopped: memory limit (1024 MiB" in text, \
                text[-1500:]
        assert time.monotonic() - opened < limit + 120
        # Pages and exports of the run the server analysed: no server path.
        for page in ("/overview", "/health"):
            text = _page(port, body_app, page, "?run=good")
            assert str(tmp_path) not in text and "Traceback" not in text
        status, html, _ = _get(port, "/export/html?run=good")
        assert status == 200 and str(tmp_path).encode() not in html
        # A run still being analysed when the server stops.
        _page(port, body_app, "/overview", "?run=slow")
        deadline = time.monotonic() + 60
        while not any("slow" in c.cmdline() for c in _children(proc.pid)):
            assert time.monotonic() < deadline, "the analysis of slow did not start"
            time.sleep(0.1)
        children = _children(proc.pid)
        assert children
    # served() has stopped the server (SIGTERM): its analyses went with it.
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []
    assert processes_under(root) == []
    log = (tmp_path / "server.log").read_text()
    assert "meshscope analyze" in log


def _slow_run(root: pathlib.Path) -> None:
    """A folder of 16 traces (dp4-ddp's four, each four times): seconds of analysis, which
    ends in an error of its own (four files claim each rank)."""
    (root / "slow").mkdir()
    for r in range(16):
        shutil.copy(SAMPLES / "dp4-ddp" / "traces" / f"rank{r % 4}.json.gz",
                    root / "slow" / f"rank{r}.json.gz")


@pytest.mark.slow
def test_each_limit_names_itself(tmp_path):
    """An analysis past its time limit (1 s: less than the analysis process needs to start
    and read 16 traces) and one past its memory limit (256 MiB of address space: less than
    importing its libraries needs) are stopped and named by the limit, on the page."""
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(SAMPLES / SAMPLE, root / "good", ignore=shutil.ignore_patterns("report"))
    _slow_run(root)
    body_app = create_app(root)
    for args, run_id, said in (
            (("--analysis-timeout", "1"), "slow",
             "the analysis took longer than the dashboard's limit of 1 s and was stopped"),
            (("--analysis-memory", "256"), "good",
             "the analysis was stopped: memory limit (256 MiB; ")):
        with served(root, tmp_path / "server.log", *args) as (proc, port):
            text = _wait_page(port, body_app, run_id, lambda t: "analysis failed" in t, 300)
            assert f"The analysis failed: {said}" in text, text[-1500:]
            assert "without a message" not in text
            assert str(tmp_path) not in text
        assert not (root / run_id / "report" / "summary.json").exists()
    assert processes_under(root) == []


def test_memory_evidence_of_a_crash_under_the_cap_and_of_other_ends():
    """Known by construction: a crash (SIGSEGV, SIGBUS, SIGABRT) under the cap is named by the
    memory limit even when the 20-ms samples of the address space missed its growth (the slow
    test above met signal 11 at 0.1 s under 100 MiB); a plain exit code or another signal
    with no other evidence is not, nor is a stop by the dashboard."""
    import signal

    from meshscope.dashboard.jobs import ChildEnd, memory_evidence

    for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
        said = memory_evidence("", ChildEnd(-sig, 31.0, 30.0), 100)
        assert said == (f"memory limit (100 MiB; it crashed with signal {int(sig)}, as a failed "
                        f"allocation under the cap does; its address space was last seen at "
                        f"31 MiB)"), said
    for end in (ChildEnd(1, 31.0, 30.0), ChildEnd(-signal.SIGTERM, 31.0, 30.0),
                ChildEnd(None, 31.0, 30.0)):
        assert memory_evidence("Traceback: ValueError", end, 100) is None, end


def _supervised(cap_mib: int, code: str) -> tuple[int, str, float]:
    """``python -c CODE`` under the dashboard's supervisor with a 1-s stall limit: (exit code,
    stderr, seconds it took)."""
    from meshscope.dashboard.jobs import supervised

    started = time.monotonic()
    proc = subprocess.run(supervised(cap_mib, 1.0, ["-c", code]), capture_output=True,
                          text=True, timeout=120, start_new_session=True)
    return proc.returncode, proc.stderr, time.monotonic() - started


# Fill the address space to its cap; what is kept keeps it there.
_FILL = """
chunks = []
try:
    while True:
        chunks.append(bytearray(1 << 20))
except MemoryError:
    chunks.pop()
"""


def test_a_process_stuck_at_its_cap_is_stopped_and_named():
    """Known by construction, under a 120 MiB cap and a 1-s stall limit: a process that fills
    its address space and then waits for ever on a lock (as CPython's importlib was seen to
    after a failed allocation) is stopped by the supervisor and named by the memory limit.
    Not stopped: one that sleeps 3 s below its cap, nor one at its cap that computes for 3 s —
    both end by themselves with exit 0."""
    from meshscope.dashboard.jobs import child_end, memory_evidence

    code, err, took_s = _supervised(120, _FILL + "import threading\n"
                                    "lock = threading.Lock(); lock.acquire(); lock.acquire()")
    end = child_end(err)
    assert end is not None and end.exit is None and end.stalled_s is not None, err
    assert code == -signal.SIGKILL and 1.0 <= end.stalled_s < 60 and took_s < 100
    assert end.peak_vm_mib >= 0.9 * 120
    said = memory_evidence(err, end, 120)
    assert said.startswith("memory limit (120 MiB; its address space reached ") and \
        said.endswith("and then it used no CPU for 1 s: stuck at the cap)"), said

    for child in ("import time; time.sleep(3)",
                  _FILL + "import time\nt = time.monotonic()\n"
                          "while time.monotonic() - t < 3: pass"):
        code, err, took_s = _supervised(120, child)
        end = child_end(err)
        assert code == 0 and end == end.__class__(0, end.peak_vm_mib, end.peak_rss_mib), err
        assert took_s >= 3


def _analysed(analyses, entry, limit_s: float = 120):
    """Start ``entry``'s analysis and wait until it is done or failed: its last status."""
    analyses.start(entry)
    deadline = time.monotonic() + limit_s
    while (status := analyses.status(entry.run_id)).state in ("queued", "running"):
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return status


@pytest.mark.slow
def test_memory_deaths_without_memory_error_are_named(tmp_path):
    """Analyses of a good run under caps too small to import its libraries (60, 100 and 150
    MiB of address space). At these caps Python mostly dies without printing MemoryError —
    here: a shared library that cannot be mapped ("failed to map segment"), OpenBLAS giving
    up ("Memory allocation still failed"), each with exit code 1, a crash (signal 11), or a
    process stuck for ever in importlib's lock after a failed allocation — and the failure is
    named by the memory limit all the same, never "without a message"."""
    from meshscope.dashboard.jobs import Analyses, Limits
    from meshscope.dashboard.runs import RunIndex

    root = tmp_path / "runs"
    shutil.copytree(SAMPLES / SAMPLE, root / "good", ignore=shutil.ignore_patterns("report"))
    entry = RunIndex(root).get("good")
    for cap_mib in (60, 100, 150):
        analyses = Analyses(root, Limits(timeout_s=120, memory_mb=cap_mib, workers=1))
        status = _analysed(analyses, entry, limit_s=120 + 60)   # past the dashboard's limit
        assert status.state == "failed", (cap_mib, status)
        assert status.text.startswith("The analysis failed: the analysis was stopped: memory "
                                      f"limit ({cap_mib} MiB; "), (cap_mib, status.text)
        analyses.shutdown()
    assert not (root / "good" / "report" / "summary.json").exists()
    assert processes_under(root) == []


@pytest.mark.slow
def test_an_analysis_killed_outright_is_named_out_of_memory(tmp_path):
    """The analysis process killed by SIGKILL from outside the dashboard, as the kernel's
    out-of-memory killer does (no message, no exit code): named "out of memory", with the
    signal that says so; its worker pool ends with it."""
    from meshscope.dashboard.jobs import Analyses, Limits
    from meshscope.dashboard.runs import RunIndex

    root = tmp_path / "runs"
    root.mkdir()
    _slow_run(root)
    entry = RunIndex(root).get("slow")
    analyses = Analyses(root, Limits(timeout_s=300, workers=1))
    analyses.start(entry)
    deadline = time.monotonic() + 60
    while True:
        found = [p for p in psutil.Process().children(recursive=True)     # not its supervisor
                 if _cmdline(p)[1:] == ["-m", "meshscope", "analyze", "slow"]]
        if found:
            break
        assert time.monotonic() < deadline, "the analysis of slow did not start"
        time.sleep(0.05)
    found[0].kill()
    status = _analysed(analyses, entry)
    analyses.shutdown()
    assert status.state == "failed"
    assert "the analysis was stopped: out of memory (killed by SIGKILL, which the dashboard " \
           "did not send" in status.text, status.text
    assert processes_under(root) == []


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def _children(pid) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("header,name", [("localhost:8050", "localhost"),
                                         ("[::1]:8050", "::1"), ("127.0.0.1", "127.0.0.1"),
                                         ("Evil.Example:80", "evil.example")])
def test_host_name_without_port(header, name):
    assert host_name(header) == name


def test_host_allowed_and_token_checks():
    allowed = {"localhost", "127.0.0.1", "::1"}
    assert host_allowed("localhost:1", allowed) and not host_allowed("evil.example", allowed)
    assert not host_allowed(None, allowed) and host_allowed("anything", {"*"})
    basic = "Basic " + base64.b64encode(b"me:s3cret").decode()
    assert token_ok("Bearer s3cret", "s3cret") and token_ok(basic, "s3cret")
    assert not token_ok("Bearer s3cre", "s3cret") and not token_ok(None, "s3cret")
    assert not token_ok("Basic !!!", "s3cret") and not token_ok("s3cret", "s3cret")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("svc") / "runs"
    root.mkdir()
    shutil.copytree(SAMPLES / SAMPLE, root / "a-run")
    # A run whose traces/ leads outside the runs folder.
    outside = root.parent / "elsewhere"
    shutil.copytree(SAMPLES / SAMPLE / "traces", outside)
    shutil.copytree(SAMPLES / SAMPLE, root / "linked", ignore=shutil.ignore_patterns("traces"))
    (root / "linked" / "traces").symlink_to(outside, target_is_directory=True)
    return root


TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def shared(two_runs, tmp_path_factory):
    """One server with a token (``$MESHSCOPE_DASHBOARD_TOKEN``) over ``two_runs`` and a run analysed by hand as ``meshscope
    analyze /abs/path/RUN`` with one trace cut short (``by-hand``), shared by the tests that
    ask it only (each server costs a process start): (port, runs folder, log)."""
    from conftest import meshscope

    run = two_runs / "by-hand"
    shutil.copytree(SAMPLES / SAMPLE, run, ignore=shutil.ignore_patterns("report"))
    trace = run / "traces" / "rank3.json.gz"
    trace.write_bytes(trace.read_bytes()[:4000])
    meshscope("analyze", run.resolve(), check=True)
    log = tmp_path_factory.mktemp("shared") / "server.log"
    server = served(two_runs, log, "--threads", "8")
    with pytest.MonkeyPatch.context() as mp:        # only while it starts: later servers
        mp.setenv("MESHSCOPE_DASHBOARD_TOKEN", TOKEN)   # have none (as the docs advise, the
        proc, port = server.__enter__()                 # token is not in its argv)
    try:
        assert TOKEN not in " ".join(psutil.Process(proc.pid).cmdline())
        yield port, two_runs, log
    finally:
        server.__exit__(None, None, None)


def test_other_hosts_are_refused_and_the_token_is_required(shared):
    port, *_ = shared
    assert _request(port, "GET", "/overview?run=a-run")[0] == 401
    status, body = _request(port, "GET", "/", headers={"Authorization": "Bearer nope"})
    assert status == 401 and b"report" not in body
    assert _request(port, "GET", "/", headers=AUTH)[0] == 200
    basic = "Basic " + base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert _request(port, "GET", "/export/html?run=a-run",
                    headers={"Authorization": basic})[0] == 200
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        status, body = _request(port, "GET", "/export/html?run=a-run",
                                headers={**AUTH, "Host": host})
        assert (status, body) == (400, b"host not allowed\n")
    assert _request(port, "GET", "/", headers={**AUTH, "Host": f"localhost:{port}"})[0] \
        == 200


def test_binding_beyond_loopback_without_a_token_warns(two_runs, tmp_path, monkeypatch):
    monkeypatch.delenv("MESHSCOPE_DASHBOARD_TOKEN", raising=False)
    log = tmp_path / "server.log"
    with served(two_runs, log, "--host", "0.0.0.0", "--allowed-hosts", "localhost,127.0.0.1") \
            as (_, port):
        assert _request(port, "GET", "/")[0] == 200       # Host: 127.0.0.1:PORT
        assert _request(port, "GET", "/", headers={"Host": "evil.example"})[0] == 400
    assert "meshscope: warning: serving on 0.0.0.0, beyond this machine, without " \
           "--auth-token" in log.read_text()


def test_perfetto_export_refuses_traces_outside_the_run(shared):
    port, *_ = shared
    status, body = _request(port, "GET", "/export/perfetto?run=linked", headers=AUTH)
    assert status == 403 and b"not a regular file inside the run" in body
    status, body = _request(port, "GET", "/export/perfetto?run=a-run", headers=AUTH)
    assert status == 200 and body[:2] == b"\x1f\x8b"


def test_twenty_concurrent_first_requests_all_answer(two_runs, tmp_path):
    """The first requests of a fresh server read run.json through its schema at the same
    time: each page answers with the report (none says "Report unreadable"). Ten ask for the
    page (built once, in the page builders) and ten for the HTML export, each of which opens
    the report in its own server thread."""
    body_app = create_app(two_runs)
    with served(two_runs, tmp_path / "server.log", "--threads", "20", "--page-timeout",
                "120") as (_, port):
        def ask(i):
            if i % 2:
                return _get(port, "/export/html?run=a-run")[0]
            return _page(port, body_app, "/overview", "?run=a-run")
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(ask, range(20)))
    texts = [a for a in answers if isinstance(a, str)]
    assert len(texts) == 10 and [a for a in answers if not isinstance(a, str)] == [200] * 10
    assert sum('"id":"breakdown-graph"' in t for t in texts) == 10
    assert not any("Report unreadable" in t for t in texts)


def test_report_cache_keeps_the_most_recent_reports_within_its_bytes(tmp_path, monkeypatch):
    """Real reports read through ``open_report``: with room for about one report, the cache
    holds the one read last (least recently used dropped first), and a hit moves a report to
    the front."""
    from meshscope.dashboard import data
    from meshscope.dashboard.runs import RunIndex

    root = tmp_path / "runs"
    for name in ("r0", "r1", "r2"):
        shutil.copytree(SAMPLES / SAMPLE, root / name, ignore=shutil.ignore_patterns("traces"))
    index = RunIndex(root)
    monkeypatch.setattr(data, "_CACHE", type(data._CACHE)())
    monkeypatch.setattr(data, "_WEIGHT", {})
    monkeypatch.setattr(data, "CACHE_BYTES", 1 << 40)
    for name in ("r0", "r1", "r2"):
        data.open_report(index.get(name))
    one = max(data._WEIGHT.values())
    assert list(data._CACHE) == ["r0", "r1", "r2"]
    data.open_report(index.get("r0"))                       # a hit: r0 is the most recent
    assert list(data._CACHE) == ["r1", "r2", "r0"]
    monkeypatch.setattr(data, "CACHE_BYTES", one * 3 // 2)  # room for one report
    data.open_report(index.get("r1"))
    assert list(data._CACHE) == ["r1"]
    assert sum(data._WEIGHT.values()) <= data.CACHE_BYTES


@pytest.mark.slow
def test_server_memory_does_not_grow_with_the_runs_exported(tmp_path):
    """Resident memory of the real server after export requests (HTML and Perfetto, 8
    concurrent clients) over 2 runs, then over 8 runs: it grows by less than half (the
    report cache is bounded, and the Perfetto export parses traces in a child process)."""
    root = tmp_path / "runs"
    for i in range(8):
        shutil.copytree(SAMPLES / ("dp4-ddp" if i % 2 else SAMPLE), root / f"r{i}")
    with served(root, tmp_path / "server.log", "--report-cache-mb", "4") as (proc, port):
        server = psutil.Process(proc.pid)

        def export_all(runs):
            paths = [f"/export/{k}?run=r{i}" for i in runs for k in ("html", "perfetto")]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                assert {s for s, _, _ in pool.map(lambda p: _get(port, p), paths)} == {200}

        export_all([0, 1, 0, 1])
        after_two = server.memory_info().rss
        export_all(range(8))
        after_eight = server.memory_info().rss
    # Before the cache was bounded and Perfetto exports left the server, 2 runs left it at
    # 550 MB and 12 at 777 MB; now it stays near 250 MB. Resident memory is noisy (a fresh
    # clone's CI run measured 252 → 323 MB): the relation is "less than half again".
    assert after_eight - after_two < after_two / 2, (after_two >> 20, after_eight >> 20)


@pytest.mark.slow
def test_analyses_end_when_the_server_is_killed_outright(tmp_path):
    """SIGKILL of the server (no chance to stop its analyses): the analysis it started and
    that analysis' own worker pool end too (Linux: PR_SET_PDEATHSIG)."""
    if not os.uname().sysname == "Linux":
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    root = tmp_path / "runs"
    root.mkdir()
    _slow_run(root)
    body_app = create_app(root)
    with served(root, tmp_path / "server.log") as (proc, port):
        _page(port, body_app, "/overview", "?run=slow")
        deadline = time.monotonic() + 60
        while not any("slow" in c.cmdline() for c in _children(proc.pid)):
            assert time.monotonic() < deadline, "the analysis of slow did not start"
            time.sleep(0.1)
        children = _children(proc.pid)
        proc.kill()
        proc.wait()
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == []
    assert processes_under(root) == []


def test_a_report_written_with_absolute_paths_shows_none(shared):
    """A run analysed by hand as ``meshscope analyze /abs/path/RUN``, one trace cut short: its
    report names the damaged file by the absolute path; the pages and the HTML export name it
    relative to the runs folder."""
    port, root, _ = shared
    run = root / "by-hand"
    assert str(run.resolve()) in (run / "report" / "summary.json").read_text()
    body_app = create_app(root)
    health = _page(port, body_app, "/health", "?run=by-hand", AUTH)
    assert "by-hand/traces/rank3.json.gz" in health
    overview = _page(port, body_app, "/overview", "?run=by-hand", AUTH)
    status, html = _request(port, "GET", "/export/html?run=by-hand", headers=AUTH)
    assert status == 200
    for text in (health, overview, html.decode()):
        assert str(root.parent) not in text and str(root.resolve().parent) not in text


def _big_report_run(root: pathlib.Path, copies: int = 4000) -> None:
    """Run ``big``: the sample's report with its first step's timeline repeated ``copies``
    times one after another (about 436,000 segments in one step: 1–2 s to build on a quiet
    2-core machine, a page of about 3 MB), and run ``small``: the sample as it is."""
    import pandas as pd

    for name in ("big", "small"):
        shutil.copytree(SAMPLES / SAMPLE, root / name, ignore=shutil.ignore_patterns("traces"))
    table = root / "big" / "report" / "timeline.parquet"
    t = pd.read_parquet(table)
    first = t[t["step"] == t["step"].min()]
    span_us = float(first["end_us"].max() - first["start_us"].min())
    parts = [first.assign(start_us=first["start_us"] + i * span_us,
                          end_us=first["end_us"] + i * span_us) for i in range(copies)]
    pd.concat([t] + parts, ignore_index=True).to_parquet(table, index=False)


@pytest.mark.slow
def test_a_page_of_an_enormous_report_holds_no_server_thread(tmp_path):
    """Two server threads and a page that takes a second or more to build, waited for at most
    0.1 s: four requests for it at once all answer at once, saying it is still being built and
    polling again; the server answers another run's pages meanwhile; the enormous page then
    arrives whole. (The two requests that wait for a thread are answered by 0.2 s, well before
    the page is built; with 0.5 s, on a machine that built the page in 1.0 s, they were
    answered with the finished page.)"""
    root = tmp_path / "runs"
    root.mkdir()
    _big_report_run(root)
    body_app = create_app(root)
    with served(root, tmp_path / "server.log", "--threads", "2", "--page-timeout", "0.1") \
            as (_, port):
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = list(pool.map(lambda _: _page(port, body_app, "/timeline", "?run=big"),
                                  range(4)))
        for text in first:
            assert '"id":"page-building"' in text and "still being built" in text, text[-800:]
            assert '"poll":{"disabled":false}' in text.replace(" ", ""), text[-800:]
            assert "timeline-graph" not in text
        small = ""
        deadline = time.monotonic() + 120
        while '"id":"breakdown-graph"' not in small:
            assert time.monotonic() < deadline, small[-800:]
            small = _page(port, body_app, "/overview", "?run=small")
        big = ""
        deadline = time.monotonic() + 300
        while '"id":"timeline-graph"' not in big:
            assert time.monotonic() < deadline, big[-800:]
            big = _page(port, body_app, "/timeline", "?run=big")
            if '"id":"timeline-graph"' not in big:
                assert "still being built" in big, big[-800:]
        # the whole page: every segment drawn (stretches of one kind closer than a pixel
        # joined, dashboard/pages/timeline._drawn) — still over a mebibyte of figure
        assert len(big) > 1 << 20
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log
