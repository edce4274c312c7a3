"""What recording the allocator's [memory] events costs: trace size, profiled step time and the
analysis' time, with ``profile_memory`` on against off, side by side.

Runs the same 2-rank CPU job (pp=2, 1F1B, tiny model, 8 steps, steps 2-7 profiled) alternately
with ``--profile-memory`` and ``--no-profile-memory``; for each run: the traces' bytes, the
median over the profiled steps of the slowest rank's step time (step timers), and the wall time
of ``meshscope analyze --no-cache``. Reported: the medians of the runs, and the ratios on / off.

    .venv/bin/python bench/memory_overhead.py [--runs 3] [--steps 8]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from meshscope.collectors import step_timer

ROOT = pathlib.Path(__file__).resolve().parents[1]


def one_run(out: pathlib.Path, steps: int, on: bool) -> tuple[int, float, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "meshscope", "run", "--layout", "pp=2",
                    "--steps", str(steps), "--profile-steps", f"2-{steps - 1}",
                    "--profile-memory" if on else "--no-profile-memory", "--out", str(out)],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    size = sum(f.stat().st_size for f in (out / "traces").glob("*.json.gz"))
    steps_df, _ = step_timer.read_all(out)
    step = float(steps_df.groupby("step")["wall_time_us"].max().loc[2:].median())
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "meshscope", "analyze", "--no-cache", str(out)],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    return size, step, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    got = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            for on in (True, False):
                r = one_run(pathlib.Path(tmp) / f"{'on' if on else 'off'}-{i}", a.steps, on)
                got[on].append(r)
                print(f"run {i} profile_memory {'on ' if on else 'off'}: traces {r[0]:,} B, "
                      f"profiled step {r[1] / 1000:.2f} ms, analyze {r[2]:.2f} s", flush=True)
    med = {on: [statistics.median(x[k] for x in got[on]) for k in range(3)] for on in got}
    print("| profile_memory | traces (bytes) | profiled step (ms) | analyze --no-cache (s) |")
    print("|---|---|---|---|")
    for on in (True, False):
        b, s, t = med[on]
        print(f"| {'on' if on else 'off'} | {b:,.0f} | {s / 1000:.2f} | {t:.2f} |")
    print(f"| on / off | {med[True][0] / med[False][0]:.2f} | "
          f"{med[True][1] / med[False][1]:.2f} | {med[True][2] / med[False][2]:.2f} |")


if __name__ == "__main__":
    main()
