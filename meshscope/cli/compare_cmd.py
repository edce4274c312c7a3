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
@click.option("--from", "from_runs", multiple=True, type=click.Path(file_okay=False),
              help="Predict with the planner calibrated from this run (repeatable).")
@click.option("--detail", is_flag=True,
              help="Under each run of the table, every planned number beside the measured one.")
@analysis_flags
def compare_cmd(paths, conditions, allow_unmeasured, junit_out, markdown_out, as_json,
                csv_out, reports_dir, from_runs, detail, **flags):
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
    planner = None
    try:
        if from_runs:
            planner = _calibrated(from_runs, flags["baseline"])
        table = compare(paths, planner=planner, options=parsed.options,
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
        click.echo(json.dumps(doc, indent=2))
    elif csv_out != "-" and markdown_out != "-":
        blocks = [outputs.text(d) for d in diffs]
        if sweep or len(paths) > 2 or detail:
            blocks.append(render(table, detail))
        if detail:
            blocks += _memory_vs_plan(table)
        if verdicts:
            blocks.append(outputs.gate_text(verdicts))
        click.echo("\n\n".join(blocks))
    if any(v.failed for _, v in verdicts):
        raise SystemExit(EXIT_GATE_FAILED)


def _memory_vs_plan(table) -> list[str]:
    """Under ``--detail``: each run's memory, the planner's terms beside what its ranks
    measured (meshscope/layouts/memory_vs_plan.py)."""
    from meshscope.layouts import memory_vs_plan    # --detail only: it reads reports

    out = []
    for row in table.rows:
        try:
            m = memory_vs_plan.memory_vs_plan(pathlib.Path(row.path))
        except memory_vs_plan.PlanMemoryError as e:
            out.append(f"{row.name}: memory against the plan: {e}")
            continue
        out.append(f"{row.name}:\n{memory_vs_plan.render(m)}")
    return out


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
