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


def _run_options(layout, schedule, microbatches, steps, out, seed, global_batch, model,
                 profile_steps):
    from collectors.profiling import parse_step_range
    from parallel.launch import RunOptions
    from parallel.layout import LayoutError, parse_layout
    from parallel.model import PRESETS

    try:
        steps_range = parse_step_range(profile_steps) if profile_steps else None
    except ValueError as e:
        raise LayoutError(f"--profile-steps: {e}") from None
    return RunOptions(layout=parse_layout(layout), model=PRESETS[model], out=pathlib.Path(out),
                      schedule=schedule, microbatches=microbatches, steps=steps, seed=seed,
                      global_batch=global_batch, profile_steps=steps_range, model_preset=model)


def run_options_decorator(f):
    from parallel.model import PRESETS

    opts = [
        click.option("--layout", default="dp=2,pp=2", show_default=True,
                     help="Parallel layout, e.g. dp=2,pp=2 (dimensions dp, tp, pp, cp, ep)."),
        click.option("--schedule", default="1f1b", show_default=True,
                     help="Pipeline schedule: gpipe or 1f1b."),
        click.option("--microbatches", default=4, show_default=True, type=int),
        click.option("--steps", default=6, show_default=True, type=int),
        click.option("--seed", default=0, show_default=True, type=int),
        click.option("--global-batch", default=16, show_default=True, type=int,
                     help="Sequences per step over all data-parallel ranks."),
        click.option("--model", default="tiny", show_default=True,
                     type=click.Choice(sorted(PRESETS)), help="Model size preset."),
        click.option("--profile-steps", default=None,
                     help="Steps to trace, FIRST-LAST (0-based); default: the last three after "
                          "warm-up."),
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


def _print_losses(run_dir: pathlib.Path) -> None:
    import pandas as pd

    files = sorted((run_dir / "steps").glob("rank*.parquet"))
    if not files:
        return
    steps = pd.concat([pd.read_parquet(f) for f in files])
    loss = steps.dropna(subset=["loss"]).groupby("step")["loss"].mean()
    wall = steps.groupby("step")["wall_time_us"].max()
    for step, value in loss.items():
        click.echo(f"  step {step:3d}  loss {value:.4f}  step time {wall[step] / 1000:8.1f} ms")


@main.command()
@run_options_decorator
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Run directory to create.")
def run(layout, schedule, microbatches, steps, seed, global_batch, model, profile_steps, out):
    """Train the small Llama-style model in LAYOUT and record a run directory."""
    from parallel.layout import LayoutError

    try:
        opts = _run_options(layout, schedule, microbatches, steps, out, seed, global_batch, model,
                            profile_steps)
        from parallel.launch import check
        check(opts)
    except LayoutError as e:
        _fail(str(e))
    click.echo(f"meshscope run: layout {opts.layout} on {opts.layout.world_size} ranks -> {out}")
    _do_run(opts)
    _print_losses(pathlib.Path(out))
    click.echo(f"run directory written: {out}")


def _analyze(path, out, comm_kernel_regex):
    from analysis.errors import InputError
    from analysis.report import analyze as do_analyze
    from collectors.run_dir import REPORT, RunDirError

    try:
        report = do_analyze(pathlib.Path(path), comm_kernel_re=comm_kernel_regex)
    except (InputError, RunDirError) as e:
        _fail(str(e))
    target = pathlib.Path(out) if out else pathlib.Path(path) / REPORT
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
def analyze(path, out, as_json, comm_kernel_regex):
    """Analyse a run directory or any folder of Kineto traces."""
    from analysis.summary_text import render

    report, target = _analyze(path, out, comm_kernel_regex)
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
    opts = _run_options("dp=2,pp=2", "1f1b", 4, 6, run_dir, 0, 16, "tiny", None)
    click.echo(f"meshscope demo: training dp=2,pp=2 on 4 local ranks -> {run_dir}")
    _do_run(opts)
    _print_losses(run_dir)
    _, target = _analyze(run_dir, None, None)
    click.echo(render(json.loads((target / "summary.json").read_text())))
    if not no_serve:
        _serve(root, "127.0.0.1", port)


if __name__ == "__main__":
    main()
