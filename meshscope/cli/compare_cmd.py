"""``meshscope compare``: what changed between runs, why, and a gate for CI (docs/compare.md).

``meshscope compare BEFORE AFTER`` takes anything ``analyze`` takes — run directories, folders
of anyone's traces (analysed with the same flags ``analyze`` has), analysed report directories
— and prints what changed from the first to the second (``analysis.compare.diff``); with more
runs, each later one against the first, and the runs ranked by step time; a sweep folder is
ranked as the sweep (``layouts.ranked``). ``--fail-if`` conditions make it a regression gate:
exit 1 when one holds beyond the runs' noise, 0 otherwise, 2 for bad input
(``analysis.compare.gate``); ``--junit`` and ``--markdown`` write the result for CI systems
and pull-request comments.
"""
from __future__ import annotations

import json
import pathlib

import click

from .analyze_cmd import analysis_flags, analysis_options, before_analysis
from .common import fail, register
from .layout_choices import assumed_rates, baseline_model

EXIT_GATE_FAILED = 1


def _write(path: str, text: str) -> None:
    """``text`` into ``path`` whole or not at all: written to a temporary file beside it and
    renamed over it, so a kill never leaves it truncated, and a symbolic link at ``path`` is
    replaced rather than followed onto its target."""
    if path == "-":
        click.echo(text, nl=False)
        return
    import os
    import tempfile

    target = pathlib.Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        fail(f"{path}: cannot write ({e.strerror})")


@click.command("compare")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--fail-if", "conditions", multiple=True, metavar="COND",
              help="A regression condition on the change from the first run to each other, "
                   "e.g. 'step_time>+5%', 'exposed_comm.dp>+2ms', 'peak_memory>+1GiB' "
                   "(repeatable; docs/compare.md lists the quantities). Exit 1 when one holds "
                   "beyond the runs' step-to-step noise.")
@click.option("--allow-unmeasured", is_flag=True,
              help="A --fail-if condition on a quantity a run does not measure (no step "
                   "timers, communication without mesh names…) is reported as not checked "
                   "instead of refused (exit 2).")
@click.option("--junit", "junit_out", default=None, type=click.Path(dir_okay=False),
              help="Write the gate's result as JUnit XML to this file (CI test reports).")
@click.option("--markdown", "markdown_out", default=None, type=click.Path(dir_okay=False),
              help="Write the comparison and the gate as Markdown to this file ('-': "
                   "standard output), e.g. for a pull-request comment.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--csv", "csv_out", default=None, type=click.Path(dir_okay=False),
              help="Write the runs' table as CSV to this file ('-': standard output).")
@click.option("--reports", "reports_dir", default=None, type=click.Path(file_okay=False),
              help="Write the reports of paths that need analysing here (one folder each) "
                   "instead of PATH/report — for trace folders you cannot or would rather not "
                   "write into.")
@click.option("--from", "from_runs", multiple=True, type=click.Path(),
              help="Predict with the planner calibrated from this run (repeatable); a GPU job "
                   "described with --model-json also takes anyone's Kineto trace file, whose "
                   "GEMMs' achieved rate scales the device's (as plan --from TRACE).")
@click.option("--detail", is_flag=True,
              help="Under each run of the table, every planned number beside the measured one.")
@click.option("--model-json", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Anyone's traces (no run.json): the GPU job's model, as plan takes it; with "
                   "--layout, --global-batch and the flags below, each such run is planned "
                   "and --detail puts every planned term beside the measured one.")
@click.option("--seq-len", type=int, default=None,
              help="With --model-json: the sequence length trained (overrides the model's).")
@click.option("--global-batch", type=int, default=None,
              help="With --model-json: sequences a step, over every data-parallel rank.")
@click.option("--micro-batch-size", type=int, default=1, show_default=True,
              help="With --model-json: sequences a microbatch on a data-parallel rank.")
@click.option("--device", "job_device", default=None,
              help="With --model-json: the device of the catalogue (default: the --from "
                   "trace's); without one, memory and traffic only.")
@click.option("--style", type=click.Choice(["megatron", "fsdp", "deepspeed"]), default=None,
              help="With --model-json: how the job runs, as plan --style.")
@click.option("--dp-modes", "dp_mode", default="ddp", show_default=True,
              type=click.Choice(["ddp", "zero1", "zero2", "fsdp", "fsdp_noreshard"]),
              help="With --model-json: the job's data-parallel mode.")
@click.option("--recompute", type=click.Choice(["none", "selective", "op", "full"]),
              default="none", show_default=True,
              help="With --model-json: the job's activation recomputation.")
@click.option("--precision", type=click.Choice(["fp32", "mixed", "bf16", "fp8"]),
              default="mixed", show_default=True, help="With --model-json: as plan --precision.")
@analysis_flags
def compare_cmd(paths, conditions, allow_unmeasured, junit_out, markdown_out, as_json,
                csv_out, reports_dir, from_runs, detail, model_json, seq_len, global_batch,
                micro_batch_size, job_device, style, dp_mode, recompute, precision, **flags):
    """Compare runs: what changed from the first (BEFORE) to the others, and why; or rank a
    sweep folder's runs."""
    # Here, not above: comparing reads reports with pandas (0.4 s), which ``meshscope
    # --help`` (it imports every command's module) should not pay for.
    from meshscope.analysis.compare import CompareError, diff, gate, outputs
    from meshscope.analysis.compare.ranking_text import render
    from meshscope.layouts.ranked import compare

    parsed = analysis_options(flags)
    try:
        cond = [gate.parse(c) for c in conditions]
    except gate.GateError as e:
        fail(str(e))
    paths = [pathlib.Path(p) for p in paths]
    sweep = len(paths) == 1 and (paths[0] / "sweep.json").exists()
    if len(paths) < 2 and not sweep:
        fail(f"{paths[0]}: give two or more runs to compare (BEFORE AFTER …), or one sweep "
             f"folder")
    if sweep and cond:
        fail("--fail-if compares runs against the first: give BEFORE AFTER, not a sweep")
    planner = job = None
    try:
        if model_json:
            job = _job(model_json, seq_len, global_batch, micro_batch_size, job_device, style,
                       dp_mode, recompute, precision, flags["layout"], from_runs)
        elif from_runs:
            from .plan_inputs import split_from

            _, traces = split_from(from_runs)
            if traces:
                fail(f"--from {traces[0]}: a trace file calibrates a GPU job's GEMMs; "
                     f"describe the job with --model-json (and --layout, --global-batch)")
            planner = _calibrated(from_runs, flags["baseline"])
        table = compare(paths, planner=planner, job=job, options=parsed.options,
                        baseline_path=parsed.baseline_path, reuse=not parsed.no_cache,
                        reports_dir=pathlib.Path(reports_dir) if reports_dir else None,
                        before_analysis=before_analysis(parsed.options))
        sides = table.sides
        for side in sides:          # the reports compare wrote or read, into the index of runs
            register(side.report_dir)
        diffs = [] if sweep else [diff(sides[0], s) for s in sides[1:]]
        verdicts = [(d.after.name, gate.evaluate(c, sides[0], s, d,
                                                 allow_unmeasured=allow_unmeasured))
                    for c in cond for d, s in zip(diffs, sides[1:])]
    except gate.GateError as e:
        fail(str(e))
    except CompareError as e:
        fail(str(e))
    if csv_out:
        _write(csv_out, table.to_csv())
    if junit_out:
        _write(junit_out, outputs.junit(verdicts, diffs))
    if markdown_out:
        _write(markdown_out, outputs.markdown(diffs, verdicts))
    if as_json:
        doc = table.to_dict()
        doc["diffs"] = [d.to_dict() for d in diffs]
        doc["gate"] = [{"run": name, "condition": v.condition.text, "failed": v.failed,
                        "checked": v.checked, "holds": v.holds, "measured": v.measured,
                        "noise": v.noise, "message": v.message} for name, v in verdicts]
        if detail and job is not None:
            doc["job_vs_plan"] = [j.to_dict() for j in _job_terms(table, job).values()]
        click.echo(json.dumps(doc, indent=2))
    elif csv_out != "-" and markdown_out != "-":
        blocks = [outputs.text(d) for d in diffs]
        if sweep or len(paths) > 2 or detail:
            blocks.append(render(table, detail))
        if detail:
            blocks += _memory_vs_plan(table, job)
        if verdicts:
            blocks.append(outputs.gate_text(verdicts))
        click.echo("\n\n".join(blocks))
    if any(v.failed for _, v in verdicts):
        raise SystemExit(EXIT_GATE_FAILED)


def _memory_vs_plan(table, job=None) -> list[str]:
    """Under ``--detail``: each run's memory, the planner's terms beside what its ranks
    measured (meshscope/layouts/memory_vs_plan.py); for anyone's traces (no run.json), the
    described GPU job's terms beside the report's (meshscope/layouts/job_vs_plan.py), or
    what to give for them."""
    from meshscope.layouts import job_vs_plan, memory_vs_plan    # --detail only: reads reports

    out = []
    jobs = _job_terms(table, job) if job is not None else {}
    foreign = {s.name for s in table.sides if s.info is None}
    for row in table.rows:
        if row.name in jobs:
            out.append(f"{row.name}:\n{job_vs_plan.render(jobs[row.name])}")
            continue
        if row.name in foreign:
            out.append(f"{row.name}: planned against measured: not planned — its traces do "
                       f"not say the model or layout; describe the job with --model-json, "
                       f"--layout and --global-batch (plan's flags)")
            continue
        try:
            m = memory_vs_plan.memory_vs_plan(pathlib.Path(row.path))
        except memory_vs_plan.PlanMemoryError as e:
            out.append(f"{row.name}: memory against the plan: {e}")
            continue
        out.append(f"{row.name}:\n{memory_vs_plan.render(m)}")
    return out


def _job_terms(table, job) -> dict:
    """run name → ``JobVsPlan`` of each compared run without run.json (anyone's traces),
    planned as the described GPU job (meshscope/layouts/job_vs_plan.py)."""
    from meshscope.layouts.job_vs_plan import job_vs_plan

    rows = {r.name: r for r in table.rows}
    return {s.name: job_vs_plan(s, rows[s.name], job) for s in table.sides
            if s.info is None and s.name in rows}


def _job(model_json, seq_len, global_batch, micro_batch_size, device, style, dp_mode,
         recompute, precision, layout, from_runs):
    """The GPU job that anyone's traces ran, as the user describes it with plan's flags
    (``plan_inputs``: the model, the training setup, the device, calibrated by a ``--from``
    trace file as ``plan --from TRACE``), and the analysis' ``--layout``. A flag missing or
    refused ends the command (exit 2, naming it)."""
    from meshscope.layouts.job_vs_plan import JobDescription
    from meshscope.layouts.plan.job_step import JobOptions
    from meshscope.parallel.layout import LayoutError, parse_layout

    from .plan_inputs import job_setup, model_spec, split_from, training_setup

    if not layout:
        fail("--model-json describes a GPU job's model; give its layout with --layout "
             "(e.g. dp=8,tp=4)")
    try:
        parse_layout(layout)
    except LayoutError as e:
        fail(f"--layout {layout!r}: {e}")
    if global_batch is None:
        fail("--model-json describes a GPU job's model; give its --global-batch (sequences a "
             "step, over every data-parallel rank)")
    if micro_batch_size < 1:
        fail(f"--micro-batch-size {micro_batch_size}: at least 1")
    runs, _ = split_from(from_runs)
    if runs or len(from_runs) > 1:
        fail(f"--from {(runs or from_runs)[0]}: with --model-json, --from takes one trace file "
             f"(its GEMMs' achieved rate calibrates the device)")
    notes: list[str] = []
    training = training_setup(None, style, precision, "adam", recompute, "flash", "llama",
                              "none", None, model_json, (), None, "delayed", False, "fp32",
                              None, 1, None, None)
    spec = model_spec("tiny", model_json, seq_len, (), notes, "llama")
    dev, topo, overhead_us = job_setup(training, device, None, {}, None, None, None, None,
                                       None, None, None, list(from_runs), notes)
    for n in notes:
        click.echo(f"meshscope: note: {n}", err=True)
    source = "plan (no device: memory and traffic)" if dev is None else \
        f"plan ({dev.name}, GEMM rate from {pathlib.Path(from_runs[0]).name})" if from_runs \
        else f"plan ({dev.name} curves)"
    job = JobDescription(spec=spec, training=training, device=dev, topology=topo,
                         options=JobOptions(step_overhead_us=overhead_us), layout_text=layout,
                         global_batch=global_batch, micro_batch_size=micro_batch_size,
                         dp_mode=dp_mode, source=source)
    try:
        job.candidate()
    except (ValueError, LayoutError) as e:
        fail(str(e))
    return job


def _calibrated(from_runs, baseline: str | None):
    """The planner calibrated on ``--from`` runs (its notes on stderr)."""
    from meshscope.layouts.ranked import calibrated_planner     # pandas: see compare_cmd

    rates, _, _ = assumed_rates(None, None, None, None, None, None)
    planner, cal = calibrated_planner([pathlib.Path(p) for p in from_runs], rates,
                                      baseline_model(baseline))
    for n in cal.notes:
        click.echo(f"meshscope: note: {n}", err=True)
    return planner


COMMANDS = (compare_cmd,)
