"""``meshscope mcp``: the agent server over the Model Context Protocol (docs/agents.md)."""
from __future__ import annotations

import pathlib

import click

from .common import fail


@click.command("mcp")
@click.option("--root", "roots", multiple=True, required=True,
              type=click.Path(exists=True, file_okay=False),
              help="A folder the tools may read (repeatable); no path outside these is read, "
                   "nothing inside them is written.")
@click.option("--index", "index_path", default=None, type=click.Path(dir_okay=False),
              help="The index the query tool reads (default: $MESHSCOPE_INDEX, else "
                   "~/.cache/meshscope/index.sqlite).")
@click.option("--reports", "reports_dir", default=None, type=click.Path(file_okay=False),
              help="Where runs without a report are analysed to (default: "
                   "~/.cache/meshscope/agent-reports); must lie outside every --root.")
def mcp_cmd(roots, index_path, reports_dir):
    """Serve the agent tools (analyze, compare, history, plan, query) over MCP on stdio."""
    from meshscope.agent.server import serve
    from meshscope.agent.tools import ToolError
    from meshscope.history.index import default_path

    reports = pathlib.Path(reports_dir) if reports_dir else \
        default_path().parent / "agent-reports"
    try:
        serve([pathlib.Path(r) for r in roots],
              pathlib.Path(index_path) if index_path else None, reports)
    except ToolError as e:
        fail(str(e))


COMMANDS = (mcp_cmd,)
