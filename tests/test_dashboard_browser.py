"""The dashboard in a real headless Chromium, against the shipped samples: one server
(``meshscope dashboard samples/``, waitress) and one browser for the whole module.

Each page renders its graphs with the numbers of the run named in the URL (read back from the
rendered SVG and tables, compared with that run's summary.json and report tables); the
navigation bar keeps the selected run; a copied URL reopens the same view; the compare page
shows two runs; the static HTML report opens from a ``file://`` URL with the network off and
shows the same numbers; the GPU page of a real GPU trace of the shared corpus (analysed into a
runs folder of its own) draws the report's idle causes and kernels; the browser console stays
free of errors throughout.

``MESHSCOPE_SCREENSHOTS=docs/img pytest tests/test_dashboard_browser.py`` also saves a
screenshot of each page there (the ones docs/dashboard.md shows): every page of the slow-rank
sample (``test_every_page_of_the_slow_rank_sample``), the runs list, and the GPU page of the
shared GPU trace.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from urllib.parse import parse_qs, urlsplit

import pandas as pd
import pytest

from conftest import meshscope, shared_trace
from test_dashboard_server import served

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
PIPELINED = "dp2-pp2-1f1b"
SLOW = "dp2-pp2-slow-rank1"
MOE = "dp2-ep2-moe"
GPU_RUN = "resnet50_num_workers_0"      # ../shared/traces/gpu/kineto_tb_samples: one GPU rank
CHROMIUM, CHROMEDRIVER = pathlib.Path("/usr/bin/chromium"), pathlib.Path("/usr/bin/chromedriver")
SHOTS = os.environ.get("MESHSCOPE_SCREENSHOTS")
CONSOLE: list[dict] = []          # every browser console entry seen by any test
OPENED: list[str] = []            # every URL the tests loaded

pytestmark = pytest.mark.browser


def _summary(run_id: str) -> dict:
    return json.loads((SAMPLES / run_id / "report" / "summary.json").read_text())


def _table(run_id: str, name: str) -> pd.DataFrame:
    return pd.read_parquet(SAMPLES / run_id / "report" / f"{name}.parquet")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with served(SAMPLES, tmp_path_factory.mktemp("dash") / "server.log") as (_, port):
        yield f"http://127.0.0.1:{port}"


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
                "--disable-quic", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--window-size=1300,1200",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    d.set_page_load_timeout(60)
    try:
        yield d
    finally:
        d.quit()


def _css(d, selector):
    from selenium.webdriver.common.by import By
    return d.find_elements(By.CSS_SELECTOR, selector)


def _wait(d, selector, timeout=45, count=1):
    """Wait until ``selector`` matches at least ``count`` elements; returns them."""
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(d, timeout).until(lambda x: len(_css(x, selector)) >= count)
    return _css(d, selector)


def _open(d, url, ready, shot=None):
    """Load ``url``, wait for ``ready`` to render, keep the console entries."""
    d.get(url)
    OPENED.append(url)
    _wait(d, ready)
    time.sleep(0.3)  # let plotly finish drawing the other figures of the page
    CONSOLE.extend(d.get_log("browser"))
    if SHOTS and shot:
        pathlib.Path(SHOTS).mkdir(parents=True, exist_ok=True)
        height = d.execute_script("return document.body.scrollHeight")
        d.set_window_size(1300, min(max(900, height + 40), 4000))
        # the window's own bars take part of its height: grow it so the whole page shows
        bars = d.execute_script("return window.outerHeight - window.innerHeight")
        if bars > 0:
            d.set_window_size(1300, min(max(900, height + 40 + bars), 4000))
        d.save_screenshot(str(pathlib.Path(SHOTS) / f"{shot}.png"))
        d.set_window_size(1300, 1200)


def _texts(d, selector):
    return [e.text for e in _css(d, selector)]


def test_runs_page_lists_every_sample_with_its_step_time(server, driver):
    _open(driver, server + "/", "#runs-table td", shot="runs")
    table = _css(driver, "#runs-table")[0].text
    for run in sorted(p.name for p in SAMPLES.iterdir() if (p / "run.json").is_file()):
        assert run in table
        s = _summary(run)
        step = s.get("step_time_us") or (s.get("throughput") or {}).get("step_time_us") or \
            max(m["window_us"] for m in s["per_rank_mean"])
        assert f"{round(step / 1e3, 2):g}" in table, run


def test_overview_draws_the_ranks_and_findings_of_the_run(server, driver):
    s = _summary(PIPELINED)
    _open(driver, f"{server}/overview?run={PIPELINED}", "#breakdown-graph .xtick text")
    assert _texts(driver, "#run-title") == [PIPELINED]
    assert s["run"]["layout_str"] in _css(driver, "#run-facts")[0].text
    ticks = _texts(driver, "#breakdown-graph .xtick text")
    assert [t.split()[1] for t in ticks] == [str(r) for r in s["ranks"]]
    cells = _texts(driver, "#mesh-graph .heatmaplayer ~ * text, #mesh-graph text")
    assert all(any(c.startswith(f"rank {r}") for c in cells) for r in s["ranks"])
    rows = _css(driver, "#findings-table tbody tr")
    assert len(rows) == len(s["findings"])
    assert s["findings"][0]["title"] in rows[0].text


def test_slow_rank_sample_names_the_reports_straggler(server, driver):
    s = _summary(SLOW)
    _open(driver, f"{server}/overview?run={SLOW}", "#straggler")
    rank = s["cross_rank"]["straggler"]["rank"]
    assert _texts(driver, "#straggler")[0].startswith(f"Straggler: rank {rank} ")


def test_slow_rank_sample_names_rank_1(server, driver):
    # The sample's rank 1 was slowed (samples/README.md); its report (past schema 1, whose
    # straggler was the last arriver, rank 3 — a skip waited for this) names the cause.
    assert _summary(SLOW)["schema_version"] >= 2
    _open(driver, f"{server}/overview?run={SLOW}", "#straggler")
    assert _texts(driver, "#straggler")[0].startswith("Straggler: rank 1 ")


def test_pipeline_page_shows_the_step_and_the_bubble_against_theory(server, driver):
    s = _summary(PIPELINED)
    step = s["steps"][-1]
    _open(driver, f"{server}/pipeline?run={PIPELINED}&step={step}", "#gantt-graph .point")
    assert _texts(driver, "#gantt-graph .gtitle") == [f"Microbatch schedule of step {step}"]
    mb = _table(PIPELINED, "microbatches")
    assert len(_css(driver, "#gantt-graph .barlayer .point")) == int((mb["step"] == step).sum())
    rows = _css(driver, "#bubble-table tbody tr")
    assert len(rows) == len(s["pipeline_stages"])
    for row, stage in zip(rows, s["pipeline_stages"]):
        assert f"{100 * stage['bubble_fraction']:.1f} %" in row.text
        assert f"{100 * stage['theory_fraction']:.1f} %" in row.text


def test_communication_page_plots_every_size_bucket(server, driver):
    bw = _table(PIPELINED, "bandwidth_summary")
    _open(driver, f"{server}/communication?run={PIPELINED}", "#busbw-graph .point")
    # A bucket whose busbw is unknown (send/recv whose transfer the trace cannot separate from
    # waiting: analysis/comm/matching.py) has no point.
    assert len(_css(driver, "#busbw-graph .scatterlayer .point")) == \
        int(bw["busbw_gbps"].notna().sum())
    assert len(_css(driver, "#rank-matrix-graph .hm")) == 2     # bytes and time
    assert len(_css(driver, "#costly-table tbody tr")) > 0


def test_stragglers_page_has_every_rank_and_step(server, driver):
    hm = _table(SLOW, "step_heatmap")
    _open(driver, f"{server}/stragglers?run={SLOW}", "#heatmap-graph .ytick text")
    assert len(_texts(driver, "#heatmap-graph .ytick text")) == hm["rank"].nunique()
    assert len(_texts(driver, "#heatmap-graph .xtick text")) == hm["step"].nunique()
    rank = _summary(SLOW)["cross_rank"]["straggler"]["rank"]
    assert f"rank {rank}" in _texts(driver, "#straggler-verdict")[0]
    assert _css(driver, "#clock-table tbody tr")


def test_timeline_page_draws_every_rank_on_one_axis(server, driver):
    s = _summary(SLOW)
    _open(driver, f"{server}/timeline?run={SLOW}", "#timeline-graph .ytick text")
    assert len(_texts(driver, "#timeline-graph .ytick text")) == len(s["ranks"])
    link = _css(driver, "#perfetto-download")[0].get_attribute("href")
    assert link.endswith(f"/export/perfetto?run={SLOW}")


def test_health_page_counts_the_flight_recorder_verdicts(server, driver):
    hangs = _summary(MOE)["hangs"]
    _open(driver, f"{server}/health?run={MOE}", "#fr-summary, #fr-healthy")
    if hangs:
        assert _texts(driver, "#fr-summary")[0].startswith(
            f"Flight Recorder: {len(hangs)} problem(s)")
    else:
        assert _css(driver, "#fr-healthy")


def test_compare_page_shows_two_runs(server, driver):
    _open(driver, f"{server}/compare?run=dp4-ddp&run={PIPELINED}", "#compare-graph .point")
    head = _texts(driver, "#compare-table thead th")
    assert "dp4-ddp" in head and PIPELINED in head
    assert len(_css(driver, "#compare-graph .barlayer .trace")[0].find_elements(
        "css selector", ".point")) == 2


def test_compare_page_before_and_after(server, driver):
    """Two runs in the URL: the waterfall from the first to the second, the parts table, the
    findings gained, the per-rank heatmap; the same numbers as `meshscope compare --json`."""
    _open(driver, f"{server}/compare?run={PIPELINED}&run={SLOW}",
          "#compare-waterfall .point, #compare-waterfall .bars path")
    proc = meshscope("compare", SAMPLES / PIPELINED, SAMPLES / SLOW, "--json", check=True)
    (d,) = json.loads(proc.stdout)["diffs"]
    sentences = [e.text for e in _css(driver, "[id^=compare-sentence-]")]
    assert sentences == d["sentences"]
    fall = _figure_data(driver, "compare-waterfall")[0]
    assert fall["x"][0] == PIPELINED and fall["x"][-1] == SLOW
    assert sum(fall["y"][1:-1]) == pytest.approx(d["window"]["delta"] / 1e3)
    assert any("Rank 1 is the straggler" in t for t in _texts(driver, "#compare-findings td"))
    assert _css(driver, "#compare-ranks .hm, #compare-ranks .heatmaplayer")


@pytest.fixture(scope="module")
def trace_pair_server(tmp_path_factory):
    """A runs folder holding copies of HTA's trace-diff pair (two foreign one-rank traces)."""
    root = tmp_path_factory.mktemp("pair")
    for name in ("control", "test"):
        src = shared_trace(f"gpu/hta/trace_diff/{name}")
        (root / name).mkdir()
        for f in src.iterdir():
            shutil.copy(f, root / name / f.name)
        meshscope("analyze", root / name, check=True)
    with served(root, tmp_path_factory.mktemp("pair-log") / "server.log") as (_, port):
        yield f"http://127.0.0.1:{port}", root


def test_compare_page_diffs_the_kernels_of_two_foreign_traces(trace_pair_server, driver):
    """The kernel table sorts and filters in the browser: filtered to the new kernels and
    sorted by their time, its first row is the largest new kernel of `meshscope compare`."""
    from selenium.webdriver.common.keys import Keys

    url, root = trace_pair_server
    (d,) = json.loads(meshscope("compare", root / "control", root / "test", "--json",
                                check=True).stdout)["diffs"]
    new = [k for k in d["kernels"] if k["status"] == "new"]
    largest = max(new, key=lambda k: k["delta_us"])["key"]
    _open(driver, f"{url}/compare?run=control&run=test", "#compare-kernels .ag-row")
    header = _css(driver, "#compare-kernels .ag-header-cell[col-id=delta_ms]")[0]
    header.click()                        # ascending
    header.click()                        # descending
    status_filter = _css(driver, "#compare-kernels .ag-floating-filter[aria-colindex='3'] "
                                 "input")[0]
    status_filter.send_keys("new", Keys.ENTER)
    time.sleep(1.0)
    first = _css(driver, "#compare-kernels .ag-center-cols-container .ag-row[row-index='0'] "
                         "[col-id=key]")[0].text
    statuses = {e.text for e in _css(driver, "#compare-kernels [col-id=status].ag-cell")}
    assert statuses == {"new"}
    assert first == largest


def test_navigation_keeps_the_selected_run(server, driver):
    _open(driver, f"{server}/overview?run={SLOW}", "#breakdown-graph .xtick text")
    for page, ready in (("pipeline", "#gantt-graph .point"),
                        ("communication", "#busbw-graph .point"),
                        ("stragglers", "#heatmap-graph .ytick text"),
                        ("health", "#fr-healthy, #fr-summary"),
                        ("overview", "#breakdown-graph .xtick text")):
        _css(driver, f"#nav-{page}")[0].click()
        _wait(driver, ready)
        url = urlsplit(driver.current_url)
        assert url.path == f"/{page}" and parse_qs(url.query)["run"] == [SLOW]
        assert _texts(driver, "#run-title") == [SLOW]
    CONSOLE.extend(driver.get_log("browser"))


def _settled_texts(d, selector, expected, timeout=30):
    """The texts of ``selector`` once they equal ``expected``, else the last ones seen after
    ``timeout``: the elements are found afresh at each try, because Dash may render the page
    again meanwhile (the URL's callback, then the pickers'), leaving an element found before
    stale — StaleElementReferenceException, which a single look would fail on."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    seen: list = []

    def settled(x):
        seen[:] = _texts(x, selector)
        return seen == expected
    try:
        WebDriverWait(d, timeout, ignored_exceptions=(StaleElementReferenceException,)) \
            .until(settled)
    except TimeoutException:
        pass
    return seen


def _choose(d, select, option, timeout=30):
    """Open the dropdown ``select`` and click its option ``option``, both found afresh at each
    try (a re-render closes the menu and replaces its elements: the next try opens it again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def chosen(x):
        options = [o for o in _css(x, "[role=option]") if o.text.strip() == option]
        if not options:
            _css(x, select)[0].click()
            return False
        options[0].click()
        return True
    WebDriverWait(d, timeout, ignored_exceptions=(StaleElementReferenceException, IndexError)) \
        .until(chosen)


def test_a_shared_url_reopens_the_same_view(server, driver):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    steps = _summary(PIPELINED)["steps"]
    title = f"Microbatch schedule of step {steps[-1]}"
    _open(driver, f"{server}/pipeline?run={PIPELINED}&step={steps[0]}", "#gantt-graph .point")
    _choose(driver, "#step-select", str(steps[-1]))
    WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: parse_qs(urlsplit(d.current_url).query).get("step") == [str(steps[-1])])
    assert _settled_texts(driver, "#gantt-graph .gtitle", [title]) == [title]
    shared = driver.current_url
    driver.get("about:blank")
    _open(driver, shared, "#gantt-graph .point")
    assert _settled_texts(driver, "#gantt-graph .gtitle", [title]) == [title]
    assert _settled_texts(driver, "#step-select-value", [str(steps[-1])]) == [str(steps[-1])]
    assert _settled_texts(driver, "#run-title", [PIPELINED]) == [PIPELINED]


def test_clicking_a_rank_focuses_the_view_on_it(server, driver):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    ranks = _summary(SLOW)["ranks"]
    _open(driver, f"{server}/overview?run={SLOW}", "#breakdown-graph .barlayer .point")
    bars = _css(driver, "#breakdown-graph .barlayer .trace")[0].find_elements(
        "css selector", ".point path")
    # Plotly's drag layer lies over the bars and turns a click at a bar's place into its event.
    ActionChains(driver).move_to_element(bars[1]).click().perform()
    WebDriverWait(driver, 30).until(lambda d: parse_qs(urlsplit(d.current_url).query).get(
        "rank") == [str(ranks[1])])
    _wait(driver, "#rank-focus")
    assert _texts(driver, "#rank-focus")[0].startswith(f"focus: rank {ranks[1]}")
    assert parse_qs(urlsplit(driver.current_url).query)["run"] == [SLOW]


def test_unknown_run_says_so(server, driver):
    _open(driver, f"{server}/overview?run=../{PIPELINED}", "#run-message")
    assert _texts(driver, "#run-message")[0].startswith("Unknown run: there is no run of "
                                                        "that name")


def test_static_html_report_opens_offline_with_the_same_numbers(driver, tmp_path):
    out = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "meshscope", "report", str(SAMPLES / SLOW),
                           "--html", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    driver.set_network_conditions(offline=True, latency=0, download_throughput=0,
                                  upload_throughput=0)
    try:
        _open(driver, out.as_uri(), "#breakdown-graph .xtick text", shot=None)
        s = _summary(SLOW)
        ticks = _texts(driver, "#breakdown-graph .xtick text")
        assert [t.split()[1] for t in ticks] == [str(r) for r in s["ranks"]]
        body = _css(driver, "body")[0].text
        for stage in s["pipeline_stages"]:
            assert f"{100 * stage['bubble_fraction']:.1f} %" in body
        assert s["findings"][0]["title"] in body
        assert _texts(driver, "#trust-verdict")[0].startswith(
            f"Evidence: {s['trust']['verdict']}")
        assert len(_css(driver, ".js-plotly-plot")) >= 6
    finally:
        driver.delete_network_conditions()


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    """A dashboard over one real GPU trace of the shared corpus, analysed as a user would."""
    trace = shared_trace(f"gpu/kineto_tb_samples/{GPU_RUN}")
    runs = tmp_path_factory.mktemp("gpu-dash") / "runs"
    shutil.copytree(trace, runs / GPU_RUN)
    meshscope("analyze", runs / GPU_RUN, check=True)
    with served(runs, runs.parent / "server.log") as (_, port):
        yield f"http://127.0.0.1:{port}", runs / GPU_RUN / "report"


def test_gpu_page_draws_the_reports_idle_causes_and_kernels(gpu_server, driver):
    url, report = gpu_server
    _open(driver, f"{url}/gpu?run={GPU_RUN}", "#idle-graph .barlayer .point", shot="gpu")
    # The figure's data as plotly holds it in the page: one trace per cause, the rank's mean
    # idle per step of each (ms), equal to the report's idle table.
    data = driver.execute_script(
        "return document.querySelector('#idle-graph .js-plotly-plot').data"
        ".map(t => [t.name, t.x, t.y]);")
    means = pd.read_parquet(report / "idle.parquet").groupby("rank").mean()
    from meshscope.vocabulary import IDLE_CAUSES
    # one trace per cause, in the order the analysis charges them (start-up among them since
    # issue 35)
    assert len(data) == len(IDLE_CAUSES) and data[0][0] == "data loader"
    for (name, xs, ys), cause in zip(data, IDLE_CAUSES):
        assert ys == ["rank 0"]
        assert xs[0] == pytest.approx(means.loc[0, f"idle_{cause}_us"] / 1e3, abs=1e-4), name
    legend = _texts(driver, "#idle-graph .legendtext")
    assert [t for t in legend if t] == [name for name, _, _ in data]
    cats = _css(driver, "#categories-graph .barlayer .trace")
    steps = pd.read_parquet(report / "step_categories.parquet")
    assert len(cats[0].find_elements("css selector", ".point")) == len(steps)
    kernels = pd.read_parquet(report / "kernels.parquet")
    rows = _css(driver, "#kernels-table tbody tr")
    assert len(rows) == len(kernels)
    first = rows[0].find_elements("css selector", "td")[0]
    assert first.get_attribute("title") == kernels["name"].iloc[0]
    assert len(first.text) < len(kernels["name"].iloc[0])
    assert f"{kernels['total_us'].iloc[0] / 1e3:.2f}" in rows[0].text
    assert _css(driver, "#sync-table tbody tr") and _css(driver, "#gpu-headline")
    CONSOLE.extend(driver.get_log("browser"))


def test_every_page_heads_with_the_reports_evidence(server, driver):
    """Each page of a run opens with the report's own verdict (summary.json's ``trust``)."""
    verdict = _summary(SLOW)["trust"]["verdict"]
    for page in ("overview", "pipeline", "communication", "stragglers", "timeline", "health"):
        _open(driver, f"{server}/{page}?run={SLOW}", "#trust-verdict")
        assert _texts(driver, "#trust-verdict")[0].startswith(f"Evidence: {verdict}"), page


@pytest.fixture(scope="module")
def damaged_server(tmp_path_factory):
    """A runs folder holding a real V100 trace with a third of its kernels removed
    (``test_trust._third_removed``), analysed as a user would."""
    from test_trust import TRACE, _load, _third_removed, _write

    src = shared_trace(TRACE)
    runs = tmp_path_factory.mktemp("damaged-dash") / "runs"
    doc = _load(src)
    _third_removed(doc)
    _write(doc, runs / "third-removed", src.name)
    meshscope("analyze", runs / "third-removed", check=True)
    with served(runs, runs.parent / "server.log") as (_, port):
        yield f"http://127.0.0.1:{port}", runs / "third-removed" / "report"


def test_a_damaged_run_says_so_on_its_pages_and_marks_its_rank(damaged_server, driver):
    url, report = damaged_server
    trust = json.loads((report / "summary.json").read_text())["trust"]
    assert trust["verdict"] == "not trustworthy"
    _open(driver, f"{url}/gpu?run=third-removed", "#trust-verdict")
    assert _texts(driver, "#trust-verdict")[0].startswith("Evidence: not trustworthy")
    caveats = " ".join(_texts(driver, "[id^=trust-caveat-]"))
    assert "dropped-activity" in caveats and "affects" in caveats
    _open(driver, f"{url}/overview?run=third-removed", "#breakdown-graph .xtick text")
    assert _texts(driver, "#breakdown-graph .xtick text") == ["rank 0 ‡"]
    # each finding whose numbers rest on the lost activity says so in the findings table
    found = json.loads((report / "summary.json").read_text())["findings"]
    marked = [f for f in found if "dropped-activity" in f["caveats"]]
    assert marked
    table = _css(driver, "#findings-table")[0].text
    assert table.count("rests on evidence that failed: dropped-activity") == len(marked)


def test_compare_page_says_each_sides_evidence(trace_pair_server, driver):
    url, _ = trace_pair_server
    _open(driver, f"{url}/compare?run=control&run=test", "#compare-evidence-before")
    before = _texts(driver, "#compare-evidence-before")[0]
    after = _texts(driver, "#compare-evidence-after")[0]
    # one rank of an 8-rank A100 job against one of a 2-rank V100 job: each misses ranks
    assert before.startswith("Evidence of control: usable with caveats") and \
        "missing-ranks" in before
    assert after.startswith("Evidence of test: usable with caveats")


def test_browser_console_has_no_errors(server, driver):
    CONSOLE.extend(driver.get_log("browser"))
    assert len(OPENED) >= 10, "the page tests did not run before this one"
    severe = [e for e in CONSOLE if e["level"] == "SEVERE"]
    assert severe == []


def test_one_step_time_on_every_view_of_the_slow_rank_sample(server, driver):
    """Issue 23: the runs list, the overview, the compare page and the static report show the
    summary's one step time with its source, and the overview's bars are the summary's
    per-rank compute without the overlapped communication (read from plotly's figure data)."""
    s = _summary(SLOW)
    shown = f"{s['step_time_us'] / 1e3:.2f} ms (step timer)"
    _open(driver, server + "/", "#runs-table td")
    row = next(r for r in _css(driver, "#runs-table tbody tr") if SLOW in r.text)
    assert f"{s['step_time_us'] / 1e3:.2f}" in row.text and "step timer" in row.text
    _open(driver, f"{server}/overview?run={SLOW}", "#breakdown-graph .xtick text")
    assert shown in _css(driver, "#run-facts")[0].text
    data = driver.execute_script(
        "return document.querySelector('#breakdown-graph .js-plotly-plot').data"
        ".map(t => [t.name, t.y])")
    bars = dict((name, y) for name, y in data)
    want = [(r["compute_us"] - r["overlapped_comm_us"]) / 1e3 for r in s["per_rank_mean"]]
    assert bars["compute without overlapped comm"] == pytest.approx(want, abs=1e-3)
    _open(driver, f"{server}/compare?run={SLOW}&run={PIPELINED}", "#compare-table")
    table = _css(driver, "#compare-table")[0].text
    assert f"{s['step_time_us'] / 1e3:.2f}" in table and "ranks (world size)" in table


def _figure_data(d, div_id):
    return d.execute_script(
        f"return document.querySelector('#{div_id} .js-plotly-plot').data"
        ".map(t => ({name: t.name, x: t.x, y: t.y}))")


def test_every_page_of_the_slow_rank_sample(server, driver):
    """Each page of dp2-pp2-slow-rank1 renders, and the figures' own data (read from plotly in
    the browser) hold the summary's numbers: the savings per rank, the stage bubbles, the
    compare page's bars equal to its table. The screenshots of docs/img come from here."""
    s = _summary(SLOW)
    step = s["steps"][-1]
    _open(driver, f"{server}/overview?run={SLOW}", "#breakdown-graph .xtick text",
          shot="overview")
    _open(driver, f"{server}/pipeline?run={SLOW}&step={step}", "#gantt-graph .point",
          shot="pipeline")
    bubbles = {t["name"]: t["y"] for t in _figure_data(driver, "bubble-graph")}
    assert bubbles["measured"] == pytest.approx([100 * x["bubble_fraction"]
                                                 for x in s["pipeline_stages"]])
    _open(driver, f"{server}/communication?run={SLOW}", "#busbw-graph .point",
          shot="communication")
    assert len(_css(driver, "#rank-matrix-graph .hm")) == 2
    _open(driver, f"{server}/stragglers?run={SLOW}", "#saving-graph .point", shot="stragglers")
    saving = _figure_data(driver, "saving-graph")[0]
    want = sorted(s["cross_rank"]["rank_savings"], key=lambda r: r["rank"])
    assert saving["y"] == pytest.approx([r["saving_us"] / 1e3 for r in want])
    _open(driver, f"{server}/timeline?run={SLOW}", "#timeline-graph .ytick text",
          shot="timeline")
    _open(driver, f"{server}/health?run={SLOW}", "#fr-summary, #fr-healthy, #fr-none",
          shot="health")
    _open(driver, f"{server}/compare?run={SLOW}&run={PIPELINED}&run={MOE}",
          "#compare-graph .point", shot="compare")
    rows = {r.find_elements("css selector", "td")[0].text.strip():
            [c.text for c in r.find_elements("css selector", "td")[1:]]
            for r in _css(driver, "#compare-table tbody tr")}
    names = [th.text for th in _css(driver, "#compare-table thead th")][1:]
    bars = {t["name"]: t["y"] for t in _figure_data(driver, "compare-graph")}
    for label, bar in (("step time (ms)", "step time"),
                       ("compute (ms, mean over ranks)", "compute"),
                       ("exposed comm (ms)", "exposed comm")):
        assert [f"{v:.2f}" for v in bars[bar]] == rows[label], label
    assert rows["ranks (world size)"] == [str(_summary(n)["run"]["world_size"]) for n in names]
    assert _css(driver, "#compare-world")
    # ... and none of these pages logged a browser error.
    assert [e for e in CONSOLE if e["level"] == "SEVERE"] == []
