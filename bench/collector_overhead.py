"""What the always-on collectors cost: step time with them on versus off.

Runs the same 4-rank CPU job (dp=2, pp=2, 1F1B, tiny model) alternately with the always-on
collectors on (step timers flushed every 10 steps, Flight Recorder buffer of 20,000 entries,
dumped at the end) and off (timers written once at the end, Flight Recorder size 0); the
profiler traces only the last step in both. For each run, the median over steps of the slowest
rank's step time (the first five steps and the profiled one left out); the reported figure is
the ratio of the medians of the runs, on / off — the target is ≤ 1.01.

    .venv/bin/python bench/collector_overhead.py [--runs 5] [--steps 40]
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from meshscope.collectors import step_timer

ROOT = pathlib.Path(__file__).resolve().parents[1]


def one_run(out: pathlib.Path, steps: int, on: bool) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    subprocess.run([sys.executable, "-m", "meshscope", "run", "--layout", "dp=2,pp=2",
                    "--steps", str(steps), "--profile-steps", f"{steps - 1}-{steps - 1}",
                    "--always-on" if on else "--no-always-on", "--out", str(out)],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    steps_df, problems = step_timer.read_all(out)
    if problems:
        raise SystemExit("; ".join(problems))
    per_step = steps_df.groupby("step")["wall_time_us"].max()
    return float(per_step.loc[5:steps - 2].median())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--write", action="store_true", help="append the result to "
                                                          "docs/benchmarks.md")
    a = ap.parse_args()
    medians = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            for on in (True, False):
                m = one_run(pathlib.Path(tmp) / f"{'on' if on else 'off'}-{i}", a.steps, on)
                medians[on].append(m)
                print(f"run {i} collectors {'on ' if on else 'off'}: median step "
                      f"{m / 1000:.2f} ms", flush=True)
    on, off = statistics.median(medians[True]), statistics.median(medians[False])
    table = (f"| collectors | median step time (ms) | runs |\n|---|---|---|\n"
             f"| on | {on / 1000:.2f} | {', '.join(f'{m / 1000:.2f}' for m in medians[True])} |\n"
             f"| off | {off / 1000:.2f} | "
             f"{', '.join(f'{m / 1000:.2f}' for m in medians[False])} |\n\n"
             f"Ratio on/off: **{on / off:.3f}** (target ≤ 1.01).\n")
    print(table)
    if a.write:
        doc = ROOT / "docs" / "benchmarks.md"
        text = doc.read_text() if doc.exists() else "# Benchmarks\n"
        text += (f"\n## Always-on collector overhead\n\n`.venv/bin/python "
                 f"bench/collector_overhead.py --runs {a.runs} --steps {a.steps} --write`, "
                 f"{datetime.date.today()}, 2-core CPU machine, 4 gloo ranks (dp=2, pp=2, "
                 f"1F1B, tiny model).\n\n{table}")
        doc.write_text(text)


if __name__ == "__main__":
    main()
