"""``meshscope sweep``: run every valid layout of N ranks, analyse each and rank them.

The layouts come from ``layouts.sweep`` (resumable: a sweep folder keeps each run's state),
the ranking from ``layouts.ranked`` and ``analysis/compare/ranking.py``; before the runs the
planner's view of every layout is written beside them (``plan.json``). The command does not
import torch: the runs train in child processes.
"""
from __future__ import annotations

import pathlib
import sys

import click

from meshscope.collectors.profile_steps import parse_step_range
from meshscope.collectors.run_dir import COMPARISON_JSON, PLAN_JSON, write_json_atomic
from meshscope.layouts.plan import ModelSpec, plan
from meshscope.layouts.plan.serial import plan_to_dict
from meshscope.layouts.sweep import Sweep, SweepError, SweepSpec, run_sweep
from meshscope.parallel.faults import FORMS as FAULT_FORMS

from .common import fail
from .layout_choices import assumed_rates, choice_options, csv_values, layouts_of, \
    model_overrides


def _write_comparison(folder: pathlib.Path) -> None:
    from meshscope.layouts.ranked import CompareError, compare

    try:
        c = compare(folder)
    except CompareError as e:
        click.echo(f"meshscope: warning: comparison not written: {e}", err=True)
        return
    write_json_atomic(folder / COMPARISON_JSON, c.to_dict())
    (folder / "comparison.csv").write_text(c.to_csv())


def _sweep_plan(sweep, tflops: float | None, devices: int | None) -> None:
    """Write SWEEP/plan.json: the planner's view of every layout before the runs."""
    rates, comm, notes = assumed_rates(tflops, None, devices, None, None, None)
    spec = ModelSpec.from_config(sweep.spec.model_config, name=sweep.spec.model)
    p = plan(spec, sweep.candidates, rates=rates, comm=comm, notes=notes)
    write_json_atomic(sweep.folder / PLAN_JSON, plan_to_dict(p))


@click.command()
@click.option("--world", type=int, default=None, help="Ranks of every layout.")
@click.option("--model", default="tiny", show_default=True, help="Model preset.")
@choice_options
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
    # Here, not above: the ranking reads the runs' reports with pandas (0.4 s), which
    # ``meshscope --help`` (it imports every command's module) should not pay for.
    from meshscope.analysis.compare.ranking_text import render
    from meshscope.layouts.ranked import compare

    try:
        if resume:
            sw = Sweep.open(pathlib.Path(resume))
        else:
            if world is None or out is None:
                fail("sweep needs --world N and --out DIR (or --resume DIR)")
            ps = None
            if profile_steps:
                try:
                    ps = parse_step_range(profile_steps)
                except ValueError as e:
                    fail(str(e))
            spec = SweepSpec(world=world, model=model,
                             model_overrides=model_overrides(layers, moe_experts, moe_top_k,
                                                             moe_every),
                             dims=csv_values(dims), schedules=csv_values(schedules),
                             microbatches=csv_values(microbatches, int),
                             dp_modes=csv_values(dp_modes),
                             layouts=layouts_of(layouts), steps=steps, global_batch=global_batch,
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



COMMANDS = (sweep,)
