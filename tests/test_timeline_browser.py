"""The timeline page in a real headless Chromium (``meshscope dashboard samples/``, waitress),
read back from plotly's own figure in the browser: "comm tp", "bubble" and "wait" drawn in
distinct colours (the dashboard's ``COLOURS``; on a pipeline the pp send/recv is bubble, the
breakdown's sets, so a tp×pp run shows all three), and ``?rank=R`` marking rank R's lane —
one band over that lane's bars and its label in bold — while the same page without ``rank``
marks nothing.
"""
from __future__ import annotations

import json
import pathlib

import pytest
from meshscope.dashboard.pages.common import COLOURS
from test_dashboard_browser import _css, _open, driver  # noqa: F401  (the module's browser)
from test_dashboard_server import served

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SLOW = "dp2-pp2-slow-rank1"
TP_PP = "tp2-pp2-interleaved"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with served(SAMPLES, tmp_path_factory.mktemp("dash") / "server.log") as (_, port):
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
