"""The ``meshscope`` command line: run, analyze, dashboard, demo.

Every stage is also a Python API (``parallel.launch``, ``analysis.report``,
``dashboard.app``); this module only parses options, calls them, and turns unusable input into
one line on stderr and exit code 2.
"""
from __future__ import annotations

import json
import pathlib
import sys

import click

EXIT_BAD_INPUT = 2
DEFAULT_RUNS = pathlib.Path(__file__).resolve().parent / "samples"


def _fail(message: str, code: int = EXIT_BAD_INPUT):
    click.echo(f"meshscope: error: {message}", err=True)
    sys.exit(code)


@click.group()
@click.version_option(package_name="meshscope")
def main():
    """Profile and analyse parallel LLM training runs."""


def _int_list(text: str | None, what: str) -> list[int] | None:
    from parallel.layout import LayoutError

    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise LayoutError(f"{what} {text!r}: expected comma-separated integers") from None


def _run_options(o: dict):
    """RunOptions from the ``run``/``demo`` command's options (LayoutError if unusable)."""
    import dataclasses

    from collectors.profiling import parse_step_range
    from parallel.faults import parse_fault
    from parallel.launch import RunOptions
    from parallel.layout import LayoutError, parse_layout
    from parallel.model import PRESETS

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
        peak_flops=o["peak_tflops"] * 1e12 if o.get("peak_tflops") else None,
        peak_bandwidth=o["peak_bandwidth_gbps"] * 1e9 if o.get("peak_bandwidth_gbps") else None)


def run_options_decorator(f):
    from parallel.model import PRESETS
    from parallel.pipeline import SCHEDULES

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
                     help="Fault: slow-rank=R:MS, hang=R:STEP or crash=R:STEP (repeatable)."),
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


def _do_run(opts) -> dict:
    from parallel.launch import LaunchError, launch
    from parallel.layout import LayoutError

    try:
        return launch(opts)
    except LayoutError as e:
        _fail(str(e))
    except LaunchError as e:
        _fail(f"the run failed: {e}", code=1)


def _print_losses(run_dir: pathlib.Path, desc: dict) -> None:
    from parallel.throughput import step_table

    table, problems = step_table(run_dir, desc)
    for line in problems:
        click.echo(f"meshscope: warning: {line}", err=True)
    if table is None:
        return
    for row in table.itertuples():
        mfu = f"  MFU {row.mfu_pct:5.2f}%" if row.mfu_pct == row.mfu_pct else ""
        click.echo(f"  step {row.step:3d}  loss {row.loss:.4f}  step time "
                   f"{row.step_time_us / 1000:8.1f} ms  {row.tokens_per_s:9.0f} tokens/s{mfu}")


@main.command()
@run_options_decorator
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Run directory to create.")
def run(**o):
    """Train the small Llama-style model in LAYOUT and record a run directory."""
    from parallel.launch import check
    from parallel.layout import LayoutError

    try:
        opts = _run_options(o)
        check(opts)
    except LayoutError as e:
        _fail(str(e))
    click.echo(f"meshscope run: layout {opts.layout} on {opts.layout.world_size} ranks "
               f"-> {opts.out}")
    click.echo(opts.layout.coordinate_table())
    desc = _do_run(opts)
    _print_losses(pathlib.Path(opts.out), desc)
    click.echo(f"run directory written: {opts.out}")


def _load_baseline(path: str | None):
    """A bandwidth baseline: bench-comm's baseline.parquet/.csv, or nccl-tests output (a log
    file or a folder of them)."""
    if not path:
        return None
    import pandas as pd

    from analysis import nccl_tests

    p = pathlib.Path(path)
    try:
        if p.is_dir():
            frames = [nccl_tests.read(f) for f in sorted(p.glob("*.log"))]
            return pd.concat(frames, ignore_index=True) if frames else None
        if p.suffix == ".parquet":
            return pd.read_parquet(p)
        if p.suffix == ".csv":
            return pd.read_csv(p)
        return nccl_tests.read(p)
    except (OSError, ValueError) as e:
        _fail(f"{p}: not a usable baseline ({e})")


def _analyze(path, out, comm_kernel_regex, rank_regex=None, cache=True, baseline=None):
    import re

    from analysis.errors import InputError
    from analysis.ingest import compile_rank_regex
    from analysis.report import analyze as do_analyze
    from collectors.run_dir import REPORT, RunDirError

    try:
        compile_rank_regex(rank_regex)
        if comm_kernel_regex:
            re.compile(comm_kernel_regex)
    except ValueError as e:
        _fail(str(e))
    except re.error as e:
        _fail(f"--comm-kernel-regex {comm_kernel_regex!r} is not a regular expression ({e})")
    target = pathlib.Path(out) if out else pathlib.Path(path) / REPORT
    try:
        report = do_analyze(pathlib.Path(path), comm_kernel_re=comm_kernel_regex,
                            rank_regex=rank_regex, cache_dir=target / ".cache" if cache else None,
                            progress=True, baseline=_load_baseline(baseline))
    except (InputError, RunDirError) as e:
        _fail(str(e))
    try:
        report.write(target)
    except OSError as e:
        _fail(f"{target}: cannot write the report ({e.strerror}); choose another with --out DIR")
    return report, target


@main.command()
@click.argument("path", type=click.Path())
@click.option("--out", type=click.Path(file_okay=False),
              help="Report directory (default: PATH/report).")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of text.")
@click.option("--comm-kernel-regex", default=None,
              help="Extra regular expression for communication kernels (e.g. custom "
                   "symmetric-memory or DeepEP kernels).")
@click.option("--rank-regex", default=None,
              help="For traces without distributedInfo whose file names are not rank<N> / "
                   "worker<N>: a regular expression with one group that captures the rank "
                   "from the file name, e.g. 'gpu(\\d+)'.")
@click.option("--no-cache", is_flag=True,
              help="Parse every trace afresh instead of reusing the parquet copies kept in "
                   "the report directory's .cache/ (keyed by each file's content hash).")
@click.option("--baseline", default=None, type=click.Path(exists=True),
              help="Bandwidth baseline: `meshscope bench-comm`'s baseline.parquet, or "
                   "nccl-tests output (a log, or a folder of *.log).")
def analyze(path, out, as_json, comm_kernel_regex, rank_regex, no_cache, baseline):
    """Analyse a run directory or any folder of Kineto traces."""
    from analysis.summary_text import render

    report, target = _analyze(path, out, comm_kernel_regex, rank_regex, cache=not no_cache,
                              baseline=baseline)
    summary = json.loads((target / "summary.json").read_text())
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        for p in report.problems:
            click.echo(f"meshscope: warning: {p}", err=True)
        click.echo(render(summary))
        click.echo(f"\nreport written: {target}")


def _serve(runs_dir: pathlib.Path, host: str, port: int) -> None:
    from dashboard.app import create_app

    app = create_app(runs_dir)
    click.echo(f"meshscope dashboard on http://{host}:{port}/ over {runs_dir} (Ctrl-C stops)")
    app.run(host=host, port=port, debug=False)


@main.command()
@click.argument("runs_dir", required=False, type=click.Path(file_okay=False))
@click.option("--port", default=8050, show_default=True, type=int)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; loopback unless you mean to share it.")
def dashboard(runs_dir, port, host):
    """Serve the web dashboard over RUNS_DIR (default: the bundled samples/)."""
    path = pathlib.Path(runs_dir) if runs_dir else DEFAULT_RUNS
    if not path.is_dir():
        _fail(f"{path}: no such directory")
    _serve(path, host, port)


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


@main.command("bench-comm")
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

    from parallel.launch import LaunchError, bench_comm
    from parallel.layout import LayoutError, parse_layout

    try:
        path = bench_comm(parse_layout(layout), pathlib.Path(out),
                          ops=[o.strip() for o in ops.split(",") if o.strip()],
                          sizes=_sizes(sizes), iters=iters, warmup=warmup, profile=profile)
    except (LayoutError, ValueError) as e:
        _fail(str(e))
    except LaunchError as e:
        _fail(f"the sweep failed: {e}", code=1)
    table = pd.read_parquet(path)
    click.echo(f"{'dim':>4} {'op':>15} {'ranks':>5} {'size':>10} {'time us':>10} "
               f"{'algbw GB/s':>10} {'busbw GB/s':>10}")
    for r in table.itertuples():
        click.echo(f"{r.dim:>4} {r.op:>15} {r.n_ranks:>5} {r.size_bytes:>10} {r.time_us:>10.1f} "
                   f"{r.algbw_gbps:>10.3f} {r.busbw_gbps:>10.3f}")
    click.echo(f"baseline written: {path}")


@main.command()
@click.option("--out", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Folder that receives the demo run (a new run-N directory inside).")
@click.option("--no-serve", is_flag=True, help="Run and analyse, but do not start the dashboard.")
@click.option("--port", default=8050, show_default=True, type=int)
def demo(out, no_serve, port):
    """Run dp=2,pp=2 (1F1B, 4 microbatches, 6 steps) here, analyse it, show the dashboard."""
    from analysis.summary_text import render

    root = pathlib.Path(out)
    root.mkdir(parents=True, exist_ok=True)
    n = 1
    while (root / f"demo-{n}").exists():
        n += 1
    run_dir = root / f"demo-{n}"
    opts = _run_options({"layout": "dp=2,pp=2", "schedule": "1f1b", "microbatches": 4,
                         "steps": 6, "out": run_dir, "seed": 0, "global_batch": 16,
                         "model": "tiny"})
    click.echo(f"meshscope demo: training dp=2,pp=2 on 4 local ranks -> {run_dir}")
    desc = _do_run(opts)
    _print_losses(run_dir, desc)
    _, target = _analyze(run_dir, None, None)
    click.echo(render(json.loads((target / "summary.json").read_text())))
    if not no_serve:
        _serve(root, "127.0.0.1", port)


if __name__ == "__main__":
    main()
