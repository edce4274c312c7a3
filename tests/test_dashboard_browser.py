"""The dashboard: its callbacks on the server, and the overview page in a real headless Chromium.

The browser tests start ``meshscope dashboard samples/`` as a subprocess on a free port and
read the rendered page: one bar per rank of the sample run, one bubble-table row per pipeline
stage with the theory from summary.json, and no SEVERE entry in the browser console.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest

from meshscope.dashboard import runs as R
from meshscope.dashboard.app import create_app

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SAMPLE = SAMPLES / "dp2-pp2-1f1b"
CHROMIUM, CHROMEDRIVER = pathlib.Path("/usr/bin/chromium"), pathlib.Path("/usr/bin/chromedriver")


def _summary() -> dict:
    return json.loads((SAMPLE / "report" / "summary.json").read_text())


def _callback(app):
    """The function behind the run-view callback, callable without a request."""
    return app.callback_map["run-view.children"]["callback"].__wrapped__


def _texts(component) -> str:
    """All text of a Dash component tree, for asserting on messages."""
    if isinstance(component, (list, tuple)):
        return " ".join(_texts(c) for c in component)
    if isinstance(component, (str, int, float)):
        return str(component)
    return _texts(getattr(component, "children", None) or [])


# ---- server side, no browser ----------------------------------------------------------------

@pytest.fixture
def runs_folder(tmp_path):
    shutil.copytree(SAMPLE, tmp_path / "a-analysed", ignore=shutil.ignore_patterns("traces"))
    (tmp_path / "b-pending").mkdir()
    shutil.copy(SAMPLE / "run.json", tmp_path / "b-pending" / "run.json")
    (tmp_path / "c-not-a-run").mkdir()
    return tmp_path


def test_runs_without_report_are_listed_as_not_analysed(runs_folder):
    runs = R.discover(runs_folder)
    assert list(runs) == ["a-analysed", "b-pending"]
    assert runs["a-analysed"].analysed and not runs["b-pending"].analysed
    app = create_app(runs_folder)
    dropdown = app.layout.children[2].children
    assert dropdown.value == "a-analysed"
    assert [o["label"] for o in dropdown.options] == ["a-analysed", "b-pending (not analysed)"]
    assert "not been analysed" in _texts(_callback(app)("b-pending"))


@pytest.mark.parametrize("run_id", ["nope", "../a-analysed", "/etc/passwd", "", None, 3])
def test_unknown_run_id_gives_a_message(runs_folder, run_id):
    out = _callback(create_app(runs_folder))(run_id)
    assert out[0].id == "run-message"
    assert "run" in _texts(out).lower()


def test_unreadable_report_gives_a_message(runs_folder):
    (runs_folder / "a-analysed" / "report" / "breakdown.parquet").write_text("not parquet")
    out = _callback(create_app(runs_folder))("a-analysed")
    assert "Could not read this run's report" in _texts(out)


def test_breakdown_figure_stacks_segments_to_the_window(runs_folder):
    out = _callback(create_app(runs_folder))("a-analysed")
    fig = next(c for c in out if getattr(c, "id", None) == "breakdown-graph").figure
    assert [t.name for t in fig.data] == [s[0] for s in R.SEGMENTS]
    ranks = _summary()["ranks"]
    assert all(list(t.x) == [f"rank {r}" for r in ranks] for t in fig.data)
    window = {m["rank"]: m["window_us"] / 1e3 for m in _summary()["per_rank_mean"]}
    for i, r in enumerate(ranks):
        assert sum(t.y[i] for t in fig.data) == pytest.approx(window[r], rel=1e-4)


def test_run_without_pipeline_says_so(runs_folder):
    bubbles = runs_folder / "a-analysed" / "report" / "bubbles.parquet"
    pd.read_parquet(bubbles).iloc[0:0].to_parquet(bubbles, index=False)
    out = _callback(create_app(runs_folder))("a-analysed")
    assert "No pipeline parallelism" in _texts(out)


# ---- real browser ---------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("dash") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "meshscope", "dashboard",
                                 str(SAMPLES), "--port", str(port)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dashboard exited with {proc.returncode}:\n{log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"dashboard did not answer in 30 s:\n{log.read_text()}")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip("needs Debian's chromium and chromium-driver (/usr/bin/chromium, "
                    "/usr/bin/chromedriver): apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1280,1100",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture(scope="module")
def page(server, driver):
    """The overview page of the pipelined sample (picked by ``?run=``), once the graph and the
    bubble table have rendered."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{server}?run={SAMPLE.name}")
    WebDriverWait(driver, 30).until(lambda d: d.find_elements(
        By.CSS_SELECTOR, "#breakdown-graph .xtick text") and d.find_elements(
        By.CSS_SELECTOR, "#bubble-table tbody tr"))
    return driver


@pytest.mark.browser
def test_overview_renders_header(page):
    from selenium.webdriver.common.by import By

    run = _summary()["run"]
    assert page.title == "meshscope"
    header = page.find_element(By.ID, "run-header").text
    assert run["layout_str"] in header and f"world size: {run['world_size']}" in header
    assert run["schedule"] in header and f"microbatches: {run['microbatches']}" in header


@pytest.mark.browser
def test_one_bar_per_rank(page):
    from selenium.webdriver.common.by import By

    ranks = _summary()["ranks"]
    assert len(ranks) == json.loads((SAMPLE / "run.json").read_text())["world_size"]
    ticks = [e.text for e in page.find_elements(By.CSS_SELECTOR, "#breakdown-graph .xtick text")]
    assert ticks == [f"rank {r}" for r in ranks]
    traces = page.find_elements(By.CSS_SELECTOR, "#breakdown-graph .barlayer .trace")
    assert len(traces) == len(R.SEGMENTS)
    assert len(traces[0].find_elements(By.CSS_SELECTOR, "g.point")) == len(ranks)
    legend = [e.text for e in page.find_elements(By.CSS_SELECTOR, "#breakdown-graph .legendtext")]
    assert legend == [s[0] for s in reversed(R.SEGMENTS)]  # top of the stack first


@pytest.mark.browser
def test_bubble_table_has_theory_per_stage(page):
    from selenium.webdriver.common.by import By

    stages = _summary()["pipeline_stages"]
    rows = page.find_elements(By.CSS_SELECTOR, "#bubble-table tbody tr")
    assert len(rows) == len(stages)
    for row, stage in zip(rows, stages):
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        assert int(cells[0]) == stage["stage"]
        assert cells[1] == ", ".join(map(str, stage["ranks"]))
        assert float(cells[2].rstrip(" %")) == pytest.approx(100 * stage["bubble_fraction"],
                                                             abs=0.05)
        assert float(cells[3].rstrip(" %")) == pytest.approx(100 * stage["theory_fraction"],
                                                             abs=0.05)


@pytest.mark.browser
def test_browser_console_has_no_errors(page):
    severe = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []
