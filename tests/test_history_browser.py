"""The History page in a real headless Chromium (issue 50 item 3): four synthetic runs, rank 1
slowed from the third; the page draws the step time's trend with its change point at run 3,
and a click on that point opens the compare of runs 2 and 3."""
from __future__ import annotations

import sys
import time

import pytest

from conftest import ROOT
from test_dashboard_browser import CHROMEDRIVER, CHROMIUM, _css, _wait
from test_dashboard_server import served

sys.path.insert(0, str(ROOT))
from bench import history_synth  # noqa: E402

# About 12 s on this 2-core machine when nothing else runs (a server, Chromium, two page
# builds); the page's numbers and links are also checked without a browser in test_history.py.
pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def four_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("history_browser") / "runs"
    history_synth.make_series(out, 4, slow_from=3, compute_from=None, memory_from=None,
                              other_device=False, events_per_step=200)
    return out


def test_a_click_on_the_change_point_opens_the_compare_either_side(four_runs, tmp_path):
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip("needs Debian's chromium and chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,1200", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    with served(four_runs, tmp_path / "server.log") as (_, port):
        d = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)),
                             options=options)
        try:
            d.get(f"http://127.0.0.1:{port}/history?quantity=step_time")
            _wait(d, "#history-trend .scatterlayer .trace")
            time.sleep(0.3)
            # The change point: the last trace's one marker, at run 3.
            (point,) = _css(d, "#history-trend .scatterlayer .trace:last-child .points path")
            assert "run03" in d.find_element("css selector", "#history-changes").text
            webdriver.ActionChains(d).move_to_element(point).click().perform()
            _wait(d, "#compare-table, #compare-steps")
            assert d.current_url.endswith("/compare?run=run02&run=run03"), d.current_url
        finally:
            d.quit()
