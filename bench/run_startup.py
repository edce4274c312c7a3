"""Benchmark: a small ``meshscope run`` from the command to its exit, with its ranks started
each way (``parallel/rank_start.py``).

    .venv/bin/python bench/run_startup.py [-n 3] [--write]

For each layout below, the same 5-step run of a tiny model (one step profiled) with
``MESHSCOPE_RANK_START=exec`` (a fresh interpreter per rank, torchrun's own way) and with
``forkserver`` (the default: ranks forked from a server that imported torch once), ``-n``
rounds, the two ways interleaved so that a busy machine slows both alike: the wall time of
the whole command, median and fastest. ``--write`` puts the table into docs/benchmarks.md under its heading.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):   # run as a script: bench/ is not a package then
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.measure import MESHSCOPE, ROOT, load_note, provenance, publish  # noqa: E402

HEADING = "## Run start-up: how the ranks start"
METHODS = ("exec", "forkserver")
COMMON = ["--steps", "5", "--global-batch", "16", "--profile-steps", "4-4"]
LAYOUTS = [
    ("dp=2 (DDP)", ["--layout", "dp=2", "--model", "tiny"]),
    ("pp=2 (1F1B, 8 microbatches)", ["--layout", "pp=2", "--schedule", "1f1b",
                                     "--microbatches", "8", "--model", "tiny8"]),
    ("pp=4 (1F1B, 8 microbatches)", ["--layout", "pp=4", "--schedule", "1f1b",
                                     "--microbatches", "8", "--model", "tiny8"]),
    ("dp=2,pp=2 (1F1B, 4 microbatches)", ["--layout", "dp=2,pp=2", "--schedule", "1f1b",
                                          "--microbatches", "4", "--model", "tiny"]),
]


def one_run(args: list[str], method: str) -> float:
    """Wall time of one run, s."""
    out = pathlib.Path(tempfile.mkdtemp(prefix="run-startup-")) / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MESHSCOPE_RANK_START": method}
    start = time.perf_counter()
    subprocess.run([*MESHSCOPE, "run", *args, *COMMON, "--out", str(out)], cwd=ROOT, env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    shutil.rmtree(out.parent, ignore_errors=True)
    return wall


def run(n: int) -> list[dict]:
    times = {(label, m): [] for label, _ in LAYOUTS for m in METHODS}
    for i in range(n):
        for label, args in LAYOUTS:
            for m in METHODS:
                times[label, m].append(one_run(args, m))
        print(f"  round {i + 1}/{n}", file=sys.stderr)
    rows = []
    for label, _ in LAYOUTS:
        med = {m: statistics.median(times[label, m]) for m in METHODS}
        rows.append({"label": label, "median": med,
                     "best": {m: min(times[label, m]) for m in METHODS}})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| layout | exec: median | fastest | forkserver: median | fastest | saved |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        med, best = r["median"], r["best"]
        lines.append(f"| {r['label']} | {med['exec']:.1f} s | {best['exec']:.1f} s | "
                     f"{med['forkserver']:.1f} s | {best['forkserver']:.1f} s | "
                     f"{med['exec'] - med['forkserver']:.1f} s "
                     f"({1 - med['forkserver'] / med['exec']:.0%}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3, help="rounds (median reported)")
    ap.add_argument("--write", action="store_true",
                    help="write the table into docs/benchmarks.md")
    a = ap.parse_args()
    note = load_note()
    rows = run(a.n)
    section = "\n".join([
        HEADING, "",
        provenance(f".venv/bin/python bench/run_startup.py -n {a.n}", note), "",
        f"`meshscope run LAYOUT {' '.join(COMMON)}` from the command to its exit, with "
        f"`MESHSCOPE_RANK_START=exec` (each rank a fresh interpreter, torchrun's own way) and "
        f"`forkserver` (the default: each rank forked from a server that imported torch and "
        f"the rank program once, beside the command's own imports; parallel/rank_start.py), "
        f"{a.n} rounds, the two interleaved.", "",
        table(rows)])
    publish(HEADING, section, a.write)


if __name__ == "__main__":
    main()
