"""Every view of every real GPU trace set (issue 35, item 1): the sets of
``../shared/traces/gpu/`` (recorded by others: HTA's, TraceLens', the TensorBoard plugin's;
one rank, two ranks of a 128-rank job, ROCm, vLLM), each analysed as a user would, then every
dashboard page built, the static HTML report written, and — in Chromium — every page opened:
no page falls back to an error panel, and the overview's headline step time is the one
``meshscope analyze --json`` gives; every cost % is of that one step time, in the JSON, the CLI
text, the overview and the straggler's line (``test_one_number.one_base_everywhere``). (Before, three sets' Communication page and HTML export
ended in "boolean value of NA is ambiguous".)"""
from __future__ import annotations

import pytest

from meshscope.dashboard import state as st
from meshscope.dashboard.app import BUILDERS
from meshscope.dashboard.data import open_report
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.static_report import render_html
from meshscope.analysis.report import text
from test_one_number import one_base_everywhere

@pytest.fixture(scope="module")
def real_runs(real_gpu_sets):
    """The shared GPU sets analysed once a session (``conftest.real_gpu_sets``)."""
    return real_gpu_sets


@pytest.mark.slow
def test_every_page_and_the_html_report_of_every_real_set(real_runs):
    root, summaries = real_runs
    index = RunIndex(root)
    analysed = [n for n, s in summaries.items() if s is not None]
    assert len(analysed) >= 15
    for name in analysed:
        report = open_report(index.get(name))
        for page, build in BUILDERS.items():
            sections = build(PageContext(report, st.ViewState(page=page, runs=(name,))))
            assert sections, (name, page)
        html = render_html(report)
        assert html.startswith("<!DOCTYPE html>") and "Traceback" not in html, name
        one_base_everywhere(summaries[name], report, text.render(summaries[name]))
        shown = f"{summaries[name]['step_time_us'] / 1e3:.2f} ms"
        assert shown in html, (name, shown)


@pytest.mark.browser
def test_every_page_of_every_real_set_in_the_browser(real_runs, tmp_path):
    from test_dashboard_browser import _css, _texts, _wait
    pytest.importorskip("selenium.webdriver")
    root, summaries = real_runs
    from test_dashboard_server import served
    import test_dashboard_browser as browser

    if not browser.CHROMIUM.exists() or not browser.CHROMEDRIVER.exists():
        pytest.skip("needs Debian's chromium and chromium-driver")
    d = _driver(tmp_path)
    console: list = []
    try:
        with served(root, tmp_path / "server.log") as (_, port):
            url = f"http://127.0.0.1:{port}"
            d.get(f"{url}/")          # the app loads once; each page after is a client-side move
            _wait(d, "#nav-home")
            for name, summary in summaries.items():
                if summary is None:
                    continue
                for page in st.PAGES:
                    # a comparison and a history are of several runs (one real set is not
                    # a series): tests/test_history_browser.py and the compare page's own
                    # browser tests open them
                    if page in ("compare", "history"):
                        continue
                    if page == "gpu" and summary.get("device") != "gpu":
                        continue
                    _move(d, url, st.ViewState(page=page, runs=(name,)),
                          "#run-title, #run-message, #page-error, #page-building")
                    assert not _css(d, "#page-error, #run-message"), \
                        (name, page, _texts(d, "#page-error, #run-message"))
                    console.extend((name, page, e) for e in d.get_log("browser"))
                _move(d, url, st.ViewState(page="overview", runs=(name,)), "#run-facts")
                shown = f"{summary['step_time_us'] / 1e3:.2f} ms"
                assert shown in d.find_element("css selector", "#page").text, (name, shown)
            assert "Traceback" not in (tmp_path / "server.log").read_text()
        # no page of any real set left an error in the browser's console (drawing included:
        # plotly reports a figure it cannot draw there)
        assert [c for c in console if c[2]["level"] == "SEVERE"] == []
    finally:
        d.quit()


def _move(d, url, view, ready):
    """Go to ``view`` as a click on one of the app's links does — the URL pushed and the app's
    Location told, no page load — and wait until its page is drawn and ``ready`` is there.
    The nav and the page are the two outputs of one callback, so they change together: a
    page the nav links to is drawn when its link is the bold one and points at the view's
    run; Memory, which the nav leaves out for a run without memory records, when no link is
    bold and the page says it has no memory (or fails). Before the app has a nav, the page is
    loaded by its URL. ~190 pages here: loading the whole app for each (its scripts parsed
    again) took about half of this test's time; test_dashboard_browser opens pages by URL."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait
    from test_dashboard_browser import _wait
    href = view.href()
    nav = ("const a = document.getElementById('nav-' + arguments[0]);"
           "return a === null ? null : [a.getAttribute('href'), a.style.fontWeight];")
    if d.execute_script("return document.getElementById('nav-overview') === null"):
        d.get(url + href)
        _wait(d, ready)
        return
    linked = d.execute_script(nav, view.page) is not None
    if not linked and view.page != "memory":
        raise AssertionError(f"{href}: the nav has no link to {view.page} and no page stands "
                             f"in for it")
    d.execute_script("window.history.pushState({}, '', arguments[0]);"
                     "window.dispatchEvent(new CustomEvent('_dashprivate_pushstate'));", href)
    unlinked = ("return [...document.querySelectorAll('#nav a')].every("
                "a => a.style.fontWeight !== '600') && document.querySelector("
                "'#memory-none, #page-error, #run-message, #page-building') !== null;")
    try:
        WebDriverWait(d, 45).until(
            (lambda x: x.execute_script(nav, view.page) == [href, "600"]) if linked
            else (lambda x: x.execute_script(unlinked)))
    except TimeoutException:
        raise AssertionError(f"{href} not drawn: its nav link is "
                             f"{d.execute_script(nav, view.page)}") from None
    _wait(d, ready)


def _driver(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    import test_dashboard_browser as browser

    options = webdriver.ChromeOptions()
    options.binary_location = str(browser.CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--window-size=1300,1200", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=str(browser.CHROMEDRIVER)),
                         options=options)
    d.set_page_load_timeout(60)
    return d
