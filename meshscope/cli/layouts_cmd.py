"""``meshscope sweep``, ``compare`` and ``plan``: which parallel layout to pick, and why.

``sweep`` runs every valid layout of N ranks (``layouts.sweep``), ``compare`` puts runs or a
sweep side by side (``layouts.compare``), ``plan`` predicts memory, traffic and step time
before running (``layouts.plan``). None of them imports torch: ``sweep`` trains in child
processes.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import click

from meshscope.vocabulary import PARALLEL_DIMS

from meshscope.parallel.faults import FORMS as FAULT_FORMS

from .common import fail


def _csv(text: str | None, cast=str) -> tuple:
    if not text:
        return ()
    try:
        return tuple(cast(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        fail(f"{text!r}: expected a comma-separated list")


def _layouts(text: str | None) -> tuple[str, ...] | None:
    """``dp=2,pp=2;tp=4`` → ("dp=2,pp=2", "tp=4")."""
    if not text:
        return None
    return tuple(p.strip() for p in text.split(";") if p.strip()) or None


def _overrides(layers, moe_experts, moe_top_k, moe_every) -> tuple:
    o = {"n_layers": layers, "moe_experts": moe_experts, "moe_top_k": moe_top_k,
         "moe_every": moe_every}
    return tuple(sorted((k, v) for k, v in o.items() if v is not None))


def _choice_options(f):
    """The options that choose layouts, shared by ``sweep`` and ``plan``."""
    opts = [
        click.option("--dims", default="dp,tp,pp", show_default=True,
                     help="Dimensions to split the world over (any of dp, tp, pp, cp, ep)."),
        click.option("--layouts", default=None,
                     help="Exactly these layouts instead, separated by ';': "
                          "'dp=2,pp=2;tp=4'."),
        click.option("--schedules", default="1f1b", show_default=True,
                     help="Pipeline schedules to try (comma-separated) for layouts with pp>1."),
        click.option("--microbatches", default="4", show_default=True,
                     help="Microbatch counts to try (comma-separated)."),
        click.option("--global-batch", default=16, show_default=True, type=int,
                     help="Sequences per step over all data-parallel ranks."),
        click.option("--no-sp", is_flag=True, help="Tensor parallelism without sequence "
                                                   "parallelism."),
        click.option("--layers", type=int, default=None, help="Override the preset's layers."),
        click.option("--moe-experts", type=int, default=None),
        click.option("--moe-top-k", type=int, default=None),
        click.option("--moe-every", type=int, default=None),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _write_comparison(folder: pathlib.Path) -> None:
    from meshscope.layouts.compare import CompareError, compare
    from meshscope.collectors.run_dir import COMPARISON_JSON, write_json_atomic

    try:
        c = compare(folder)
    except CompareError as e:
        click.echo(f"meshscope: warning: comparison not written: {e}", err=True)
        return
    write_json_atomic(folder / COMPARISON_JSON, c.to_dict())
    (folder / "comparison.csv").write_text(c.to_csv())


def _sweep_plan(sweep, tflops: float | None, devices: int | None) -> None:
    """Write SWEEP/plan.json: the planner's view of every layout before the runs."""
    from meshscope.collectors.run_dir import write_json_atomic
    from meshscope.layouts.plan import ModelSpec, plan
    from meshscope.layouts.plan.serial import plan_to_dict
    from meshscope.collectors.run_dir import PLAN_JSON

    rates, comm, notes = _assumed_rates(tflops, None, devices, None, None, None)
    spec = ModelSpec.from_config(sweep.spec.model_config, name=sweep.spec.model)
    p = plan(spec, sweep.candidates, rates=rates, comm=comm, notes=notes)
    write_json_atomic(sweep.folder / PLAN_JSON, plan_to_dict(p))


@click.command()
@click.option("--world", type=int, default=None, help="Ranks of every layout.")
@click.option("--model", default="tiny", show_default=True, help="Model preset.")
@_choice_options
@click.option("--dp-modes", default="ddp", show_default=True,
              help="Data-parallel modes to try: ddp, zero2, fsdp (comma-separated).")
@click.option("--steps", default=4, show_default=True, type=int, help="Steps per run.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--profile-steps", default=None,
              help="Steps to trace in every run, FIRST-LAST (default: the runner's).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="The sweep folder (created; an existing sweep of the same options is "
                   "resumed).")
@click.option("--resume", "resume", type=click.Path(file_okay=False), default=None,
              help="Resume the sweep in this folder with its own options.")
@click.option("--retry-failed", is_flag=True, help="Run the failed layouts again too.")
@click.option("--list", "list_only", is_flag=True, help="Print the layouts and stop.")
@click.option("--inject", multiple=True,
              help=f"A fault in every run, as `meshscope run --inject` ({FAULT_FORMS}).")
@click.option("--tflops", type=float, default=None,
              help="Sustained TFLOP/s of one device, for plan.json's predictions.")
def sweep(world, model, dims, layouts, schedules, microbatches, global_batch, no_sp, layers,
          moe_experts, moe_top_k, moe_every, dp_modes, steps, seed, profile_steps, out, resume,
          retry_failed, list_only, inject, tflops):
    """Run every valid layout of WORLD ranks, analyse each, and compare them."""
    from meshscope.layouts.compare import compare, render
    from meshscope.collectors.run_dir import PLAN_JSON
    from meshscope.layouts.sweep import Sweep, SweepError, SweepSpec, run_sweep

    try:
        if resume:
            sw = Sweep.open(pathlib.Path(resume))
        else:
            if world is None or out is None:
                fail("sweep needs --world N and --out DIR (or --resume DIR)")
            ps = None
            if profile_steps:
                from meshscope.collectors.profile_steps import parse_step_range
                try:
                    ps = parse_step_range(profile_steps)
                except ValueError as e:
                    fail(str(e))
            spec = SweepSpec(world=world, model=model,
                             model_overrides=_overrides(layers, moe_experts, moe_top_k,
                                                        moe_every),
                             dims=_csv(dims), schedules=_csv(schedules),
                             microbatches=_csv(microbatches, int), dp_modes=_csv(dp_modes),
                             layouts=_layouts(layouts), steps=steps, global_batch=global_batch,
                             seed=seed, profile_steps=ps, sp=not no_sp,
                             faults=tuple(inject))
            if ps is not None and ps[1] >= steps:
                fail(f"--profile-steps {profile_steps} goes past the last step {steps - 1}")
            if steps < 1:
                fail("--steps must be at least 1")
            sw = Sweep.open(pathlib.Path(out), spec)
    except SweepError as e:
        fail(str(e))
    todo = sw.todo(retry_failed)
    click.echo(f"meshscope sweep: {len(sw.candidates)} layouts of {sw.spec.world} ranks, "
               f"model {sw.spec.model}, {len(todo)} to run -> {sw.folder}")
    for c in sw.candidates:
        state = sw.state[c.name].status
        click.echo(f"  {c.name:<32} {c.label:<28} {state}")
    if list_only:
        return
    sw.save()
    if not (sw.folder / PLAN_JSON).exists():
        _sweep_plan(sw, tflops, None)
    run_sweep(sw, retry_failed=retry_failed, after_run=lambda s: _write_comparison(s.folder))
    _write_comparison(sw.folder)
    c = compare(sw.folder)
    click.echo()
    click.echo(render(c))
    click.echo(f"\nsweep folder: {sw.folder} (comparison.json, comparison.csv)")
    if any(sw.state[x.name].status == "failed" for x in sw.candidates):
        sys.exit(1)


@click.command("compare")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--csv", "csv_out", default=None, type=click.Path(dir_okay=False),
              help="Write the table as CSV to this file ('-': standard output).")
@click.option("--from", "from_runs", multiple=True, type=click.Path(file_okay=False),
              help="Predict with the planner calibrated from this run (repeatable).")
@click.option("--baseline", default=None, type=click.Path(exists=True),
              help="bench-comm baseline or nccl-tests output for the planner's predictions.")
@click.option("--detail", is_flag=True,
              help="Under each run, every planned number beside the measured one.")
def compare_cmd(paths, as_json, csv_out, from_runs, baseline, detail):
    """Compare run directories (RUN_A RUN_B …) or one sweep folder, ranked by step time."""
    from meshscope.layouts.compare import CompareError, calibrated_planner, compare, render

    planner = None
    try:
        if from_runs:
            rates, _, _ = _assumed_rates(None, None, None, None, None, None)
            planner, cal = calibrated_planner([pathlib.Path(p) for p in from_runs], rates,
                                              _baseline_model(baseline))
            for n in cal.notes:
                click.echo(f"meshscope: note: {n}", err=True)
        c = compare([pathlib.Path(p) for p in paths], planner=planner)
    except CompareError as e:
        fail(str(e))
    if csv_out == "-":
        click.echo(c.to_csv(), nl=False)
    elif csv_out:
        pathlib.Path(csv_out).write_text(c.to_csv())
    if as_json:
        click.echo(json.dumps(c.to_dict(), indent=2))
    elif csv_out != "-":
        click.echo(render(c, detail))
        if detail:
            _memory_vs_plan(c)


def _memory_vs_plan(c) -> None:
    """Under ``--detail``: each run's memory, the planner's terms beside what its ranks
    measured (meshscope/layouts/memory_vs_plan.py)."""
    from meshscope.layouts.memory_vs_plan import PlanMemoryError, memory_vs_plan, render

    for row in c.rows:
        try:
            m = memory_vs_plan(pathlib.Path(row.path))
        except PlanMemoryError as e:
            click.echo(f"\n{row.name}: memory against the plan: {e}")
            continue
        click.echo(f"\n{row.name}:\n{render(m)}")


# -- plan -----------------------------------------------------------------------------------

def _baseline_model(path: str | None):
    if not path:
        return None
    from meshscope.layouts.plan import CommModel

    from .analyze_cmd import _load_baseline

    table = _load_baseline(path)
    if table is None or table.empty:
        fail(f"{path}: no baseline rows")
    missing = [c for c in ("op", "n_ranks", "size_bytes", "time_us") if c not in table]
    if missing:
        fail(f"{path}: a baseline needs the column {missing[0]}")
    return CommModel.from_rows(table.itertuples(), source=f"baseline {path}")


def _assumed_rates(tflops, peak_tflops, devices, device, bandwidth_gbps, latency_us):
    """Rates and comm model before calibration, and notes on what was assumed."""
    from meshscope.collectors.devices import lookup
    from meshscope.layouts.plan import CPU_ASSUMED_FLOPS, CommModel, Rates

    notes = []
    peak = peak_tflops * 1e12 if peak_tflops else None
    known = lookup(device) if device else None
    if device and not known:
        fail(f"--device {device!r}: not in the device table (collectors/devices.py); give "
             f"--tflops and --peak-tflops instead")
    if known and not peak:
        peak = known[0]
    gpu = bool(device or tflops or peak_tflops)
    if tflops:
        flops = tflops * 1e12
    elif peak:
        flops = 0.4 * peak
        notes.append(f"compute at 40% of the {peak / 1e12:g} TFLOP/s peak (assumed; "
                     f"--tflops sets the sustained rate)")
    else:
        flops = CPU_ASSUMED_FLOPS
        notes.append(f"CPU compute at an assumed {CPU_ASSUMED_FLOPS / 1e9:g} GFLOP/s per core, "
                     f"ranks sharing {devices or os.cpu_count()} cores (--tflops, --devices, "
                     f"or --from RUN to calibrate)")
    if not gpu and devices is None:
        devices = os.cpu_count()
    default_bw, default_lat = (100.0, 10.0) if gpu else (1.0, 50.0)
    comm = CommModel(alpha_us=latency_us if latency_us is not None else default_lat,
                     busbw_gbps=bandwidth_gbps or default_bw,
                     source="assumed" if not bandwidth_gbps else "--bandwidth-gbps")
    if not bandwidth_gbps:
        notes.append(f"communication at an assumed {comm.busbw_gbps:g} GB/s bus bandwidth and "
                     f"{comm.alpha_us:g} µs latency (--baseline or --bandwidth-gbps)")
    src = "given" if tflops else ("device peak" if peak else "assumed")
    return Rates(flops_per_s=flops, devices=devices, peak_flops=peak, source=src), comm, notes


def _spec(model, model_json, seq_len, overrides):
    import dataclasses

    from meshscope.parallel.config import PRESETS
    from meshscope.layouts.plan import ModelSpec, SpecError

    try:
        if model_json:
            spec = ModelSpec.from_json(pathlib.Path(model_json))
        else:
            if model not in PRESETS:
                fail(f"--model {model!r}: unknown preset (known: {', '.join(PRESETS)}); a "
                     f"config.json goes to --model-json")
            spec = ModelSpec.from_config(dataclasses.replace(PRESETS[model], **dict(overrides)),
                                         name=model)
        if seq_len:
            spec = dataclasses.replace(spec, seq_len=seq_len)
    except SpecError as e:
        fail(str(e))
    return spec


def _fmt_bytes(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def render_plan(p, detail: bool) -> str:
    job = p.training is not None and p.training.framework != "runner"
    what = (f"{p.training.framework}, {p.training.precision}, {p.training.optimizer}, "
            f"recompute {p.training.recompute}" if job else f"precision {p.precision.name}")
    lines = [f"model {p.model.name}: {p.model.n_params() / 1e6:,.1f} M parameters, "
             f"{p.model.flops_per_token() / 1e6:,.1f} MFLOP/token, {what}"]
    head = (f"{'#':>2} {'layout':<30} {'params':>9} {'grads':>9} {'optim':>9} {'buffers':>9} "
            f"{'activ':>9} {'peak':>9}  {'comm/step (on the wire)':<36} {'bubble':>6} "
            f"{'step ms':>9} {'tok/s':>9} {'MFU':>5}")
    lines.append(head)
    for i, r in enumerate(p.rows, 1):
        m = r.peak
        wire = r.wire_bytes or r.comm_bytes
        comm = ", ".join(f"{d}{'*' if r.link_level.get(d) == 'inter' else ''} "
                         f"{_fmt_bytes(b)}" for d, b in wire.items()) or "-"
        est = r.estimate
        fit = " (does not fit)" if r.fits is False else ""
        lines.append(
            f"{i:>2} {r.name[:30]:<30} {_fmt_bytes(m.params_bytes):>9} "
            f"{_fmt_bytes(m.grads_bytes):>9} {_fmt_bytes(m.optimizer_bytes):>9} "
            f"{_fmt_bytes(m.buffers_bytes):>9} {_fmt_bytes(m.activations_bytes):>9} "
            f"{_fmt_bytes(m.total_bytes):>9}  {comm[:36]:<36} "
            f"{r.theory_bubble_fraction * 100:5.0f}% "
            + (f"{est.step_time_us / 1e3:9.1f} {est.tokens_per_s:9.0f} "
               + (f"{est.mfu_pct:5.1f}" if est.mfu_pct is not None else "    -")
               if est else f"{'-':>9} {'-':>9} {'-':>5}") + fit)
        if detail:
            lines.append("     memory: " + ", ".join(f"{k} {_fmt_bytes(v)}"
                                                    for k, v in m.terms.items())
                         + (f"; offloaded to the host {_fmt_bytes(m.cpu_bytes)}"
                            if m.cpu_bytes else ""))
            for t in r.transfers:
                lines.append(f"     pp rank {t.pp_rank} {t.dim:<10} {t.op:<15} {t.count:>5} × "
                             f"{_fmt_bytes(t.msg_bytes):>9} = {_fmt_bytes(t.bytes):>9}  "
                             f"(sent {_fmt_bytes(t.wire_bytes):>9})  {t.what}")
            if est:
                exp = ", ".join(f"{d} {v / 1e3:.1f}" for d, v in est.exposed_comm_us.items())
                lines.append(f"     step {est.step_time_us / 1e3:.1f} ms = compute "
                             f"{est.compute_us / 1e3:.1f} (optimizer "
                             f"{est.optimizer_us / 1e3:.1f}) + exposed [{exp or '-'}] + bubble "
                             f"{est.bubble_us / 1e3:.1f} + overhead {est.overhead_us / 1e3:.1f}")
                if est.terms:
                    lines.append("     terms: " + ", ".join(
                        f"{k} {v / 1e3:.1f} ms" if k.endswith("_us") else f"{k} {v:.3f}"
                        for k, v in est.terms.items())
                        + (f"; {est.hw_tflops_per_gpu:.0f} TFLOP/s a GPU with recomputation"
                           if est.hw_tflops_per_gpu else ""))
    lines.append("(memory per rank, the fullest rank; comm = bytes each rank sends per step, "
                 "mean over ranks, * = between nodes; bubble = the schedule's closed form)")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _training(framework, precision, optimizer, recompute, attention, block, offload,
              fp32_grads, model_json, from_runs):
    from meshscope.layouts.plan.training import Training, TrainingError

    if framework is None:
        framework = "megatron" if model_json and not from_runs else "runner"
    if precision is None:
        precision = "fp32" if framework == "runner" else "mixed"
    try:
        return Training(framework=framework, precision=precision, optimizer=optimizer,
                        recompute=recompute, flash_attention=attention == "flash",
                        offload=offload, fp32_grads=fp32_grads, block=block)
    except TrainingError as e:
        fail(str(e))


def _job_setup(training, device, tflops, gpus_per_node, intra_gbps, inter_gbps,
               intra_latency_us, inter_latency_us, base_comm, from_runs, notes):
    """The device (GEMM curve, peak, memory bandwidth) and the topology of a GPU job."""
    import dataclasses

    from meshscope.layouts.plan.job_step import Device, GemmCurve
    from meshscope.layouts.plan.topology import Topology

    dev = None
    if device:
        dev = Device.named(device)
        if dev is None:
            fail(f"--device {device!r}: not in the device table (collectors/devices.py)")
        notes.append(f"compute: {dev.curve.source} (the curve's shape is assumed to carry "
                     f"to {device}); memory-bound kernels at {dev.memory_bytes_s / 1e12:g} TB/s")
        if tflops:
            eta = tflops * 1e12 / dev.peak_flops
            dev = dataclasses.replace(dev, curve=GemmCurve(eta, 0.0, f"--tflops {tflops:g}"))
            notes[-1] = f"compute: GEMMs at the given {tflops:g} TFLOP/s (η = {eta:.2f})"
    elif tflops:
        fail("--tflops with a GPU framework needs --device (its peak and memory bandwidth)")
    measured_comm, overhead_us = None, 0.0
    if from_runs:
        dev, measured_comm, run_world, overhead_us = _calibrated_device(from_runs, dev,
                                                                        training, notes)
    topo = Topology.for_device(device or (dev.name if dev else None), gpus_per_node or 8,
                               intra_gbps=intra_gbps, inter_gbps=inter_gbps,
                               intra_us=intra_latency_us, inter_us=inter_latency_us)
    if measured_comm is not None and measured_comm.table:
        level = "intra" if run_world <= topo.gpus_per_node else "inter"
        fallback = getattr(topo, level)
        measured_comm.alpha_us, measured_comm.busbw_gbps = fallback.alpha_us, \
            fallback.busbw_gbps
        setattr(topo, level, measured_comm)
        notes.append(f"{'in a node' if level == 'intra' else 'between nodes'}: the "
                     f"collectives measured in {from_runs[0]} ({measured_comm.describe()})")
    if base_comm is not None:
        topo.inter = base_comm
        notes.append("between nodes: the --baseline table (in a node: the link defaults or "
                     "--intra-gbps)")
    notes.append(f"topology: {topo.describe()}")
    if dev is None:
        notes.append("no --device: memory and traffic only (give --device for step times)")
    return dev, topo, overhead_us


def _calibrated_device(from_runs, dev, training, notes):
    """The GEMM curve through a measured GPU run's achieved rate (``plan --from GPU_RUN``)."""
    import dataclasses

    from meshscope.layouts.compare import CompareError, measured
    from meshscope.collectors.run_info import read_run_info
    from meshscope.layouts.plan.cost import rank_flops
    from meshscope.layouts.plan.job_step import Device, GemmCurve

    run = pathlib.Path(from_runs[0])
    if len(from_runs) > 1:
        fail("--from with a GPU framework takes one GPU run (its achieved GEMM rate)")
    try:
        info = read_run_info(run)
        m = measured(run)
    except (CompareError, OSError, ValueError) as e:
        fail(f"{run}: {e}")
    if info.device.type != "cuda" or not info.device.name:
        fail(f"{run} ran on {info.device.type}: its compute rate says nothing about a GPU "
             f"job; calibrate a --framework megatron/deepspeed/torch plan from a GPU run, or "
             f"plan it uncalibrated with --device")
    base = dev or Device.named(info.device.name)
    if base is None:
        fail(f"{run}: device {info.device.name!r} is not in the device table")
    cand = m.candidate
    r = max(m.compute_us, key=m.compute_us.get)
    busy_s = max(1e-9, (m.compute_us[r] - m.optimizer_us) / 1e6)
    eta = rank_flops(m.spec, cand, cand.layout.coordinates(r)["pp"]) / busy_s / base.peak_flops
    width = m.spec.dim / cand.layout.size("tp")
    shape = base.curve
    scale = eta / shape.efficiency(width)
    curve = GemmCurve(shape.eta_max * scale, shape.half_width,
                      f"{shape.source}, scaled through {run.name}'s measured η = {eta:.3f} at "
                      f"h/tp = {width:g}")
    notes.append(f"calibrated from {run} ({info.device.name}): GEMM curve {curve.source}")
    from meshscope.layouts.plan import CommModel
    comm = CommModel.from_rows(m.transfers, source=f"measured in {run.name}")
    # what the run's step spent outside compute, exposed communication and the bubble (data
    # loading, logging, host work): a fixed cost per step, carried over as it is
    overhead = max(0.0, m.step_time_us - m.compute_us[r] - sum(m.exposed_comm_us.values())
                   - (m.bubble_fraction or 0.0) * m.step_time_us)
    notes.append(f"a fixed {overhead / 1e3:.1f} ms a step of overhead measured in {run.name}")
    return dataclasses.replace(base, curve=curve), comm, cand.layout.world_size, overhead


def _apply_pipeline_options(cands, virtual_stages, stage_layers, n_layers):
    """``--virtual-stages`` and ``--stage-layers`` on every pipelined candidate."""
    import dataclasses

    from meshscope.parallel.layout import LayoutError

    from meshscope.theory.schedules import SCHEDULES

    counts = _csv(stage_layers, int) if stage_layers else None
    out, took_v = [], False
    for c in cands:
        if c.pp == 1:
            out.append(c)
            continue
        if virtual_stages is not None and SCHEDULES[c.schedule].fixed_virtual is None:
            try:
                c = dataclasses.replace(c, virtual=virtual_stages)
                c.v
            except LayoutError as e:
                fail(str(e))
            if c.n_stages > n_layers:
                continue
            took_v = True
        if counts:
            if len(counts) != c.n_stages:
                continue
            if sum(counts) != n_layers or min(counts) < 1:
                fail(f"--stage-layers {stage_layers}: {len(counts)} stages of "
                     f"{sum(counts)} layers, the model has {n_layers}")
            c = dataclasses.replace(c, stage_layer_counts=tuple(counts))
        out.append(c)
    if counts and not any(c.pp > 1 for c in out):
        fail(f"--stage-layers {stage_layers}: no pipelined layout has {len(counts)} stages")
    if virtual_stages is not None and not took_v and any(c.pp > 1 for c in cands):
        fail(f"--virtual-stages {virtual_stages}: no pipelined layout takes it (the schedules "
             f"asked for run a fixed number of stages a rank, or the model has too few "
             f"layers); add --schedules interleaved-1f1b")
    return out


@click.command("plan")
@click.option("--world", type=int, default=None, help="Ranks (default: the --from run's).")
@click.option("--model", default="tiny", show_default=True, help="Model preset.")
@click.option("--model-json", default=None, type=click.Path(exists=True, dir_okay=False),
              help="A Llama-style config.json (ours or Hugging Face's field names).")
@click.option("--seq-len", type=int, default=None, help="Sequence length (overrides the "
                                                        "model's).")
@_choice_options
@click.option("--dp-modes", default="ddp", show_default=True,
              help="ddp, zero1, zero2, fsdp (comma-separated; zero1 = the distributed "
                   "optimizer, planning only).")
@click.option("--virtual-stages", type=int, default=None,
              help="Stages per pipeline rank for interleaved schedules.")
@click.option("--stage-layers", default=None,
              help="Layers of each pipeline stage, comma-separated (e.g. 19,20,20,21).")
@click.option("--framework", type=click.Choice(["runner", "megatron", "deepspeed", "torch"]),
              default=None, help="Whose memory and traffic to plan (default: runner for a "
                                 "preset, megatron for --model-json).")
@click.option("--precision", type=click.Choice(["fp32", "mixed", "bf16", "fp8"]), default=None,
              help="fp32 (the runner's), mixed (bf16 + fp32 master; GPU default), bf16 "
                   "(no master copy), fp8 (mixed with fp8 GEMMs).")
@click.option("--optimizer", type=click.Choice(["adam", "sgd", "adafactor"]), default="adam",
              show_default=True)
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none",
              show_default=True, help="Activation recomputation.")
@click.option("--attention", type=click.Choice(["flash", "eager"]), default="flash",
              show_default=True, help="eager keeps the s × s scores (Korthikanti's 5as²b).")
@click.option("--block", type=click.Choice(["llama", "gpt"]), default="llama",
              show_default=True, help="Layer structure (gpt: LayerNorm, GeLU MLP, dropout).")
@click.option("--offload", type=click.Choice(["none", "optimizer", "all"]), default="none",
              show_default=True, help="CPU offload (all = weights too, with fsdp).")
@click.option("--fp32-grads/--no-fp32-grads", default=None,
              help="An fp32 gradient accumulation buffer (default: the framework's).")
@click.option("--gpus-per-node", type=int, default=None,
              help="GPUs a node (default 8): groups inside a node use NVLink, others the "
                   "network.")
@click.option("--intra-gbps", type=float, default=None, help="Bus bandwidth in a node, GB/s.")
@click.option("--inter-gbps", type=float, default=None,
              help="Bus bandwidth between nodes per GPU, GB/s.")
@click.option("--intra-latency-us", type=float, default=None)
@click.option("--inter-latency-us", type=float, default=None)
@click.option("--dp-overlap/--no-dp-overlap", default=True,
              help="Data-parallel reductions overlap the last backward (default on).")
@click.option("--tp-overlap", is_flag=True, help="Tensor-parallel communication hidden "
                                                 "(Megatron's --tp-comm-overlap).")
@click.option("--tflops", type=float, default=None, help="Sustained TFLOP/s per device.")
@click.option("--peak-tflops", type=float, default=None, help="Peak TFLOP/s per device (MFU).")
@click.option("--device", default=None, help="A GPU of the device table (H100, A100, …).")
@click.option("--devices", type=int, default=None,
              help="Devices the ranks share (runner on CPU: cores).")
@click.option("--device-memory-gb", type=float, default=None,
              help="Memory of one device: layouts that do not fit are marked and ranked last.")
@click.option("--bandwidth-gbps", type=float, default=None,
              help="Bus bandwidth, GB/s (runner; GPU jobs: --intra-gbps/--inter-gbps).")
@click.option("--latency-us", type=float, default=None, help="Collective latency, µs (runner).")
@click.option("--baseline", default=None, type=click.Path(exists=True),
              help="bench-comm baseline.parquet or nccl-tests output for communication (GPU "
                   "jobs: the network between nodes).")
@click.option("--from", "from_runs", multiple=True, type=click.Path(file_okay=False),
              help="Calibrate from this measured run (repeatable); without --model or "
                   "--model-json predicts the run's own model.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON, every term.")
@click.option("--detail", is_flag=True, help="Every term and operation of every layout.")
@click.pass_context
def plan_cmd(ctx, world, model, model_json, seq_len, dims, layouts, schedules, microbatches,
             global_batch, no_sp, layers, moe_experts, moe_top_k, moe_every, dp_modes,
             virtual_stages, stage_layers, framework, precision, optimizer, recompute,
             attention, block, offload, fp32_grads, gpus_per_node, intra_gbps, inter_gbps,
             intra_latency_us, inter_latency_us, dp_overlap, tp_overlap, tflops, peak_tflops,
             device, devices, device_memory_gb, bandwidth_gbps, latency_us, baseline,
             from_runs, as_json, detail):
    """Predict memory, communication and step time of layouts, before running them."""
    from meshscope.layouts.plan import plan
    from meshscope.layouts.sweep import SweepError, enumerate_candidates

    def given(name):
        return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

    training = _training(framework, precision, optimizer, recompute, attention, block,
                         offload, fp32_grads, model_json, from_runs)
    job = training.framework != "runner"
    if job:
        for flag, value in (("--devices", devices), ("--bandwidth-gbps", bandwidth_gbps),
                            ("--latency-us", latency_us), ("--peak-tflops", peak_tflops)):
            if value is not None:
                fail(f"{flag} is the runner's; a --framework {training.framework} plan takes "
                     f"--device, --gpus-per-node, --intra-gbps and --inter-gbps")
    else:
        for flag, value in (("--gpus-per-node", gpus_per_node), ("--intra-gbps", intra_gbps),
                            ("--inter-gbps", inter_gbps),
                            ("--intra-latency-us", intra_latency_us),
                            ("--inter-latency-us", inter_latency_us)):
            if value is not None:
                fail(f"{flag} describes a GPU cluster; give --framework megatron, deepspeed "
                     f"or torch to plan one")
        if tp_overlap or not dp_overlap:
            fail("--tp-overlap / --no-dp-overlap describe a GPU job; the runner's overlap is "
                 "its own (give --framework megatron, deepspeed or torch)")
    base_comm = _baseline_model(baseline)
    notes: list[str] = []
    explicit_model = model_json or given("model") or any(
        given(x) for x in ("layers", "moe_experts", "moe_top_k", "moe_every"))
    spec = _spec(model, model_json, seq_len, _overrides(layers, moe_experts, moe_top_k,
                                                        moe_every)) if explicit_model or \
        not from_runs else None
    rates = comm = None
    dev = topo = None
    overhead_us = 0.0
    if job:
        dev, topo, overhead_us = _job_setup(training, device, tflops, gpus_per_node, intra_gbps,
                               inter_gbps, intra_latency_us, inter_latency_us, base_comm,
                               from_runs, notes)
        if from_runs and spec is None:
            fail("--from with a GPU framework calibrates the device; name the model to plan "
                 "with --model-json (or --model)")
    else:
        rates, comm, notes = _assumed_rates(tflops, peak_tflops, devices, device,
                                            bandwidth_gbps, latency_us)
        if base_comm is not None:
            comm = base_comm
            notes = [n for n in notes if not n.startswith("communication")]
    if from_runs and not job:
        from meshscope.layouts.compare import CompareError, calibrated_planner, measured
        for flag in ("tflops", "devices", "bandwidth_gbps", "latency_us"):
            if given(flag):
                fail(f"--{flag.replace('_', '-')} with --from: the calibration measures it; "
                     f"drop one of the two")
        try:
            runs = [measured(pathlib.Path(r)) for r in from_runs]
            _, cal = calibrated_planner([pathlib.Path(r) for r in from_runs], rates, base_comm)
        except CompareError as e:
            fail(str(e))
        first = runs[0]
        if spec is None:
            spec = first.spec
        else:
            notes.append(f"calibrated on {first.spec.name} ({first.spec.n_params() / 1e6:,.1f} "
                         f"M parameters) and applied to {spec.name} "
                         f"({spec.n_params() / 1e6:,.1f} M): the per-layer, per-parameter and "
                         f"per-byte costs carry over; collectives larger than the run's are "
                         f"extrapolated along its measured sizes")
        world = world or first.candidate.layout.world_size
        if not given("global_batch"):
            global_batch = first.candidate.global_batch
        used = {d for r in runs for d in PARALLEL_DIMS if r.candidate.layout.size(d) > 1}
        dims = ",".join(sorted(set(_csv(dims)) | used, key=PARALLEL_DIMS.index))
        rates, comm = cal.rates, cal.comm
        notes = [n for n in notes if n.startswith("CPU") is False] + cal.notes
        notes.append(f"calibrated from {', '.join(r.name for r in runs)}")
    if world is None:
        fail("plan needs --world N (or --from RUN)")

    def kv_check(c):
        tp = c.layout.size("tp")
        if spec.kv_heads % tp:
            return f"tp={tp} does not divide the model's {spec.kv_heads} key/value heads"
        return None

    try:
        if job:
            from meshscope.layouts.plan.job_candidates import job_candidates
            cands = job_candidates(world, spec, dims=_csv(dims), schedules=_csv(schedules),
                                   microbatches=_csv(microbatches, int),
                                   dp_modes=_csv(dp_modes), global_batch=global_batch,
                                   sp=not no_sp, layouts=_layouts(layouts),
                                   extra_check=kv_check)
        else:
            cands = enumerate_candidates(world, spec.as_config(), dims=_csv(dims),
                                         schedules=_csv(schedules),
                                         microbatches=_csv(microbatches, int),
                                         dp_modes=_csv(dp_modes), global_batch=global_batch,
                                         sp=not no_sp, layouts=_layouts(layouts),
                                         runner_only=False, extra_check=kv_check)
    except SweepError as e:
        fail(str(e))
    cands = _apply_pipeline_options(cands, virtual_stages, stage_layers, spec.n_layers)
    if training.offload == "all" and not any(c.zero_stage == 3 for c in cands):
        fail("--offload all moves the weights to the host, which needs --dp-modes fsdp")
    if training.offload == "all":
        cands = [c for c in cands if c.zero_stage == 3]
    from meshscope.layouts.plan.job_step import JobOptions
    try:
        p = plan(spec, cands, precision=training.as_precision() if job else training.precision,
                 rates=rates, comm=comm,
                 device_memory_bytes=device_memory_gb * 1e9 if device_memory_gb else None,
                 notes=notes, training=training, device=dev, topology=topo,
                 job_options=JobOptions(dp_overlap=dp_overlap, tp_overlap=tp_overlap,
                                        step_overhead_us=overhead_us))
    except ValueError as e:
        fail(str(e))
    if as_json:
        from meshscope.layouts.plan.serial import plan_to_dict
        click.echo(json.dumps(plan_to_dict(p), indent=2))
    else:
        click.echo(render_plan(p, detail))


COMMANDS = (sweep, compare_cmd, plan_cmd)
