"""How good is the planner on this machine? Measured against real sweeps (docs/benchmarks.md).

    python bench/plan_accuracy.py [--sweep DIR] [--memory-sweep DIR] [--steps 8] [--out DIR]

1. **Ranking**: a world-4 sweep of the tiny model (``meshscope sweep --world 4``; run here
   unless ``--sweep`` names one): the planner's prediction made before the runs (the sweep's
   plan.json: assumed CPU rates) against the measured step times — Spearman's ρ and the
   error per layout.
2. **plan --from**: the planner calibrated on each run of that sweep in turn (and on
   ``--combine`` runs together), predicting all six — the error per layout, the largest error
   of the others, ρ.
3. **Memory**: a sweep of the ``wide`` model (about 14M parameters, so model states are
   hundreds of MB) over dp4, dp4 fsdp, tp4, pp4, dp2·pp2; the planner's per-rank estimate
   beside the step timers' peak of step 0 (before the profiler's heap reserve), plus the
   process's own footprint measured as the tiny dp4 run's step-0 peak less its estimate.

Prints markdown tables. Wrap it in ``flock /tmp/meshscope-cpu.lock`` on a shared machine.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

import pandas as pd

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshscope.analysis.compare import calibrated_planner, compare  # noqa: E402
from meshscope.collectors import step_timer  # noqa: E402
from meshscope.collectors.run_info import read_run_info  # noqa: E402
from meshscope.parallel.plan import CPU_ASSUMED_FLOPS, Rates, memory  # noqa: E402


def sweep(out: pathlib.Path, *args) -> pathlib.Path:
    """Run (or resume: completed runs are skipped) ``meshscope sweep ARGS --out OUT``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "meshscope", "sweep", *map(str, args), "--out",
                    str(out)], cwd=ROOT, env=env, check=False)
    return out


def pct(pred, meas) -> str:
    return f"{(pred / meas - 1) * 100:+.0f}%"


def ranking(sweep_dir: pathlib.Path) -> None:
    c = compare(sweep_dir)
    print("### Predicted (plan.json, before the runs) against measured\n")
    print("| layout | measured ms | predicted ms | error |")
    print("|---|---|---|---|")
    for r in c.rows:
        p = r.predicted.step_time_us
        print(f"| {r.label} | {r.step_time_us / 1e3:.1f} | {p / 1e3:.1f} | "
              f"{pct(p, r.step_time_us)} |")
    print(f"\nSpearman ρ (predicted vs measured step time) = {c.rank_correlation:.2f}\n")


def calibrated(sweep_dir: pathlib.Path, combine: list[str]) -> None:
    base = compare(sweep_dir)
    names = [r.name for r in base.rows]
    labels = {r.name: r.label for r in base.rows}
    print("### plan --from RUN: each run calibrates, all six predicted\n")
    print("| calibrated on | " + " | ".join(labels[n] for n in names)
          + " | max error of the others | ρ |")
    print("|---|" + "---|" * (len(names) + 2))
    rates = Rates(flops_per_s=CPU_ASSUMED_FLOPS, devices=os.cpu_count())
    for cal in [[n] for n in names] + ([combine] if combine else []):
        planner, _ = calibrated_planner([sweep_dir / n for n in cal], rates)
        c = compare(sweep_dir, planner=planner)
        rows = {r.name: r for r in c.rows}
        errs = {n: rows[n].predicted.step_time_us / rows[n].step_time_us - 1 for n in names}
        worst = max(abs(e) for n, e in errs.items() if n not in cal)
        print(f"| {' + '.join(labels[n] for n in cal)} | "
              + " | ".join(f"{errs[n] * 100:+.0f}%" for n in names)
              + f" | {worst * 100:.0f}% | {c.rank_correlation:.2f} |")
    print(f"\n(columns in measured order, fastest first: "
          f"{', '.join(f'{labels[n]} {base.rows[i].step_time_us / 1e3:.0f} ms' for i, n in enumerate(names))})\n")


def _step0_peak(run: pathlib.Path) -> dict[int, int]:
    steps, _ = step_timer.read_all(run)
    s0 = steps[steps["step"] == steps["step"].min()]
    return dict(zip(s0["rank"].astype(int), s0["peak_memory_bytes"].astype(int)))


def _estimates(run: pathlib.Path):
    from meshscope.analysis.compare import candidate_of, spec_of
    info = read_run_info(run)
    cand, spec = candidate_of(info), spec_of(info)
    return info, cand, memory(spec, cand)


def memory_table(mem_sweep: pathlib.Path, tiny_dp4: pathlib.Path) -> None:
    info, cand, (est,) = _estimates(tiny_dp4)
    base = max(_step0_peak(tiny_dp4).values()) - est.total_bytes
    print("### Memory per rank: planner against the step timers' peak (step 0)\n")
    print(f"Process footprint (torch, gloo, Python; the tiny dp4 run's step-0 peak less its "
          f"{est.total_bytes / 1e6:.1f} MB estimate): {base / 1e6:.0f} MB.\n")
    print("| layout | pp rank | params | grads | optimizer | buffers | activations | "
          "planned + footprint | measured peak | error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    c = compare(mem_sweep)
    for row in c.rows:
        run = mem_sweep / row.name
        info, cand, ests = _estimates(run)
        peaks = _step0_peak(run)
        for e in ests:
            ranks = [r for r in range(info.world_size)
                     if cand.layout.coordinates(r)["pp"] == e.pp_rank]
            meas = max(peaks[r] for r in ranks if r in peaks)
            plan = e.total_bytes + base
            print(f"| {row.label} | {e.pp_rank} | {e.params_bytes / 1e6:.0f} | "
                  f"{e.grads_bytes / 1e6:.0f} | {e.optimizer_bytes / 1e6:.0f} | "
                  f"{e.buffers_bytes / 1e6:.0f} | {e.activations_bytes / 1e6:.0f} | "
                  f"{plan / 1e6:.0f} | {meas / 1e6:.0f} | {pct(plan, meas)} |")
    print("\n(MB = 1e6 bytes; measured = the largest step-0 `peak_memory_bytes` of the ranks "
          "of that pipeline coordinate: CPU resident set)\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", type=pathlib.Path, default=None)
    ap.add_argument("--memory-sweep", type=pathlib.Path, default=None)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--combine", default="dp2-pp2-1f1b-mb4,dp2-tp2-mb4",
                    help="runs calibrated on together (the last row of the plan --from table)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="where to run the sweeps (default: a temporary folder)")
    args = ap.parse_args()
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="plan-accuracy-"))
    sw = args.sweep or sweep(out / "world4", "--world", 4, "--steps", args.steps)
    mem = args.memory_sweep or sweep(out / "wide", "--world", 4, "--model", "wide",
                                     "--layouts", "dp=4;tp=4;pp=4;dp=2,pp=2",
                                     "--dp-modes", "ddp,fsdp", "--steps", 3,
                                     "--profile-steps", "2-2")
    pd.set_option("display.width", 200)
    ranking(sw)
    calibrated(sw, [n for n in args.combine.split(",") if n])
    memory_table(mem, sw / "dp4-mb4")


if __name__ == "__main__":
    main()
