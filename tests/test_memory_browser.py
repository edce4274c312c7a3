"""The Memory page in a real headless Chromium, over a runs folder holding one CPU run of the
runner recorded with memory (pp=2 with ``--inject leak=1:8``, ``conftest.memory_twins``): the per-rank peak bars, the
allocated curve and the live-at-peak table hold the report's numbers (read back from plotly's
figure data and the rendered tables), the rank picker moves the view to another rank, the
navigation links to the page, and the browser console stays free of errors.

``MESHSCOPE_SCREENSHOTS=docs/img pytest tests/test_memory_browser.py`` also saves the page's
screenshot there (docs/memory.md shows it)."""
from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pandas as pd
import pytest

from test_dashboard_browser import CONSOLE, _css, _open, _texts, _wait, driver  # noqa: F401
from test_dashboard_server import served

RUN = "leak"
MiB = 1 << 20
pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def memory_server(memory_twins, tmp_path_factory):
    """The dashboard over the folder of ``conftest.memory_twins`` (the leaking run and its
    healthy twin, shared with tests/test_memory_runs.py)."""
    _, leak = memory_twins
    with served(leak.parent, tmp_path_factory.mktemp("memory-dash") / "server.log") as \
            (_, port):
        yield f"http://127.0.0.1:{port}", leak / "report"


def _data(driver, graph):
    return driver.execute_script(
        f"return document.querySelector('#{graph} .js-plotly-plot').data"
        ".map(t => [t.name, t.x, t.y]);")


def test_memory_page_draws_the_reports_numbers(memory_server, driver):
    url, report = memory_server
    _open(driver, f"{url}/memory?run={RUN}", "#memory-curve-graph .scatterlayer .trace",
          shot="memory")
    devices = pd.read_parquet(report / "memory_devices.parquet").sort_values("rank")
    name, xs, ys = _data(driver, "memory-peaks-graph")[0]
    assert name == "peak allocated" and len(xs) == 2
    assert ys == pytest.approx([b / MiB for b in devices["peak_allocated_bytes"]], abs=1e-3)
    # The rank with the largest peak is shown first: the leaking rank 1.
    curve = {n: y for n, _, y in _data(driver, "memory-curve-graph")}
    peak1 = float(devices.loc[devices["rank"] == 1, "peak_allocated_bytes"].iloc[0])
    assert max(curve["allocated"]) == pytest.approx(peak1 / MiB, abs=1e-3)
    live = pd.read_parquet(report / "memory_live.parquet")
    assert len(_css(driver, "#memory-live-table tbody tr")) == len(live[live["rank"] == 1])
    assert "Memory grows on rank 1" in _texts(driver, "#memory-findings-table")[0]
    assert _css(driver, "#nav-memory")
    CONSOLE.extend(driver.get_log("browser"))


def test_the_rank_picker_moves_the_view(memory_server, driver):
    from selenium.webdriver.support.ui import WebDriverWait

    url, report = memory_server
    _open(driver, f"{url}/memory?run={RUN}&rank=0", "#memory-curve-graph .scatterlayer .trace")
    assert parse_qs(urlsplit(driver.current_url).query)["rank"] == ["0"]
    _wait(driver, "#memory-rank h3")
    assert "rank 0" in _texts(driver, "#memory-rank h3")[0]
    live = pd.read_parquet(report / "memory_live.parquet")
    WebDriverWait(driver, 30).until(lambda d: len(_css(d, "#memory-live-table tbody tr"))
                                    == len(live[live["rank"] == 0]))
    CONSOLE.extend(driver.get_log("browser"))
    assert [e for e in CONSOLE if e["level"] == "SEVERE"] == []
