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
   ``--fit`` refits the constants on the rows ``jobs.csv`` marks ``fit`` and prints them:
   ``job_compute.TRAINING_DERATE`` (the ten rows of Megatron-LM's Table 1) and each custom
   device's ``clock_fraction``.

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
from meshscope.collectors.run_json import read_run_info  # noqa: E402
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

def published():
    from meshscope.parallel.layout import parse_layout
    from meshscope.layouts.plan import Candidate, ModelSpec, memory
    from meshscope.layouts.plan.activations import layer_activation_bytes
    from meshscope.layouts.plan.states import gather_buffer_bytes, model_states_by_term
    from meshscope.layouts.plan.training import Training
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



# -- the published reference jobs ---------------------------------------------------------------

FAMILIES = (("dense_bf16", "BF16 dense"), ("fp8", "FP8"), ("moe", "MoE"), ("fsdp", "FSDP"),
            ("small_model_dp", "small-model DP"), ("scaling", "scaling (same job, more GPUs)"))


def evaluate(rows=None):
    """Every reference row: (row, predicted tokens/s/GPU, published, error, predicted
    memory GiB or None, the estimate)."""
    from bench.plan_references import jobs as J
    from meshscope.layouts.plan import memory
    from meshscope.layouts.plan.job_step import predict_job
    out = []
    for r in rows or J.load():
        spec, cand, t, dev, topo, opts = J.job(r)
        est = predict_job(spec, cand, t, dev, topo, opts)
        pred = est.tokens_per_s / cand.layout.world_size
        pub = J.published_tokens_per_s(r, spec, dev)
        mem = max(m.total_bytes for m in memory(spec, cand, training=t)) / 2 ** 30 \
            if r.memory_gib else None
        out.append((r, pred, pub, pred / pub - 1, mem, est))
    return out


def _stats(errors):
    import statistics
    a = sorted(abs(e) for e in errors)
    if not a:
        return "-", "-", "-"
    return (f"{statistics.median(a) * 100:.0f}%", f"{a[-1] * 100:.0f}%",
            f"{sum(1 for e in a if e <= 0.25)}/{len(a)}")


def moe_error_percentiles(held) -> tuple[float, float]:
    """The 10th and 90th percentile of predicted / published − 1 over the MoE rows of
    ``held`` ((row, error) pairs, fitted rows apart)."""
    import statistics
    deciles = statistics.quantiles(sorted(e for r, e in held if "moe" in r.families), n=10)
    return deciles[0], deciles[-1]


def references(with_ranking: bool = False) -> dict:
    """Print predicted against published for every reference row, the error per family, and
    memory; with ``with_ranking`` the ranking check of the rows that publish their choice.
    Returns the summary (what the tests and docs read)."""
    from bench.plan_references import jobs as J
    rows = evaluate()
    n_sources = len({r.source for r, *_ in rows})
    print(f"### Throughput: {len(rows)} published jobs from {n_sources} sources "
          f"(bench/plan_references/jobs.csv)\n")
    print("| job | source | device | GPUs | layout | published tok/s/GPU | predicted | error "
          "| MFU (bf16 peak) | fp8 TF/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r, pred, pub, err, mem, est in rows:
        spec, cand, *_ = J.job(r)
        fit = " (fit)" if r.fit else ""
        print(f"| {r.id}{fit} | {r.source} | {r.device} | {r.gpus} | {cand.name} | {pub:,.0f} "
              f"| {pred:,.0f} | {err * 100:+.0f}% | {est.mfu_pct:.1f}% | "
              f"{est.fp8_tflops_per_gpu or 0:.0f} |")
    held = [(r, e) for r, _, _, e, _, _ in rows if not r.fit]
    summary = {"rows": len(rows), "sources": n_sources,
               "fit_rows": [r.id for r, *_ in rows if r.fit]}
    print(f"\nFitted on: {', '.join(summary['fit_rows'])}; every other row is a check.\n")
    print("| family | jobs | median |error| | max |error| | within 25% |")
    print("|---|---|---|---|---|")
    fam = {}
    for key, label in FAMILIES + (("all", "all throughput rows"),):
        errs = [e for r, e in held if key == "all" or key in r.families]
        med, mx, within = _stats(errs)
        fam[key] = {"jobs": len(errs), "median": med, "max": mx, "within_25": within}
        print(f"| {label} | {len(errs)} | {med} | {mx} | {within} |")
    lo, hi = moe_error_percentiles(held)
    print(f"\nMoE jobs' error, 10th and 90th percentile: {lo * 100:+.1f}%, {hi * 100:+.1f}% "
          f"(job_step.MOE_ERROR_PERCENTILES: the range a MoE plan prints)")
    summary["moe_error_percentiles"] = [lo, hi]
    mems = [(r, mem, r.memory_gib) for r, _, _, _, mem, _ in rows if r.memory_gib]
    print("\n### Memory per GPU where published\n")
    print("| job | published GiB | predicted GiB | error |")
    print("|---|---|---|---|")
    for r, mem, pub in mems:
        print(f"| {r.id} | {pub:.1f} | {mem:.1f} | {(mem / pub - 1) * 100:+.0f}% |")
    med, mx, _ = _stats([mem / pub - 1 for r, mem, pub in mems if not r.fit])
    within15 = sum(1 for r, mem, pub in mems if abs(mem / pub - 1) <= 0.15)
    print(f"\nmemory: median |error| {med}, max {mx}, {within15}/{len(mems)} within 15%")
    fam["memory"] = {"jobs": len(mems), "median": med, "max": mx,
                     "within_15": f"{within15}/{len(mems)}"}
    summary["families"] = fam
    if with_ranking:
        summary["ranking"] = ranking_checks([r for r, *_ in rows if r.choice])
    return summary


def _published_candidates(row):
    """Every layout of the row's job (its world, global and micro batch, schedule, dp mode),
    and the published one."""
    import dataclasses as dc

    from bench.plan_references import jobs as J
    from meshscope.layouts.plan.job_candidates import job_candidates
    spec, cand, t, dev, topo, opts = J.job(row)
    dims = ["dp", "tp", "pp"] + (["cp"] if row.cp > 1 else []) + (["ep"] if row.ep > 1 else [])
    per = row.gbs // row.mbs
    mbs_choices = tuple(per // d for d in range(1, per + 1) if per % d == 0)

    def check(c):
        if spec.kv_heads % c.layout.size("tp"):
            return "kv heads"
        if c.microbatches * row.mbs * c.layout.size("dp") != row.gbs:
            return "microbatch size"
        return None

    cands = job_candidates(row.gpus, spec, dims=dims, schedules=(cand.schedule,),
                           microbatches=mbs_choices, dp_modes=(row.dp_mode,),
                           global_batch=row.gbs, sp=cand.sp or cand.layout.size("tp") == 1,
                           extra_check=check)
    out = []
    for c in cands:
        if c.pp > 1 and cand.virtual:
            c = dc.replace(c, virtual=cand.virtual)
            if c.n_stages > spec.n_layers:
                continue
        out.append(c)
    if cand.name not in {c.name for c in out}:
        out.append(cand)
    return spec, cand, t, dev, topo, opts, out


def ranking_checks(rows) -> dict:
    """For each row that publishes its chosen layout: every layout of that job planned and
    ranked; is the published one within the tie band of the fastest that fits?"""
    from meshscope.layouts.plan import plan
    from meshscope.layouts.plan.job_step import uncertainty_of
    print("\n### Ranking: is the published layout within the tie band of the top?\n")
    print("| job | layouts | published layout | its rank | slower than the top by | band "
          "| within |")
    print("|---|---|---|---|---|---|---|")
    hits = 0
    for row in rows:
        spec, cand, t, dev, topo, opts, cands = _published_candidates(row)
        band, _ = uncertainty_of(spec, t)
        p = plan(spec, cands, training=t, device=dev, topology=topo, job_options=opts,
                 device_memory_bytes=dev.memory_bytes, uncertainty=band)
        ranked = [r for r in p.rows]
        idx = next(i for i, r in enumerate(ranked) if r.name == cand.name)
        mine = ranked[idx]
        top = next((r for r in ranked if r.fits is not False), ranked[0])
        gap = mine.estimate.step_time_us / top.estimate.step_time_us - 1
        # where no layout fits the planner's memory (the plan then marks no ties), within
        # the band of the fastest of them all
        within = mine.tie if any(r.fits is not False for r in ranked) else gap <= band
        hits += within
        print(f"| {row.id} | {len(ranked)} | {cand.name} | {idx + 1} | {gap * 100:+.0f}% | "
              f"±{band * 100:.0f}% | {'yes' if within else 'no'} |")
    print(f"\n{hits}/{len(rows)} published layouts within the tie band of the top")
    return {"within": hits, "rows": len(rows)}


def fit():
    """The constants fitted on the rows ``jobs.csv`` marks ``fit``: the training derate
    (``job_compute.TRAINING_DERATE``) on the catalogue-device rows, and each custom device's
    sustained clock (its TOML's ``clock_fraction``: every tensor-core rate, GEMMs and flash
    attention) on its own fit row."""
    import math

    from bench.plan_references import jobs as J
    from meshscope.layouts.plan.job_compute import TRAINING_DERATE
    from meshscope.layouts.plan.job_step import required_derate
    rows = [r for r in J.load() if r.fit]
    catalogue, custom = [], {}
    for r in rows:
        spec, cand, t, dev, topo, opts = J.job(r)
        pub = J.published_tokens_per_s(r, spec, dev) * cand.layout.world_size
        d = required_derate(spec, cand, t, dev, topo, opts, pub)
        print(f"{r.id}: the derate that reproduces it is {d:.4f}")
        (custom.setdefault(r.device, []) if r.device.startswith("file:")
         else catalogue).append(d)
    derate = math.exp(sum(math.log(d) for d in catalogue) / len(catalogue))
    print(f"TRAINING_DERATE = {derate:.3f}  (geometric mean over {len(catalogue)} rows)")
    for device, ds in custom.items():
        import tomllib
        d = math.exp(sum(math.log(x) for x in ds) / len(ds))
        path = J.HERE / "devices" / f"{device[5:]}.toml"
        now = tomllib.loads(path.read_text()).get("clock_fraction", 1.0)
        # the derate search scales GEMMs and attention alike, as the clock does; the
        # training derate (refitted above) applies on top of the device's clock
        print(f"{device}: clock_fraction = {now * d / derate:.3f} (now {now:g}; its rows "
              f"need × {d / TRAINING_DERATE:.3f} at the current derate)")
    return derate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--published", action="store_true",
                    help="only the published-figure tables (no runs)")
    ap.add_argument("--references", action="store_true",
                    help="the published reference jobs: predicted against published per row, "
                         "the error per family and memory (no runs, seconds)")
    ap.add_argument("--ranking", action="store_true",
                    help="with --references: rank every layout of each job that publishes "
                         "its choice (a minute)")
    ap.add_argument("--fit", action="store_true",
                    help="refit the constants on the rows jobs.csv marks fit and print them")
    ap.add_argument("--sweep", type=pathlib.Path, default=None)
    ap.add_argument("--memory-sweep", type=pathlib.Path, default=None)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--combine", default="dp2-pp2-1f1b-mb4,dp2-tp2-mb4",
                    help="runs calibrated on together (the last row of the plan --from table)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="where to run the sweeps (default: a temporary folder)")
    args = ap.parse_args()
    if args.fit:
        fit()
        return
    if args.references:
        references(args.ranking)
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
