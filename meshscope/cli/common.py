"""What every ``meshscope`` command shares: how unusable input ends a command (one line on
stderr, exit code 2), and where the bundled sample runs are."""
from __future__ import annotations

import pathlib
import sys

import click

EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT):
    """End the command: ``meshscope: error: MESSAGE`` on stderr, exit ``code``."""
    from meshscope.analysis.report.printable import printable
    click.echo(f"meshscope: error: {printable(message)}", err=True)
    sys.exit(code)


def default_runs_dir() -> pathlib.Path:
    """The runs folder the dashboard serves when none is given: the repository's ``samples/``
    in a source checkout, else ``./runs`` (where ``meshscope demo`` writes)."""
    checkout = pathlib.Path(__file__).resolve().parents[2] / "samples"
    return checkout if checkout.is_dir() else pathlib.Path("runs")


def register(report: pathlib.Path, index_path: str | None = None) -> None:
    """A report just written into the index of runs (``meshscope.history.index``; the given
    index, else ``$MESHSCOPE_INDEX``, else the user's cache); one that cannot be registered is
    said on stderr and fails nothing."""
    from meshscope.history.index import register_report

    why = register_report(report, pathlib.Path(index_path) if index_path else None)
    if why:
        click.echo(f"meshscope: note: not registered in the index: {why}", err=True)
