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

4. **Published figures** (``--published``: no runs, a second): the GPU job model against the
   figures tests/test_plan_published.py checks — Megatron-LM's README throughput table (each
   row's TFLOP/s a GPU and % of peak), Megatron's theoretical_memory_usage for a 70B
   configuration, Korthikanti et al.'s Table 2 at their Table 3 configurations, DeepSpeed's
   documented estimator outputs, the ZeRO paper's Fig. 1 and the Playbook's figures.
   ``--fit`` refits the A100 GEMM curve on the two rows ``FIT_ROWS`` and prints its constants
   (what ``meshscope/layouts/plan/job_step.py``'s ``A100_CURVE`` holds).

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

from meshscope.layouts.ranked import calibrated_planner, compare  # noqa: E402
from meshscope.collectors import step_timer  # noqa: E402
from meshscope.collectors.run_info import read_run_info  # noqa: E402
from meshscope.layouts.plan import CPU_ASSUMED_FLOPS, Rates, memory  # noqa: E402


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
    from meshscope.layouts.ranked import candidate_of, spec_of
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


# -- published figures -------------------------------------------------------------------------

# Megatron-LM README / Narayanan et al. 2021 Table 1 (A100 80GB on Selene, seq 2048, vocab
# 51200): (billions, heads, hidden, layers, tp, pp, GPUs, batch, achieved TFLOP/s a GPU)
MEGATRON_TABLE = [(1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
                  (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
                  (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
                  (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
                  (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
                  (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
                  (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
                  (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
                  (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)]
FIT_ROWS = (39.1, 1008.0)
A100_PEAK_TFLOPS = 312


def _megatron_setup():
    from meshscope.layouts.plan.job_step import JobOptions
    from meshscope.layouts.plan.topology import Topology
    from meshscope.layouts.plan.training import Training
    # fp16 mixed precision with activation recomputation (the paper's §5.1); assumed: micro-
    # batch 1, v = 2 (3 for odd layers a stage), no SP or reduce overlap (2021), 8 GPUs a node
    t = Training(framework="megatron", precision="mixed", recompute="full", block="gpt",
                 flash_attention=False, fp32_grads=False)
    return t, Topology.for_device("A100", 8), JobOptions(dp_overlap=False)


def megatron_row(row):
    from meshscope.parallel.layout import parse_layout
    from meshscope.layouts.plan import Candidate, ModelSpec
    billions, a, h, layers, tp, pp, n, batch, _ = row
    spec = ModelSpec(dim=h, n_layers=layers, n_heads=a, ffn_hidden=4 * h, vocab_size=51200,
                     seq_len=2048, name=f"gpt-{billions}b")
    dp = n // (tp * pp)
    per_rank = layers // pp
    v = 2 if pp > 1 and per_rank % 2 == 0 else (3 if pp > 1 and per_rank % 3 == 0 else 1)
    cand = Candidate(parse_layout(f"dp={dp},tp={tp},pp={pp}"),
                     schedule="interleaved-1f1b" if v > 1 else "1f1b",
                     microbatches=batch // dp, dp_mode="ddp", sp=False, global_batch=batch,
                     virtual=v if pp > 1 else None)
    return spec, cand


def fit_a100():
    from meshscope.layouts.plan.job_step import (Device, GemmCurve, fit_curve,
                                                 required_efficiency)
    t, topo, opts = _megatron_setup()
    probe = Device("A100", A100_PEAK_TFLOPS * 1e12, 2.0e12, GemmCurve(1.0, 0.0, "probe"))
    points = []
    for row in MEGATRON_TABLE:
        if row[0] in FIT_ROWS:
            spec, cand = megatron_row(row)
            points.append((spec.dim / cand.layout.size("tp"),
                           required_efficiency(spec, cand, t, probe, topo, opts, row[8])))
    curve = fit_curve(points, f"rows {FIT_ROWS}")
    print(f"A100 GEMM curve fitted on rows {FIT_ROWS}: eta_max={curve.eta_max:.4f}, "
          f"half_width={curve.half_width:.2f} (points {points})")
    return curve


def published():
    from meshscope.parallel.layout import parse_layout
    from meshscope.layouts.plan import Candidate, ModelSpec, memory
    from meshscope.layouts.plan.activations import layer_activation_bytes
    from meshscope.layouts.plan.job_step import Device, predict_job
    from meshscope.layouts.plan.states import gather_buffer_bytes, model_states_by_term
    from meshscope.layouts.plan.training import Training
    t, topo, opts = _megatron_setup()
    print("### Step time: Megatron-LM's README throughput table (A100, Selene)\n")
    print(f"GEMM curve fitted on rows {', '.join(f'{b}B' for b in FIT_ROWS)}; the others are "
          f"the check.\n")
    print("| model | tp·pp·dp | batch | published TFLOP/s (% peak) | predicted TFLOP/s "
          "(% peak) | error | MFU (no recompute) | step s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in MEGATRON_TABLE:
        spec, cand = megatron_row(row)
        e = predict_job(spec, cand, t, Device.named("A100"), topo, opts)
        fit = " (fit)" if row[0] in FIT_ROWS else ""
        print(f"| {row[0]}B{fit} | {row[4]}·{row[5]}·{cand.layout.size('dp')} | {row[7]} | "
              f"{row[8]} ({row[8] / A100_PEAK_TFLOPS * 100:.0f}%) | "
              f"{e.hw_tflops_per_gpu:.0f} ({e.hw_tflops_per_gpu / A100_PEAK_TFLOPS * 100:.0f}%)"
              f" | {pct(e.hw_tflops_per_gpu, row[8])} | {e.mfu_pct:.1f}% | "
              f"{e.step_time_us / 1e6:.2f} |")
    # GPT-3 175B on 64 A100 (tp8·pp8, v = 3, batch 64, microbatch 1) with sequence parallelism
    # and selective recomputation: 13.75 s a step and 51.4% MFU, as issue 25 quotes them
    # (Korthikanti et al. 2022's end-to-end figure; not re-read from the paper here)
    import dataclasses
    spec = ModelSpec(dim=12288, n_layers=96, n_heads=96, ffn_hidden=4 * 12288, vocab_size=51200,
                     seq_len=2048, name="gpt-3-175b")
    cand = Candidate(parse_layout("tp=8,pp=8"), schedule="interleaved-1f1b", microbatches=64,
                     global_batch=64, sp=True, virtual=3)
    e = predict_job(spec, cand, dataclasses.replace(t, recompute="selective"),
                    Device.named("A100"), topo, opts)
    print(f"\nGPT-3 175B, 64 A100, tp8·pp8·v3, batch 64, SP + selective recomputation: "
          f"{e.step_time_us / 1e6:.2f} s a step, MFU {e.mfu_pct:.1f}% (quoted in issue 25: "
          f"13.75 s, 51.4%: {pct(e.step_time_us / 1e6, 13.75)} on the step).")
    print("\n### Memory against published figures\n")
    print("| source | configuration | published | meshscope | error |")
    print("|---|---|---|---|---|")
    gib, mib = 2 ** 30, 2 ** 20

    def line(src, conf, pub, ours, unit):
        print(f"| {src} | {conf} | {pub:,.2f} {unit} | {ours:,.2f} {unit} | {pct(ours, pub)} |")

    torch_mixed = Training(framework="torch", precision="mixed")
    for stage, pub in ((0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)):
        line("ZeRO Fig. 1", f"7.5B, N_d=64, stage {stage}", pub,
             model_states_by_term(7.5e9, stage, 64, torch_mixed).total_gpu_bytes / 1e9, "GB")
    for off, pub in (("none", 15.93), ("optimizer", 5.31)):
        line("DeepSpeed memory.rst", f"ZeRO-2 2851M, 8 GPUs, offload {off}", pub,
             model_states_by_term(2851e6, 2, 8, Training(framework="deepspeed",
                                                         precision="mixed", offload=off)
                                  ).total_gpu_bytes / gib, "GiB")
    for off, pub in (("none", 6.09), ("optimizer", 0.78), ("all", 0.12)):
        tt = Training(framework="deepspeed", precision="mixed", offload=off)
        line("DeepSpeed memory.rst", f"ZeRO-3 2851M (32M largest), 8 GPUs, offload {off}",
             pub, (model_states_by_term(2851e6, 3, 8, tt).total_gpu_bytes
                   + gather_buffer_bytes(32e6, 3, tt)) / gib, "GiB")
    for b, p16, p20 in ((1, 16, 20), (7, 112, 140), (70, 1120, 1400), (405, 6480, 8100)):
        line("Playbook", f"{b}B, bf16 mixed", p16,
             model_states_by_term(b * 1e9, 0, 1, torch_mixed).total_gpu_bytes / 1e9, "GB")
        line("Playbook", f"{b}B, bf16 mixed + fp32 grad acc", p20, model_states_by_term(
            b * 1e9, 0, 1, Training(framework="torch", precision="mixed", fp32_grads=True)
        ).total_gpu_bytes / 1e9, "GB")
    l8 = ModelSpec(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
                   vocab_size=128256, seq_len=1024)
    gpt_sel = Training(framework="torch", precision="bf16", block="gpt", recompute="selective")
    for seq, pub in ((1024, 4.25), (4096, 17.0), (16384, 68.0)):
        spec = ModelSpec(dim=4096, n_layers=32, n_heads=32, ffn_hidden=4 * 4096,
                         vocab_size=128256, seq_len=seq)
        line("Playbook Llama 3.1 8B figure", f"activations, seq {seq}", pub,
             32 * layer_activation_bytes(spec, 0, tokens=seq, tp=1, sp=False, t=gpt_sel,
                                         s_local=seq) / gib, "GiB")
    line("Playbook Llama 3.1 8B figure", "optimizer states (bf16)", 59.828,
         model_states_by_term(l8.n_params(), 0, 1, gpt_sel).kind_bytes("optimizer") / gib,
         "GiB")
    l70 = ModelSpec(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672,
                    vocab_size=128256, seq_len=8192)
    cand = Candidate(parse_layout("dp=8,tp=8,pp=4"), microbatches=32, dp_mode="zero1",
                     global_batch=256)
    first = memory(l70, cand, training=Training(framework="megatron", precision="mixed",
                                                recompute="selective"))[0]
    line("Megatron theoretical_memory_usage", "70B tp8 pp4 dp8, dist-opt: weight+optimizer",
         16239.67, first.model_states_bytes / mib, "MB")
    line("Megatron theoretical_memory_usage", "70B, SP + selective: activations", 20512.03,
         first.activations_bytes / mib, "MB")
    print("\n### Activations per layer: Korthikanti et al. Table 2 at Table 3's models "
          "(s = 2048, b = 1, t = 8)\n")
    print("| model | setting | Table 2 MB | meshscope MB | error |")
    print("|---|---|---|---|---|")
    for name, a, h in (("22B", 64, 6144), ("175B", 96, 12288), ("530B", 128, 20480),
                       ("1T", 160, 25600)):
        spec = ModelSpec(dim=h, n_layers=1, n_heads=a, ffn_hidden=4 * h, vocab_size=51200,
                         seq_len=2048)
        sbh, s = 2048 * h, 2048
        for setting, tp, sp, rc, paper in (
                ("no parallelism", 1, False, "none", sbh * (34 + 5 * a * s / h)),
                ("TP", 8, False, "none", sbh * (10 + 24 / 8 + 5 * a * s / (h * 8))),
                ("TP+SP", 8, True, "none", sbh / 8 * (34 + 5 * a * s / h)),
                ("TP+selective", 8, False, "selective", sbh * (10 + 24 / 8)),
                ("TP+SP+selective", 8, True, "selective", sbh * 34 / 8),
                ("full", 8, False, "full", 2 * sbh)):
            tt = Training(framework="megatron", precision="mixed", block="gpt",
                          flash_attention=False, recompute=rc)
            ours = layer_activation_bytes(spec, 0, tokens=s, tp=tp, sp=sp, t=tt, s_local=s)
            print(f"| {name} | {setting} | {paper / 1e6:.1f} | {ours / 1e6:.1f} | "
                  f"{pct(ours, paper)} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--published", action="store_true",
                    help="only the published-figure tables (no runs)")
    ap.add_argument("--fit", action="store_true",
                    help="refit the A100 GEMM curve on FIT_ROWS and print its constants")
    ap.add_argument("--sweep", type=pathlib.Path, default=None)
    ap.add_argument("--memory-sweep", type=pathlib.Path, default=None)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--combine", default="dp2-pp2-1f1b-mb4,dp2-tp2-mb4",
                    help="runs calibrated on together (the last row of the plan --from table)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="where to run the sweeps (default: a temporary folder)")
    args = ap.parse_args()
    if args.fit:
        fit_a100()
        return
    if args.published:
        published()
        return
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
