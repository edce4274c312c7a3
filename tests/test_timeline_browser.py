"""The timeline page in a real headless Chromium (``meshscope dashboard samples/``, waitress),
read back from plotly's own figure in the browser: "comm tp", "bubble" and "wait" drawn in
distinct colours (the dashboard's ``COLOURS``; on a pipeline the pp send/recv is bubble, the
breakdown's sets, so a tp×pp run shows all three), and ``?rank=R`` marking rank R's lane —
one band over that lane's bars and its label in bold — while the same page without ``rank``
marks nothing.

Under them, the rank's trace by name (``timeline-events-graph``): hovering an event shows its
name; its lanes are the trace's CPU threads (and, on a GPU trace, its streams); the search box
finds a kernel by a piece of its name and dims the rest; a step picked in the page replaces the
history entry, so Back leaves the Timeline at once; and on a PyTorch 1.8 trace of the shared
corpus (kineto_tb_samples' resnet50, whose steps begin with 25-63 ms of data loading with
nothing drawn), both figures start at the step's start, 0, with the gap before the first
segment shown, and the launch → kernel flows are drawn.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import SHARED_TRACES, meshscope, shared_trace
from meshscope.dashboard.pages.common import COLOURS
from test_dashboard_browser import _choose, _css, _open, driver  # noqa: F401  (the browser)
from test_dashboard_server import served

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SLOW = "dp2-pp2-slow-rank1"
TP_PP = "tp2-pp2-interleaved"
KINETO = "resnet50_num_workers_0"    # ../shared/traces/gpu/kineto_tb_samples: PyTorch 1.8
EVENTS = "#timeline-events-graph"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    """One runs folder for the module's one server: the two samples, and the PyTorch 1.8
    trace of the shared corpus analysed beside them when the corpus is there."""
    root = tmp_path_factory.mktemp("timeline-runs")
    for run in (SLOW, TP_PP):
        shutil.copytree(SAMPLES / run, root / run)
    trace = SHARED_TRACES / "gpu" / "kineto_tb_samples" / KINETO
    if trace.is_dir():
        shutil.copytree(trace, root / KINETO)
        meshscope("analyze", root / KINETO, check=True)
    return root


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory):
    with served(runs, tmp_path_factory.mktemp("dash") / "server.log") as (_, port):
        yield f"http://127.0.0.1:{port}"


def _figure(d) -> dict:
    return d.execute_script(
        "const g = document.querySelector('#timeline-graph .js-plotly-plot');"
        "return {data: g.data.map(t => ({name: t.name, type: t.type,"
        "  colour: t.marker ? t.marker.color : null})),"
        "  shapes: (g.layout.shapes || []).map(s => ({name: s.name, y0: s.y0, y1: s.y1})),"
        "  lanes: g.layout.yaxis.categoryarray};")


def test_comm_bubble_and_wait_have_their_own_colours(server, driver):  # noqa: F811
    step = json.loads((SAMPLES / TP_PP / "report" / "summary.json").read_text())["steps"][-1]
    _open(driver, f"{server}/timeline?run={TP_PP}&step={step}", "#timeline-graph .ytick text")
    fig = _figure(driver)
    colour = {t["name"]: t["colour"] for t in fig["data"] if t["type"] == "bar"}
    assert {"comm tp", "bubble", "wait"} <= set(colour)
    assert all(colour[k] == COLOURS[k] for k in ("comm tp", "bubble", "wait"))
    assert len({colour["comm tp"], colour["bubble"], colour["wait"]}) == 3
    assert not [s for s in fig["shapes"] if (s["name"] or "").startswith("highlight")]
    assert not _css(driver, "#timeline-graph .ytick text[style*='bold'], "
                            "#timeline-graph .ytick tspan[style*='bold']")


def test_rank_in_the_url_marks_that_lane(server, driver):  # noqa: F811
    step = json.loads((SAMPLES / SLOW / "report" / "summary.json").read_text())["steps"][-1]
    _open(driver, f"{server}/timeline?run={SLOW}&step={step}&rank=1",
          "#timeline-graph .ytick text")
    fig = _figure(driver)
    marked = [s for s in fig["shapes"] if (s["name"] or "").startswith("highlight")]
    assert len(marked) == 1
    lane = fig["lanes"][round((marked[0]["y0"] + marked[0]["y1"]) / 2)]
    assert lane.startswith("rank 1")
    bold = [e.text for e in _css(driver, "#timeline-graph .ytick tspan[style*='bold']")]
    assert bold == [lane]


def _events(d) -> dict:
    return d.execute_script(
        "const g = document.querySelector('#timeline-events-graph .js-plotly-plot');"
        "return {traces: g.data.map(t => ({name: t.name, meta: t.meta || null,"
        "  names: t.customdata || [], opacity: t.marker ? t.marker.opacity : null})),"
        "  lanes: g.layout.yaxis.categoryarray, range: g.layout.xaxis.range};")


def _hover_widest_bar(d) -> str:
    """Move the pointer over the widest bar of the events figure; the hover label's text."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    bar = d.execute_script(
        "let best = null, w = 0;"
        "for (const p of document.querySelectorAll("
        "  '#timeline-events-graph .barlayer .point path')) {"
        "  const b = p.getBoundingClientRect();"
        "  if (b.width > w && b.height > 4) { w = b.width; best = p; } }"
        "return best;")
    ActionChains(d).move_to_element(bar).perform()
    WebDriverWait(d, 10).until(lambda x: _css(x, f"{EVENTS} .hoverlayer .hovertext"))
    return " ".join(e.text for e in _css(d, f"{EVENTS} .hoverlayer .hovertext"))


def test_events_have_names_on_hover_lanes_and_a_search(server, driver):  # noqa: F811
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    _open(driver, f"{server}/timeline?run={SLOW}&rank=1", f"{EVENTS} .barlayer .point")
    fig = _events(driver)
    named = [t for t in fig["traces"] if t["meta"] == "named"]
    names = {n for t in named for n in t["names"]}
    assert fig["lanes"] and all(x.startswith("CPU thread ") for x in fig["lanes"])
    assert any(n.startswith("aten::") for n in names)
    said = _hover_widest_bar(driver)
    assert any(n in said for n in names), said
    # search: a piece of a name, any case
    box = _css(driver, "#timeline-search")[0]
    box.send_keys("ATEN::MM" + Keys.ENTER)
    WebDriverWait(driver, 20).until(
        lambda d: "hold" in _css(d, "#timeline-search-result")[0].text)
    result = _css(driver, "#timeline-search-result")[0].text
    hits = sum(1 for t in named for n in t["names"] if "aten::mm" in n.lower())
    assert hits > 0 and result.startswith(f"{hits} event")
    after = [t for t in _events(driver)["traces"] if t["meta"] == "named"]
    for t in after:
        assert [o == 1 for o in t["opacity"]] == ["aten::mm" in n.lower() for n in t["names"]]
    # a name nothing holds
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("no-such-kernel-name" + Keys.ENTER)
    WebDriverWait(driver, 20).until(
        lambda d: "no event holds" in _css(d, "#timeline-search-result")[0].text)


def test_back_leaves_the_timeline_after_a_step_is_picked(server, driver):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    steps = json.loads((SAMPLES / SLOW / "report" / "summary.json").read_text())["steps"]
    _open(driver, f"{server}/overview?run={SLOW}", "#breakdown-graph .point")
    _css(driver, "#nav-timeline")[0].click()
    WebDriverWait(driver, 30).until(lambda d: _css(d, "#timeline-graph .point"))
    _choose(driver, "#step-select", str(steps[-1]))
    WebDriverWait(driver, 30).until(
        lambda d: parse_qs(urlsplit(d.current_url).query).get("step") == [str(steps[-1])])
    WebDriverWait(driver, 30).until(
        lambda d: [e.text for e in _css(d, "#timeline-graph .gtitle")] ==
        [f"Step {steps[-1]} on the aligned clock"])
    driver.back()
    WebDriverWait(driver, 30).until(lambda d: urlsplit(d.current_url).path == "/overview")
    WebDriverWait(driver, 30).until(lambda d: _css(d, "#breakdown-graph .point"))


def test_the_step_shows_from_its_start_with_streams_and_flows(server, runs, driver):  # noqa: F811,E501
    import pandas as pd

    shared_trace(f"gpu/kineto_tb_samples/{KINETO}")     # skips without the shared corpus
    url, report = server, runs / KINETO / "report"
    segs = pd.read_parquet(report / "timeline.parquet")
    step = int(segs["step"].min())
    first_ms = segs.loc[segs["step"] == step, "start_us"].min() / 1e3
    assert first_ms > 20        # the data loader's gap: nothing drawn at the step's start
    _open(driver, f"{url}/timeline?run={KINETO}&step={step}", f"{EVENTS} .barlayer .point")
    top = driver.execute_script(
        "const g = document.querySelector('#timeline-graph .js-plotly-plot');"
        "return g.layout.xaxis.range;")
    assert top[0] == 0 and top[1] >= segs.loc[segs["step"] == step, "end_us"].max() / 1e3
    fig = _events(driver)
    assert fig["range"][0] == 0
    assert any(x.startswith("GPU 0 stream ") for x in fig["lanes"])
    assert any(x.startswith("CPU thread ") for x in fig["lanes"])
    assert fig["lanes"].index(next(x for x in fig["lanes"] if x.startswith("GPU"))) < \
        fig["lanes"].index(next(x for x in fig["lanes"] if x.startswith("CPU")))  # CPU on top
    assert any(t["name"] == "launch → GPU" for t in fig["traces"])
    kernels = {n for t in fig["traces"] if t["meta"] == "named" for n in t["names"]
               if "kernel" in n.lower()}
    assert kernels
