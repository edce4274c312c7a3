"""Every page of synthetic many-rank jobs drawn in a real headless Chromium (issue 51 item 3):
the jobs of ``bench/dashboard_latency.py`` (``bench.synth.make_run``: dp = N/2 × pp = 2, rank 1
slowed by 20 ms), small in events so that generating and analysing them fits this file's
budget, served by ``meshscope dashboard`` (waitress).

Each page opens with no error in the browser's console and its main figure drawn (the figure
above 48 ranks: the distribution and top-ranks figures, the first tab of a page of tabs), every
figure drawn with the margins the page sent (plotly's automargin found nothing to grow, so it
drew the figure once: ``dashboard/figure_margins.py``), each other tab of a page of tabs draws its figures when opened, the rank picker's search finds a
rank it does not list (typed, asked of the server) and focuses the Timeline on it, and Back
then leaves the Timeline at once (the picker replaces the history entry). A 4-rank sample —
the healthy input, below ``MANY_RANKS`` — has no tabs.

The times of the same pages, 64 and 1,024 ranks, are ``bench/dashboard_latency.py --browser``'s
(docs/benchmarks.md): analysing a 1,024-rank job takes minutes, so here the many-rank job is
``RANKS`` ranks, above ``MANY_RANKS`` and above the picker's ``MAX_RANK_OPTIONS``.
"""
from __future__ import annotations

import pathlib
import shutil
import sys
from urllib.parse import parse_qs, urlsplit

import pytest

from conftest import meshscope
from test_dashboard_browser import _css, driver  # noqa: F401  (the browser)
from test_dashboard_server import served

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.dashboard_latency import DRAWN_JS, PAGES, TAB_DRAWN_JS  # noqa: E402
from bench.synth import make_run  # noqa: E402
RANKS = 50     # above MANY_RANKS and MAX_RANK_OPTIONS (48), dp = 25 × pp = 2
RUN = f"synth-{RANKS}"
SAMPLE = "dp2-pp2-slow-rank1"
# What each page draws first for many ranks: its main figure, or the note a CPU job's page
# has instead (the synthetic job ran on gloo: no GPU page figures).
MAIN = {"overview": "#mesh-graph", "gpu": "#page #gpu-none, #page .dash-graph",
        "pipeline": "#gantt-graph", "communication": "#busbw-graph",
        "stragglers": "#heatmap-graph", "timeline": "#timeline-graph",
        "health": "#run-title"}

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    """The runs folder: the synthetic job of ``RANKS`` ranks (the bench's, 20 trace events a
    step), analysed, and the 4-rank slow-rank sample."""
    root = tmp_path_factory.mktemp("many-ranks")
    make_run(root / RUN, ranks=RANKS, events_per_step=20, layout=f"dp={RANKS // 2},pp=2",
             slow_rank=1, slow_ms=20, workers=1)
    meshscope("analyze", root / RUN, check=True)
    shutil.copytree(ROOT / "samples" / SAMPLE, root / SAMPLE)
    return root


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory):
    with served(runs, tmp_path_factory.mktemp("dash") / "server.log") as (_, port):
        yield f"http://127.0.0.1:{port}"


def _drawn(d, url: str) -> None:
    """Open ``url`` and wait until the page is drawn as the bench waits for it
    (``bench.dashboard_latency.DRAWN_JS``: the callback answered, nothing loading, every
    figure's SVG in the page)."""
    from selenium.webdriver.support.ui import WebDriverWait

    d.get(url)
    WebDriverWait(d, 60).until(lambda x: x.execute_script(DRAWN_JS))


# Drawn once: the margins plotly drew each figure with (``_fullLayout._size``, after its
# automargin) are the ones the page sent (``dashboard/figure_margins.py``), not grown.
GROWN_JS = """
return [...document.querySelectorAll('#page .dash-graph .js-plotly-plot')].flatMap(gd => {
  const sent = gd.layout.margin, drawn = gd._fullLayout._size;
  return ['l', 'r', 'b'].filter(k => Math.round(drawn[k]) > sent[k])
    .map(k => `${gd.parentElement.id}: margin ${k} ${sent[k]} grown to ${drawn[k]}`);
});
"""


def _grown(d) -> list[str]:
    return d.execute_script(GROWN_JS)


def _severe(d) -> list[str]:
    return [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]


def test_every_page_of_many_ranks_draws_its_main_figure_and_tabs(server, driver):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    tabbed = {}
    for page in PAGES:
        _drawn(driver, f"{server}/{page}?run={RUN}")
        main = MAIN[page]
        assert _css(driver, main), (page, main)
        for graph in _css(driver, "#page .dash-graph"):
            assert _css(graph, ".main-svg"), (page, graph.get_attribute("id"))
        assert _grown(driver) == [], page
        tabs = [t.get_attribute("id") for t in _css(driver, "#page .tab")]
        tabbed[page] = len(tabs)
        for tab in tabs[1:]:          # each other tab drawn when it is opened
            driver.execute_script("document.getElementById(arguments[0]).click();", tab)
            WebDriverWait(driver, 60).until(lambda x: x.execute_script(TAB_DRAWN_JS, tab))
            assert _grown(driver) == [], (page, tab)
        assert _severe(driver) == [], page
    # the pages of many figures are tabs (the overview's: the mesh, the step breakdown; a
    # CPU job has no GPU idle tab)
    assert tabbed["stragglers"] == 4 and tabbed["communication"] == 4 and \
        tabbed["timeline"] == 2 and tabbed["overview"] == 2
    # a healthy input, 4 ranks: one page, no tabs
    _drawn(driver, f"{server}/stragglers?run={SAMPLE}")
    assert not _css(driver, "#page .tab") and _css(driver, "#clock-graph .main-svg")


def test_the_picker_finds_an_unlisted_rank_and_back_leaves_the_timeline(server, driver):  # noqa: F811,E501
    from selenium.webdriver.support.ui import WebDriverWait

    from meshscope.dashboard.app import MAX_RANK_OPTIONS

    rank = RANKS - 1
    assert rank >= MAX_RANK_OPTIONS       # not among the options the page sends
    _drawn(driver, f"{server}/overview?run={RUN}")
    _css(driver, "#nav-timeline")[0].click()
    WebDriverWait(driver, 60).until(lambda d: urlsplit(d.current_url).path == "/timeline")
    WebDriverWait(driver, 60).until(lambda d: _css(d, "#timeline-graph .main-svg"))
    _css(driver, "#rank-select")[0].click()
    listed = [o.text for o in _css(driver, "[role=option]")]
    assert len(listed) == MAX_RANK_OPTIONS and not any(
        x.startswith(f"rank {rank} ") for x in listed)
    _css(driver, "input.dash-dropdown-search")[0].send_keys(f"rank {rank} ")
    # the server answers the search with the rank the page did not list
    WebDriverWait(driver, 30).until(lambda d: [
        o for o in _css(d, "[role=option]") if o.text.startswith(f"rank {rank} ")])
    [o for o in _css(driver, "[role=option]") if o.text.startswith(f"rank {rank} ")][0].click()
    WebDriverWait(driver, 60).until(
        lambda d: parse_qs(urlsplit(d.current_url).query).get("rank") == [str(rank)])
    WebDriverWait(driver, 60).until(lambda d: any(
        f"rank {rank} " in e.text for e in _css(d, "#timeline-graph .ytick text")))
    driver.back()
    WebDriverWait(driver, 30).until(lambda d: urlsplit(d.current_url).path == "/overview")
    WebDriverWait(driver, 60).until(lambda d: _css(d, "#mesh-graph .main-svg"))
    assert _severe(driver) == []
