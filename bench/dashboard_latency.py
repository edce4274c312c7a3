"""How long the dashboard takes to serve each page's data, and how many bytes it sends, for
synthetic runs of 64, 512 and 1,024 ranks (``bench.synth.make_run``: traces, step timers,
Flight Recorder dumps and run.json shaped like the runner's) — and, with ``--browser``, how
long each page takes to be drawn in headless Chromium.

For each rank count: generate the run, analyse it (``meshscope analyze``, not timed here), then
ask the dashboard for every page the way the browser does — one POST of Dash's page callback to
the Flask app, in process — ``--repeat`` times, and report the median wall time of that request
and the size of its response (the JSON the browser receives: components and figures). The
first request of a page (cold: report tables read from disk, the timeline built) is reported
apart from the median of the later ones (warm: the report cached in the server). Targets
(DESIGN.md): under 1 s per page at 64 ranks, under 3 s at 512; under 2 MB sent for a 64-rank
page.

``--browser``: the runs are served by ``meshscope dashboard`` (waitress, a process of its own)
and each page is opened in headless Chromium (Debian's ``/usr/bin/chromium`` and
``chromedriver``, through selenium, as ``tests/test_dashboard_browser.py`` drives it): the time
from the navigation's start (``performance.timeOrigin``) until the page is drawn — the page's
callback answered (the run's title in the page), no loading indicator left, and every plotly
figure of it drawn (its SVG in the DOM) — once cold (the report read from disk), then ``--repeat`` warm loads, of which the
median is reported (issue 51's target: ≤ 1.5 s median of 3 warm loads). The payload is the
body of the page callback's response as the browser received it (Resource Timing's
``encodedBodySize``; the server does not compress).

    flock /tmp/meshscope-cpu.lock .venv/bin/python -m bench.dashboard_latency \\
        --ranks 64 512 1024 --out /tmp/dash-bench [--browser --repeat 3]

``--baseline REV`` (with ``--browser``): the same report also served by the dashboard of commit
REV (``git archive`` of ``meshscope/`` and the folders it links, under ``--out``; the checkout
untouched), each load of a page taken in turn from REV's server and this checkout's in the same
browser, so that before and after see the same load of a shared machine; both are reported.
A page of tabs (``sections.Section.tabs``) draws its open tab only: each other tab is then
opened and timed from its click until its figures are drawn. ``--profile``: after a page's
loads, where one more load's time went (scripts ready, page callback answered, drawn) and each
figure drawn again alone (traces, points, bytes of its JSON, ms), to stderr. ``--pages``: only
these pages.

``--gpu-trace TRACE`` (with ``--browser``): a GPU job instead — one GPU rank's Kineto trace
copied to each rank count, each copy named its rank in ``distributedInfo`` — for the GPU page
(``../shared/traces/gpu/kineto_tb_samples/resnet50_num_workers_0/worker0.pt.trace.json.gz``).

Results go to stdout as a Markdown table (docs/benchmarks.md, "Dashboard latency").
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

PAGES = ("overview", "gpu", "pipeline", "communication", "stragglers", "timeline", "health")
CHROMIUM, CHROMEDRIVER = pathlib.Path("/usr/bin/chromium"), pathlib.Path("/usr/bin/chromedriver")
# Drawn: the page callback has answered (the run's title is in the page area, no Dash loading
# indicator left) and every plotly figure in it has its SVG.
DRAWN_JS = """
const page = document.getElementById('page');
if (!page || !page.querySelector('#run-title') ||
    document.querySelector('[data-dash-is-loading="true"]')) return null;
if (page.querySelector('#page-building, #analysis-progress')) return null;
const plots = page.querySelectorAll('.dash-graph');
for (const g of plots) { if (!g.querySelector('.js-plotly-plot .main-svg')) return null; }
const sizes = performance.getEntriesByType('resource')
    .filter(e => e.name.includes('_dash-update-component')).map(e => e.encodedBodySize);
return [performance.now(), Math.max(0, ...sizes), plots.length];
"""
# Where a drawn page's time went (``--profile``): the page's scripts ready (DOMContentLoaded),
# the page callback answered (its response's end), then each figure of the page drawn again
# alone into a hidden element of the same width (Plotly.newPlot), with its traces, points
# (the longest of x, y, z, base per trace, summed) and the bytes of its figure JSON.
PROFILE_JS = """
const done = arguments[arguments.length - 1];
const nav = performance.getEntriesByType('navigation')[0];
const cb = performance.getEntriesByType('resource')
    .filter(e => e.name.includes('_dash-update-component'))
    .sort((a, b) => b.encodedBodySize - a.encodedBodySize)[0];
const figs = [];
(async () => {
  for (const g of document.querySelectorAll('#page .dash-graph')) {
    const gd = g.querySelector('.js-plotly-plot');
    const json = JSON.stringify({data: gd.data, layout: gd.layout});
    const len = a => (a && a.length) || 0;
    const points = gd.data.reduce((n, t) => n + Math.max(len(t.x), len(t.y), len(t.z),
                                                          len(t.base)), 0);
    const div = document.createElement('div');
    div.style.width = gd.offsetWidth + 'px';
    document.body.appendChild(div);
    const fig = JSON.parse(json);
    const t0 = performance.now();
    await Plotly.newPlot(div, fig.data, fig.layout);
    const ms = performance.now() - t0;
    Plotly.purge(div); div.remove();
    figs.push([g.id, gd.data.length, points, json.length, ms]);
  }
  done([nav.domContentLoadedEventEnd, cb ? cb.responseEnd : null, figs]);
})();
"""


def _request(app, path: str, search: str) -> tuple[float, int]:
    from meshscope.dashboard.app import page_request

    body = page_request(app, path, search)
    client = app.server.test_client()
    t0 = time.perf_counter()
    r = client.post("/_dash-update-component", json=body)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"{path}{search}: HTTP {r.status_code}")
    return dt, len(r.get_data())


def _layout(ranks: int) -> str:
    return f"dp={ranks // 2},pp=2"


def gpu_copies(trace: pathlib.Path, folder: pathlib.Path, ranks: int) -> None:
    """``ranks`` copies of one GPU rank's Kineto trace under ``folder``, each named a rank by
    its ``distributedInfo`` where the trace is an object, by its file name (``rank3.json.gz``)
    where it is a bare array of events (PyTorch 1.8's); a plain folder of traces: no
    run.json, no collectives."""
    import gzip
    import json

    doc = json.loads(gzip.decompress(trace.read_bytes()))
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        if isinstance(doc, dict):
            doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r,
                                      "world_size": ranks}
            data = gzip.compress(json.dumps(doc).encode(), compresslevel=1)
        else:
            data = trace.read_bytes()
        (folder / f"rank{r}.json.gz").write_bytes(data)


def _prepare(ranks: int, out: pathlib.Path, events: int,
             gpu_trace: pathlib.Path | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    """(runs folder, run) of ``ranks`` synthetic ranks — or, with ``gpu_trace``, of that GPU
    trace copied ``ranks`` times (``gpu_copies``) — generated and analysed once."""
    from bench.synth import make_run

    if gpu_trace is not None:
        root = out / f"gpu{ranks}"
        run_dir = root / f"gpu-{ranks}"
        if not run_dir.is_dir():
            gpu_copies(gpu_trace, run_dir, ranks)
    else:
        root = out / f"r{ranks}"
        run_dir = root / f"synth-{ranks}"
    if gpu_trace is None and not (run_dir / "run.json").is_file():
        t0 = time.perf_counter()
        make_run(run_dir, ranks=ranks, events_per_step=events, layout=_layout(ranks),
                 slow_rank=1, slow_ms=20)
        print(f"# generated {ranks} ranks in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if not (run_dir / "report" / "summary.json").is_file():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "meshscope", "analyze", str(run_dir)],
                       check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
        print(f"# analysed {ranks} ranks in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return root, run_dir


def run(ranks: int, out: pathlib.Path, events: int, repeat: int) -> list[dict]:
    from meshscope.dashboard.app import create_app

    root, run_dir = _prepare(ranks, out, events)
    app = create_app(root)
    rows = []
    for page in PAGES:
        cold, size = _request(app, f"/{page}", f"?run={run_dir.name}")
        warm = [_request(app, f"/{page}", f"?run={run_dir.name}")[0] for _ in range(repeat)]
        rows.append({"ranks": ranks, "page": page, "cold_s": cold,
                     "warm_s": statistics.median(warm), "bytes": size})
    return rows


def _driver(profile: pathlib.Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--no-first-run", "--window-size=1300,1200", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    d = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    d.set_page_load_timeout(120)
    return d


def _drawn(d, url: str, timeout_s: float = 120.0) -> tuple[float, int, int]:
    """(seconds from the navigation's start until the page is drawn, bytes of the page
    callback's response, figures drawn)."""
    d.get("about:blank")
    d.get(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = d.execute_script(DRAWN_JS)
        if got:
            return got[0] / 1e3, int(got[1]), int(got[2])
        time.sleep(0.02)
    raise SystemExit(f"{url}: not drawn in {timeout_s:.0f} s")


# A page of tabs (``sections.Section.tabs``) draws its open tab's figures only; each other tab
# is timed from its click until its figures are drawn.
CLICK_TAB_JS = """
const tab = document.getElementById(arguments[0]);
window.__tabClick = performance.now();
tab.click();
"""
TAB_DRAWN_JS = """
const tab = document.getElementById(arguments[0]);
if (!tab.className.includes('tab--selected') ||
    document.querySelector('[data-dash-is-loading="true"]')) return null;
for (const g of document.querySelectorAll('#page .dash-graph')) {
  if (!g.querySelector('.js-plotly-plot .main-svg')) return null;
}
return [performance.now() - window.__tabClick,
        document.querySelectorAll('#page .dash-graph').length];
"""


def _tabs(d, timeout_s: float = 60.0) -> list[tuple[str, float, int]]:
    """Each tab of the drawn page after the first: (its label, seconds from its click until
    its figures are drawn, its figures)."""
    tabs = d.execute_script("return [...document.querySelectorAll('#page .tab')]"
                            ".map(t => [t.id, t.innerText])")
    out = []
    for tab_id, label in tabs[1:]:
        d.execute_script(CLICK_TAB_JS, tab_id)
        deadline = time.monotonic() + timeout_s
        while True:
            got = d.execute_script(TAB_DRAWN_JS, tab_id)
            if got:
                out.append((label, got[0] / 1e3, int(got[1])))
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"tab {label}: not drawn in {timeout_s:.0f} s")
            time.sleep(0.01)
    return out


def _profile(d, url: str, label: str) -> None:
    """Where the time of one more load of ``url`` went (``PROFILE_JS``), to stderr."""
    drawn_s = _drawn(d, url)[0]
    d.set_script_timeout(120)
    scripts_ms, answered_ms, figs = d.execute_async_script(PROFILE_JS)
    print(f"## {label}: scripts ready {scripts_ms / 1e3:.2f} s, callback answered "
          f"{(answered_ms or 0) / 1e3:.2f} s, drawn {drawn_s:.2f} s", file=sys.stderr)
    for fid, traces, points, size, ms in figs:
        print(f"##   {fid}: {traces} traces, {points} points, {size / 1e3:.0f} kB, "
              f"drawn alone in {ms:.0f} ms", file=sys.stderr)


def _serve(root: pathlib.Path, source: pathlib.Path | None = None):
    """(process, port) of ``meshscope dashboard root`` once it answers; ``source``: a folder
    holding another version's ``meshscope`` package (``_baseline``), imported instead of this
    checkout's."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if source is not None:      # its folder first on the path, and the working directory
        env["PYTHONPATH"] = str(source)
    server = subprocess.Popen([sys.executable, "-m", "meshscope", "dashboard", str(root),
                               "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, cwd=source)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, port
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.terminate()
                raise SystemExit("the dashboard did not start")
            time.sleep(0.2)


def _baseline(rev: str, out: pathlib.Path) -> pathlib.Path:
    """The ``meshscope`` package of commit ``rev`` exported (``git archive``, the checkout
    untouched) under ``out``, with the top-level folders its links name (``analysis/``,
    ``dashboard/``…): the version to time beside this one."""
    folder = out / f"baseline-{rev}"
    if not (folder / "meshscope" / "dashboard" / "app.py").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        root = pathlib.Path(__file__).resolve().parents[1]
        linked = [p.name for p in (root / "meshscope").iterdir() if p.is_symlink()]
        tar = subprocess.run(["git", "-C", str(root), "archive", rev, "meshscope", *linked],
                             check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=tar, check=True)
    return folder


def browser_run(ranks: int, out: pathlib.Path, events: int, repeat: int,
                gpu_trace: pathlib.Path | None = None, profile: bool = False,
                pages: tuple[str, ...] = PAGES, baseline: str | None = None) -> list[dict]:
    """Every page of the ``ranks`` run drawn in headless Chromium, served by ``meshscope
    dashboard`` (module docstring). ``baseline``: a commit whose dashboard serves the same
    report beside this one's, each load of a page taken in turn from one and the other in the
    same browser, so that both see the same load on the machine."""
    import tempfile

    root, run_dir = _prepare(ranks, out, events, gpu_trace)
    versions = {"now": None} if baseline is None else \
        {baseline: _baseline(baseline, out), "now": None}
    servers = {}
    rows = []
    try:
        for name, source in versions.items():
            servers[name] = _serve(root, source)
        with tempfile.TemporaryDirectory() as user_dir:
            d = _driver(pathlib.Path(user_dir))
            try:
                for page in pages:
                    urls = {name: f"http://127.0.0.1:{port}/{page}?run={run_dir.name}"
                            for name, (_, port) in servers.items()}
                    cold = {name: _drawn(d, url) for name, url in urls.items()}
                    warm: dict[str, list[float]] = {name: [] for name in urls}
                    for _ in range(repeat):
                        for name, url in urls.items():
                            warm[name].append(_drawn(d, url)[0])
                    tabs = {}
                    for name, url in urls.items():      # the tabs of a drawn page, opened
                        _drawn(d, url)
                        tabs[name] = _tabs(d)
                    for name in urls:
                        rows.append({"tabs": tabs[name],"ranks": f"{ranks} GPU" if gpu_trace else ranks,
                                     "page": page, "version": name,
                                     "cold_s": cold[name][0],
                                     "warm_s": statistics.median(warm[name]),
                                     "warm_max_s": max(warm[name]),
                                     "bytes": cold[name][1], "figures": cold[name][2]})
                        print(f"# {ranks} {page} ({name}): "
                              f"{statistics.median(warm[name]):.2f} s", file=sys.stderr)
                        if profile:
                            _profile(d, urls[name], f"{ranks} {page} ({name})")
            finally:
                d.quit()
    finally:
        for server, _ in servers.values():
            server.terminate()
            server.wait(timeout=30)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/dash-bench"))
    ap.add_argument("--events-per-step", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gpu-trace", type=pathlib.Path,
                    help="with --browser: instead of synthetic CPU runs, this one GPU rank's "
                         "Kineto trace copied to each rank count (a GPU job for the GPU page)")
    ap.add_argument("--browser", action="store_true",
                    help="time each page drawn in headless Chromium instead of the server's "
                         "answer alone")
    ap.add_argument("--baseline", metavar="REV",
                    help="with --browser: also serve the report with the dashboard of commit "
                         "REV (git archive), its loads taken in turn with this checkout's, "
                         "and report both")
    ap.add_argument("--pages", nargs="+", choices=PAGES, default=list(PAGES),
                    help="with --browser: these pages only")
    ap.add_argument("--profile", action="store_true",
                    help="with --browser: after each page's loads, where one more load's time "
                         "went and each figure drawn alone (traces, points, bytes, ms), to "
                         "stderr")
    args = ap.parse_args(argv)
    rows = []
    if args.browser:
        for n in args.ranks:
            rows += browser_run(n, args.out, args.events_per_step, args.repeat,
                                args.gpu_trace, args.profile, tuple(args.pages),
                                args.baseline)
        print("| ranks | page | version | first load, drawn (s) | warm loads, median (s) | "
              "warm, slowest (s) | figures | page callback bytes | other tabs: opened → "
              "drawn (s, figures) |")
        print("|---:|---|---|---:|---:|---:|---:|---:|---|")
        for r in rows:
            tabs = "; ".join(f"{label} {t:.2f} ({n})" for label, t, n in r["tabs"]) or "—"
            print(f"| {r['ranks']} | {r['page']} | {r['version']} | {r['cold_s']:.2f} | "
                  f"{r['warm_s']:.2f} | {r['warm_max_s']:.2f} | {r['figures']} | "
                  f"{r['bytes'] / 1e3:,.0f} kB | {tabs} |")
        return
    for n in args.ranks:
        rows += run(n, args.out, args.events_per_step, args.repeat)
    print("| ranks | page | first request (s) | later requests, median (s) | bytes sent |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['ranks']} | {r['page']} | {r['cold_s']:.3f} | {r['warm_s']:.3f} | "
              f"{r['bytes'] / 1e3:,.0f} kB |")


if __name__ == "__main__":
    main()
