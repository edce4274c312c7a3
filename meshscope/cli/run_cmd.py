"""``meshscope run``, ``demo`` and ``bench-comm``: the commands that train or measure."""
from __future__ import annotations

import json
import pathlib

import click

from meshscope.analysis.report.printable import printable

from meshscope.parallel.faults import FORMS as FAULT_FORMS

from .common import fail

def _int_list(text: str | None, what: str) -> list[int] | None:
    from meshscope.parallel.layout import LayoutError

    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise LayoutError(f"{what} {text!r}: expected comma-separated integers") from None


def _run_options(o: dict):
    """RunOptions from the ``run``/``demo`` command's options (LayoutError if unusable)."""
    import dataclasses

    from meshscope.collectors.profile_steps import parse_step_range
    from meshscope.parallel.faults import parse_fault
    from meshscope.parallel.options import RunOptions
    from meshscope.parallel.layout import LayoutError, parse_layout
    from meshscope.parallel.config import PRESETS

    try:
        steps_range = parse_step_range(o["profile_steps"]) if o.get("profile_steps") else None
        faults = [parse_fault(f) for f in o.get("inject") or ()]
    except ValueError as e:
        raise LayoutError(str(e)) from None
    overrides = {k: o[k] for k in ("moe_experts", "moe_top_k", "moe_every")
                 if o.get(k) is not None}
    if o.get("layers") is not None:
        overrides["n_layers"] = o["layers"]
    model = dataclasses.replace(PRESETS[o["model"]], **overrides)
    return RunOptions(
        layout=parse_layout(o["layout"]), model=model, out=pathlib.Path(o["out"]),
        schedule=o["schedule"], microbatches=o["microbatches"], steps=o["steps"],
        seed=o["seed"], global_batch=o["global_batch"], profile_steps=steps_range,
        model_preset=o["model"], virtual_stages=o.get("virtual_stages"),
        stage_layers=_int_list(o.get("stage_layers"), "--stage-layers"),
        dp_mode=o.get("dp_mode", "ddp"), sp=not o.get("no_sp", False), faults=faults,
        timeout_s=o.get("timeout", 300), nnodes=o.get("nnodes", 1),
        node_rank=o.get("node_rank", 0), rdzv_endpoint=o.get("rdzv_endpoint"),
        nproc_per_node=o.get("nproc_per_node"),
        always_on=o.get("always_on", True), nccl_debug=o.get("nccl_debug", False),
        memory_snapshot=o.get("memory_snapshot", False),
        profile_memory=o.get("profile_memory", True),
        peak_flops=o["peak_tflops"] * 1e12 if o.get("peak_tflops") else None,
        peak_bandwidth=o["peak_bandwidth_gbps"] * 1e9 if o.get("peak_bandwidth_gbps") else None)


def run_options_decorator(f):
    from meshscope.parallel.config import PRESETS
    from meshscope.theory.schedules import SCHEDULES

    opts = [
        click.option("--layout", default="dp=2,pp=2", show_default=True,
                     help="Parallel layout, e.g. dp=2,tp=2,pp=2 (dimensions dp, tp, pp, cp, "
                          "ep; world size = dp·tp·pp·cp; ep divides dp·cp)."),
        click.option("--schedule", default="1f1b", show_default=True,
                     help=f"Pipeline schedule: {', '.join(SCHEDULES)}."),
        click.option("--virtual-stages", type=int, default=None,
                     help="Stages per pipeline rank for interleaved-1f1b, looped-bfs and "
                          "zero-bubble (default 2)."),
        click.option("--stage-layers", default=None,
                     help="Layers per pipeline stage, e.g. 3,1 (default: even split)."),
        click.option("--microbatches", default=4, show_default=True, type=int),
        click.option("--steps", default=6, show_default=True, type=int),
        click.option("--seed", default=0, show_default=True, type=int),
        click.option("--global-batch", default=16, show_default=True, type=int,
                     help="Sequences per step over all data-parallel ranks."),
        click.option("--model", default="tiny", show_default=True,
                     type=click.Choice(sorted(PRESETS)), help="Model size preset."),
        click.option("--layers", type=int, default=None, help="Override the preset's layers."),
        click.option("--moe-experts", type=int, default=None,
                     help="Mixture-of-experts FFN with this many experts (0 = dense)."),
        click.option("--moe-top-k", type=int, default=None, help="Experts per token."),
        click.option("--moe-every", type=int, default=None,
                     help="MoE in every k-th layer (1 = all)."),
        click.option("--dp-mode", default="ddp", show_default=True,
                     type=click.Choice(["ddp", "fsdp", "zero2"]),
                     help="ddp (bucketed all-reduce), fsdp (ZeRO-3) or zero2."),
        click.option("--no-sp", is_flag=True, help="Tensor parallelism without sequence "
                                                   "parallelism."),
        click.option("--inject", multiple=True,
                     help=f"Fault: {FAULT_FORMS} (repeatable)."),
        click.option("--timeout", default=300, show_default=True, type=int,
                     help="Collective timeout in seconds."),
        click.option("--profile-steps", default=None,
                     help="Steps to trace, FIRST-LAST (0-based); default: the last three after "
                          "warm-up."),
        click.option("--always-on/--no-always-on", default=True, show_default=True,
                     help="Always-on collectors (step-timer flushes, Flight Recorder); off "
                          "only to measure what they cost (bench/collector_overhead.py)."),
        click.option("--nccl-debug", is_flag=True,
                     help="CUDA: NCCL_DEBUG=INFO per rank into comms/nccl-rank{R}.log, parsed "
                          "by collectors.nccl_debug."),
        click.option("--profile-memory/--no-profile-memory", default=True, show_default=True,
                     help="Record the allocator's [memory] events in the traces (the "
                          "report's memory tables; docs/memory.md)."),
        click.option("--memory-snapshot", is_flag=True,
                     help="CUDA: record the allocator's history over the profiled steps and "
                          "dump a memory snapshot per rank into memory/rank{R}.pickle "
                          "(torch.cuda.memory._dump_snapshot; read by meshscope analyze)."),
        click.option("--peak-tflops", type=float, default=None,
                     help="Peak dense TFLOP/s of one device, for MFU (default: from the device "
                          "table when the device is known)."),
        click.option("--peak-bandwidth-gbps", type=float, default=None,
                     help="Peak memory bandwidth of one device, GB/s."),
        click.option("--nnodes", default=1, show_default=True, type=int,
                     help="Hosts taking part (run the same command on each)."),
        click.option("--node-rank", default=0, show_default=True, type=int),
        click.option("--nproc-per-node", type=int, default=None,
                     help="Ranks per host (default: world size / nnodes); must agree with the "
                          "layout."),
        click.option("--rdzv-endpoint", default=None,
                     help="HOST:PORT of node 0, where the launchers meet (nnodes > 1)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _start_rank_server(opts) -> None:
    """Start the server the ranks are forked from (``parallel/rank_start.py``) before this
    process imports torch, so that both import it at once, on two cores."""
    from meshscope.parallel.rank_start import rank_modules, start_server

    start_server(rank_modules(opts.layout, opts.dp_mode))


def _do_run(opts):
    """Launch the run; its final ``RunInfo`` (a refused layout or a failed rank ends the command)."""
    from meshscope.parallel.launch import LaunchError, launch
    from meshscope.parallel.layout import LayoutError

    try:
        return launch(opts)
    except LayoutError as e:
        fail(str(e))
    except LaunchError as e:
        fail(f"the run failed: {e}", code=1)


def _print_losses(run_dir: pathlib.Path, run) -> None:
    """Each step's loss, time, tokens/s and MFU; ``run``: the run's ``RunInfo``."""
    from meshscope.layouts.throughput import step_table

    table, problems = step_table(run_dir, run)
    for line in problems:
        click.echo(f"meshscope: warning: {printable(line)}", err=True)
    if table is None:
        return
    for row in table.itertuples():
        mfu = f"  MFU {row.mfu_pct:5.2f}%" if row.mfu_pct == row.mfu_pct else ""
        click.echo(f"  step {row.step:3d}  loss {row.loss:.4f}  step time "
                   f"{row.step_time_us / 1000:8.1f} ms  {row.tokens_per_s:9.0f} tokens/s{mfu}")


@click.command()
@run_options_decorator
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Run directory to create.")
def run(**o):
    """Train the small Llama-style model in LAYOUT and record a run directory."""
    from meshscope.parallel.layout import LayoutError
    from meshscope.parallel.options import check

    try:
        opts = _run_options(o)
        check(opts)
    except LayoutError as e:
        fail(str(e))
    _start_rank_server(opts)
    click.echo(f"meshscope run: layout {opts.layout} on {opts.layout.world_size} ranks "
               f"-> {opts.out}")
    click.echo(opts.layout.coordinate_table())
    info = _do_run(opts)
    _print_losses(pathlib.Path(opts.out), info)
    click.echo(f"run directory written: {opts.out}")


def _sizes(text: str) -> list[int]:
    """``1K-64M`` (every power of 4 between) or ``4096,65536`` → sizes in bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

    def one(tok: str) -> int:
        tok = tok.strip().upper().rstrip("B")
        return int(float(tok[:-1]) * units[tok[-1]]) if tok[-1:] in "KMG" else int(tok)

    if "-" in text:
        lo, hi = (one(t) for t in text.split("-", 1))
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= 4
        return out
    return [one(t) for t in text.split(",")]


@click.command("bench-comm")
@click.option("--layout", default="dp=2", show_default=True,
              help="Groups to measure: each dimension of size > 1 of this layout.")
@click.option("--ops", default="all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,"
                              "send_recv", show_default=True)
@click.option("--sizes", default="1K-64M", show_default=True,
              help="Message sizes S (nccl-tests' meaning): LO-HI in powers of 4, or a list.")
@click.option("--iters", default=20, show_default=True, type=int)
@click.option("--warmup", default=5, show_default=True, type=int)
@click.option("--profile", is_flag=True,
              help="Also trace every rank, so `meshscope analyze OUT` reports the sweep.")
@click.option("--out", required=True, type=click.Path(file_okay=False))
def bench_comm_cmd(layout, ops, sizes, iters, warmup, profile, out):
    """nccl-tests-style bandwidth sweep; writes OUT/baseline.parquet for `analyze --baseline`."""
    import pandas as pd

    from meshscope.parallel.launch import LaunchError, bench_comm
    from meshscope.parallel.layout import LayoutError, parse_layout

    try:
        path = bench_comm(parse_layout(layout), pathlib.Path(out),
                          ops=[o.strip() for o in ops.split(",") if o.strip()],
                          sizes=_sizes(sizes), iters=iters, warmup=warmup, profile=profile)
    except (LayoutError, ValueError) as e:
        fail(str(e))
    except LaunchError as e:
        fail(f"the sweep failed: {e}", code=1)
    table = pd.read_parquet(path)
    click.echo(f"{'dim':>4} {'op':>15} {'ranks':>5} {'size':>10} {'time us':>10} "
               f"{'algbw GB/s':>10} {'busbw GB/s':>10}")
    for r in table.itertuples():
        click.echo(f"{r.dim:>4} {r.op:>15} {r.n_ranks:>5} {r.size_bytes:>10} {r.time_us:>10.1f} "
                   f"{r.algbw_gbps:>10.3f} {r.busbw_gbps:>10.3f}")
    click.echo(f"baseline written: {path}")


@click.command()
@click.option("--out", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Folder that receives the demo run (a new run-N directory inside).")
@click.option("--no-serve", is_flag=True, help="Run and analyse, but do not start the dashboard.")
@click.option("--port", default=8050, show_default=True, type=int)
def demo(out, no_serve, port):
    """Run dp=2,pp=2 (1F1B, 4 microbatches, 6 steps) here, analyse it, show the dashboard."""
    root = pathlib.Path(out)
    root.mkdir(parents=True, exist_ok=True)
    n = 1
    while (root / f"demo-{n}").exists():
        n += 1
    run_dir = root / f"demo-{n}"
    opts = _run_options({"layout": "dp=2,pp=2", "schedule": "1f1b", "microbatches": 4,
                         "steps": 6, "out": run_dir, "seed": 0, "global_batch": 16,
                         "model": "tiny"})
    _start_rank_server(opts)
    from meshscope.analysis.report.text import render

    from .analyze_cmd import run_analysis
    from .dashboard_cmd import serve

    click.echo(f"meshscope demo: training dp=2,pp=2 on 4 local ranks -> {run_dir}")
    info = _do_run(opts)
    _print_losses(run_dir, info)
    _, target = run_analysis(run_dir)
    from meshscope.collectors.run_dir import ReportDir
    click.echo(render(json.loads(ReportDir(target).summary.read_text())))
    if not no_serve:
        serve(root, "127.0.0.1", port)



COMMANDS = (run, bench_comm_cmd, demo)
