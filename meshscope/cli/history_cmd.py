"""``meshscope index``, ``meshscope query`` and ``meshscope history`` (docs/history.md).

``index add FOLDER…`` registers the reports at or under each folder in the index
(``--index PATH``, else ``$MESHSCOPE_INDEX``, else the user's cache folder); ``index list``,
``index refresh`` (re-read changed reports, drop deleted ones) and ``index remove``.
``query "SQL"`` answers one SELECT over every indexed report's tables. ``history RUNS…``
follows the quantities over a series of comparable runs, names the change points and gates
the newest run against its baseline: exit 1 when a ``--fail-if`` condition fails, 2 for bad
input, as ``compare``.
"""
from __future__ import annotations

import json
import pathlib

import click

from .common import fail

EXIT_GATE_FAILED = 1

_index_option = click.option(
    "--index", "index_path", default=None, type=click.Path(dir_okay=False),
    help="The index file (default: $MESHSCOPE_INDEX, else "
         "$XDG_CACHE_HOME/meshscope/index.sqlite, ~/.cache/meshscope/index.sqlite).")


def _open(index_path, create: bool = True):
    from meshscope.history.index import IndexError_, RunIndex

    try:
        return RunIndex(pathlib.Path(index_path) if index_path else None, create=create)
    except IndexError_ as e:
        fail(str(e))


@click.group("index")
def index_group():
    """The index of analysed runs: register, list, refresh, remove."""


@index_group.command("add")
@click.argument("folders", nargs=-1, required=True, type=click.Path())
@click.option("--label", default=None, help="A label for the runs added (e.g. 'nightly').")
@_index_option
def index_add(folders, label, index_path):
    """Register the reports at or under each FOLDER (a report, a run, a folder of runs)."""
    with _open(index_path) as idx:
        res = idx.add([pathlib.Path(f) for f in folders], label=label)
        path = idx.path
    for what, items in (("added", res.added), ("updated", res.updated),
                        ("re-pointed", res.repointed)):
        for x in items:
            click.echo(f"{what}: {x}")
    click.echo(f"{len(res.added)} added, {len(res.updated)} updated, {len(res.repointed)} "
               f"re-pointed, {len(res.unchanged)} unchanged — index {path}")
    if res.refused:
        for why in res.refused:
            click.echo(f"meshscope: error: {why}", err=True)
        raise SystemExit(2)


@index_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
@_index_option
def index_list(as_json, index_path):
    """The registered runs."""
    import dataclasses

    with _open(index_path, create=False) as idx:
        runs = idx.runs()
    if as_json:
        click.echo(json.dumps([{"id": r.id, "label": r.label,
                                **{k: v for k, v in dataclasses.asdict(r.entry).items()
                                   if k != "findings"}} for r in runs], indent=2))
        return
    for r in runs:
        e = r.entry
        st = f"{e.step_time_us / 1e3:.3f} ms" if e.step_time_us is not None else "-"
        click.echo(f"{r.id:>5}  {e.start_time or '-':<25} {e.model or '-':<8} "
                   f"{e.layout or '-':<12} {e.device or '-':<4} {st:>11}  "
                   f"{r.label or '':<10} {e.report_path}")


@index_group.command("refresh")
@_index_option
def index_refresh(index_path):
    """Re-read changed reports; drop those whose folder is gone."""
    with _open(index_path, create=False) as idx:
        updated, dropped = idx.refresh()
    for p in dropped:
        click.echo(f"dropped (gone): {p}")
    click.echo(f"{len(updated)} updated, {len(dropped)} dropped")


@index_group.command("remove")
@click.argument("reports", nargs=-1, required=True, type=click.Path())
@_index_option
def index_remove(reports, index_path):
    """Forget REPORTS (their folders are left as they are)."""
    with _open(index_path, create=False) as idx:
        n = idx.remove(reports)
    click.echo(f"{n} removed")


@click.command("query")
@click.argument("sql", required=False)
@click.option("--schema", "show_schema", is_flag=True,
              help="List the views and their columns instead (docs/history.md).")
@click.option("--format", "fmt", type=click.Choice(["text", "csv", "json"]), default="text",
              show_default=True, help="How the answer is printed.")
@_index_option
def query_cmd(sql, show_schema, fmt, index_path):
    """Answer one SQL SELECT over every indexed report (views runs, findings and one per
    report table: breakdown, bandwidth, throughput …)."""
    from meshscope.history.query import QueryError, query, schema

    with _open(index_path, create=False) as idx:
        if show_schema:
            for view, cols in schema(idx).items():
                click.echo(f"{view}: " + ", ".join(f"{c} {t}" for c, t in cols))
            return
        if not sql:
            fail("give the SQL to answer (or --schema)")
        try:
            df = query(sql, idx)
        except QueryError as e:
            fail(str(e))
    if fmt == "csv":
        click.echo(df.to_csv(index=False), nl=False)
    elif fmt == "json":
        click.echo(df.to_json(orient="records", indent=2))
    else:
        import pandas as pd

        with pd.option_context("display.max_rows", 200, "display.max_columns", 50,
                               "display.width", 200):
            click.echo(df.to_string(index=False) if len(df) else
                       f"(no rows; columns: {', '.join(df.columns)})")


@click.command("history")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--order", type=click.Choice(["start", "given"]), default="start",
              show_default=True, help="Order the runs by run.json's start time, or as given.")
@click.option("--quantity", "quantities", multiple=True, metavar="NAME",
              help="Follow only these quantities (repeatable; compare's names: step_time, "
                   "compute, exposed_comm.dp, peak_memory …).")
@click.option("--fail-if", "conditions", multiple=True, metavar="COND",
              help="A condition on the newest run against the series' baseline, e.g. "
                   "'step_time>+5%' (compare's words and noise rule). Exit 1 when it fails.")
@click.option("--baseline-runs", default=5, show_default=True, type=click.IntRange(1),
              help="The baseline: the median of this many comparable runs before the newest.")
@click.option("--allow-unmeasured", is_flag=True,
              help="A --fail-if condition on a quantity a run does not measure is reported "
                   "as not checked instead of refused (exit 2).")
@click.option("--across", multiple=True,
              type=click.Choice(["layout", "schedule", "model", "world", "versions"]),
              help="Let a series span this kind of difference (repeatable); by default a "
                   "series holds runs of one model, layout, schedule, world and versions.")
@click.option("--label", default=None,
              help="With no PATHS: the indexed runs of this label.")
@click.option("--json", "as_json", is_flag=True, help="Print the history as JSON.")
@_index_option
def history_cmd(paths, order, quantities, conditions, baseline_runs, allow_unmeasured, across,
                label, as_json, index_path):
    """Trends, change points and a gate over a series of comparable runs: PATHS (reports,
    runs, folders of them), else the indexed runs."""
    from meshscope.analysis.compare import gate
    from meshscope.analysis.compare import quantities as Q
    from meshscope.history.review import review, text, to_dict
    from meshscope.history.series import HistoryError, open_runs, ordered

    try:
        cond = [gate.parse(c) for c in conditions]
    except gate.GateError as e:
        fail(str(e))
    for q in quantities:
        if Q.unit_of(q) is None:
            fail(f"--quantity {q!r}: not a quantity; the quantities are: "
                 + ", ".join(Q.valid_names()))
    if not paths:
        with _open(index_path, create=False) as idx:
            paths = [r.entry.report_path for r in idx.runs()
                     if label is None or r.label == label]
        if not paths:
            fail("no runs: give PATHS, or index some (meshscope index add FOLDER)")
    try:
        sides = ordered(open_runs(paths), order)
        r = review(sides, quantities=list(quantities) or None, conditions=cond,
                   baseline_runs=baseline_runs, allow_unmeasured=allow_unmeasured,
                   across=tuple(across))
    except HistoryError as e:
        fail(str(e))
    except gate.GateError as e:
        fail(str(e))
    click.echo(json.dumps(to_dict(r), indent=2) if as_json else text(r))
    if any(v.failed for v in r.verdicts):
        raise SystemExit(EXIT_GATE_FAILED)


COMMANDS = (index_group, query_cmd, history_cmd)
