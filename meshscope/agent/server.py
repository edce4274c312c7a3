"""The MCP server of ``meshscope mcp``: the ``Tools`` over stdio with the SDK's FastMCP.

A tool's bad input (``ToolError``) is the tool's error result, one line; the server goes on.
"""
from __future__ import annotations

import pathlib

from .tools import ToolError, Tools

INSTRUCTIONS = (
    "meshscope reads analysed training runs (reports) under the folders it was started with. "
    "Every number in a tool's answer is {value, unit, cite}: repeat a number only with its "
    "cite (the report folder and the summary field or table rows it was read from). "
    "Tools never write inside those folders.")


def build(tools: Tools):
    """The FastMCP server with the five tools."""
    from mcp.server.fastmcp import FastMCP
    from mcp.server.fastmcp.exceptions import ToolError as McpToolError

    server = FastMCP("meshscope", instructions=INSTRUCTIONS)

    def call(fn, *args):
        try:
            return fn(*args)
        except ToolError as e:
            raise McpToolError(str(e)) from None

    @server.tool()
    def analyze(path: str) -> dict:
        """The report of a run (a run folder, a folder of traces, or a report): step time,
        each rank's breakdown, findings — each number cited. A run without a report is
        analysed into the server's own folder, never into the run's."""
        return call(tools.analyze, path)

    @server.tool()
    def compare(before: str, after: str) -> dict:
        """Two runs' quantities (step time, breakdown parts, peak memory, tokens/s) side by
        side, each cited, with what keeps them from being like for like."""
        return call(tools.compare, before, after)

    @server.tool()
    def history(paths: list[str], order: str = "start") -> dict:
        """A series of comparable runs (reports, runs or folders of them): each quantity per
        run, cited, and the runs where a quantity changed beyond the noise."""
        return call(tools.history, paths, order)

    @server.tool()
    def query(sql: str) -> dict:
        """One SQL SELECT over the indexed reports under the server's folders (views runs,
        findings, and one per report table: breakdown, bandwidth, throughput …)."""
        return call(tools.query, sql)

    @server.tool()
    def plan(world: int, model: str = "tiny") -> dict:
        """The planner's predictions (memory, step time) for each layout of WORLD ranks of a
        model preset: predicted, not measured; each cites the plan row it came from."""
        return call(tools.plan, world, model)

    return server


def serve(roots: list[pathlib.Path], index_path: pathlib.Path | None,
          reports_dir: pathlib.Path) -> None:
    """Serve over stdio until the client closes it."""
    build(Tools(roots, index_path, reports_dir)).run("stdio")
