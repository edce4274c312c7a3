"""How long the dashboard takes to serve each page's data, and how many bytes it sends, for
synthetic runs of 64 and 512 ranks (``bench.synth.make_run``: traces, step timers, Flight
Recorder dumps and run.json shaped like the runner's).

For each rank count: generate the run, analyse it (``meshscope analyze``, not timed here), then
ask the dashboard for every page the way the browser does — one POST of Dash's page callback to
the Flask app, in process — ``--repeat`` times, and report the median wall time of that request
and the size of its response (the JSON the browser receives: components and figures). The
first request of a page (cold: report tables read from disk, the timeline built) is reported
apart from the median of the later ones (warm: the report cached in the server). Targets
(DESIGN.md): under 1 s per page at 64 ranks, under 3 s at 512; under 2 MB sent for a 64-rank
page.

    flock /tmp/meshscope-cpu.lock .venv/bin/python -m bench.dashboard_latency \\
        --ranks 64 512 --out /tmp/dash-bench

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

PAGES = ("overview", "pipeline", "communication", "stragglers", "timeline", "health")


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


def run(ranks: int, out: pathlib.Path, events: int, repeat: int) -> list[dict]:
    from bench.synth import make_run

    from meshscope.dashboard.app import create_app

    root = out / f"r{ranks}"
    run_dir = root / f"synth-{ranks}"
    if not (run_dir / "run.json").is_file():
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
    app = create_app(root)
    rows = []
    for page in PAGES:
        cold, size = _request(app, f"/{page}", f"?run={run_dir.name}")
        warm = [_request(app, f"/{page}", f"?run={run_dir.name}")[0] for _ in range(repeat)]
        rows.append({"ranks": ranks, "page": page, "cold_s": cold,
                     "warm_s": statistics.median(warm), "bytes": size})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/dash-bench"))
    ap.add_argument("--events-per-step", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    rows = []
    for n in args.ranks:
        rows += run(n, args.out, args.events_per_step, args.repeat)
    print("| ranks | page | first request (s) | later requests, median (s) | bytes sent |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['ranks']} | {r['page']} | {r['cold_s']:.3f} | {r['warm_s']:.3f} | "
              f"{r['bytes'] / 1e3:,.0f} kB |")


if __name__ == "__main__":
    main()
