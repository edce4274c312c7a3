"""``meshscope mcp`` (issue 50 item 4) through the SDK's own client (stdio_client +
ClientSession): the five tools are listed, each is called, and every number it returns is
found again where its citation says — summary.json's field, the table rows of the report's
parquet file reduced as it says, the plan row, the query's row. A path outside the folders
given is refused, and a run without a report is analysed into the server's own folder, not
the run's."""
from __future__ import annotations

import asyncio
import json
import shutil
import sys

import pandas as pd
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT))
from bench import history_synth  # noqa: E402

from meshscope.history.index import RunIndex  # noqa: E402

TOOLS = {"analyze", "compare", "history", "plan", "query"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Three analysed runs (the third with a slowed rank) and one not analysed, under one
    root; the server started once over stdio and every call made in one session."""
    base = tmp_path_factory.mktemp("mcp")
    root = base / "root"
    runs = []
    for i in (1, 2, 3):
        run = history_synth.make_run(root / "series" / f"run{i}", i, slow=i == 3,
                                     compute=False, memory=False, events_per_step=200)
        history_synth.analyse(run)
        runs.append(run)
    fresh = history_synth.make_run(root / "fresh", 4, slow=False, compute=False,
                                   memory=False, events_per_step=200)
    index = base / "index.sqlite"
    with RunIndex(index) as idx:
        idx.add([root / "series"])
    outside = base / "outside"
    shutil.copytree(runs[0], outside)
    (root / "link").symlink_to(outside)          # a symbolic link out of the root
    reports = base / "server-reports"
    calls = {
        "analyze": ("analyze", {"path": str(runs[0])}),
        "analyze_fresh": ("analyze", {"path": str(fresh)}),
        "compare": ("compare", {"before": str(runs[0]), "after": str(runs[2])}),
        "history": ("history", {"paths": [str(root / "series")]}),
        "query": ("query", {"sql": "SELECT id, report_path, step_time_us FROM runs "
                                   "ORDER BY id"}),
        "plan": ("plan", {"world": 2}),
        "outside": ("analyze", {"path": str(outside)}),
        "escape": ("analyze", {"path": str(root / ".." / "outside")}),
        "link": ("compare", {"before": str(runs[0]), "after": str(root / "link")}),
    }

    async def session():
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=sys.executable, cwd=str(ROOT),
            args=["-m", "meshscope", "mcp", "--root", str(root), "--index", str(index),
                  "--reports", str(reports)],
            env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                 "MESHSCOPE_INDEX": str(index)})
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                listed = await s.list_tools()
                out = {}
                for key, (tool, args) in calls.items():
                    res = await s.call_tool(tool, args)
                    text = res.content[0].text if res.content else ""
                    out[key] = (res.isError, text)
                return [t.name for t in listed.tools], out

    names, results = asyncio.run(asyncio.wait_for(session(), 240))
    return {"names": names, "results": results, "runs": runs, "fresh": fresh,
            "reports": reports, "root": root}


def _ok(served, key) -> dict:
    error, text = served["results"][key]
    assert not error, text
    return json.loads(text)


def _numbers(doc):
    """Every cited number in a tool's answer."""
    if isinstance(doc, dict):
        if "cite" in doc and "value" in doc:
            yield doc
        for v in doc.values():
            yield from _numbers(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _numbers(v)


def _read_cite(cite: dict):
    """The number a citation points at, read from the files (the test's own reading)."""
    report = cite["report"]
    if cite["table"] == "summary":
        doc = json.loads(open(f"{report}/summary.json").read())
        for part in cite["field"].split("."):
            doc = doc[part]
        if "keys" in cite:
            (row,) = [r for r in doc if all(r.get(k) == v for k, v in cite["keys"].items())]
            return row[cite["column"]]
        return doc
    df = pd.read_parquet(f"{report}/{cite['table']}.parquet")
    for k, v in cite["keys"].items():
        df = df[df[k] == v]
    assert len(df), cite
    col = df[cite["column"]].astype(float)
    if cite["reduce"] == "value":
        (x,) = col
        return x
    if cite["reduce"] == "max":
        return col.max()
    assert cite["reduce"] == "mean_of_step_means"
    return col.groupby(df["step"]).mean().mean()


def _check_report_cites(doc) -> int:
    n = 0
    for num in _numbers(doc):
        assert num["value"] == pytest.approx(_read_cite(num["cite"]), rel=1e-9), num
        n += 1
    return n


def test_the_five_tools_are_listed(served):
    assert set(served["names"]) == TOOLS


def test_analyze_cites_every_number(served):
    doc = _ok(served, "analyze")
    assert doc["report"] == str(served["runs"][0] / "report")
    assert "step_time_us" in doc["numbers"] and len(doc["ranks"]) == 2
    assert _check_report_cites(doc) >= 4 + 2 * 4
    for f in doc["findings"]:          # the findings' own citations name report tables
        for c in f["cites"]:
            assert set(c) == {"table", "rank", "step", "keys", "page"}


def test_a_run_without_report_is_analysed_outside_the_roots(served):
    doc = _ok(served, "analyze_fresh")
    assert doc["report"].startswith(str(served["reports"]))
    assert not (served["fresh"] / "report").exists()
    assert _check_report_cites(doc) >= 4


def test_compare_cites_both_sides(served):
    doc = _ok(served, "compare")
    q = {x["quantity"]: x for x in doc["quantities"]}
    assert {"step_time", "compute", "exposed_comm", "peak_memory"} <= set(q)
    assert q["step_time"]["after"]["value"] > q["step_time"]["before"]["value"]
    assert _check_report_cites(doc) >= 2 * len(q) - 2


def test_history_cites_each_run(served):
    doc = _ok(served, "history")
    assert doc["series"] == ["run1", "run2", "run3"]
    st = next(t for t in doc["trends"] if t["quantity"] == "step_time")
    assert [r["run"] for r in st["runs"]] == ["run1", "run2", "run3"]
    assert _check_report_cites(doc) >= 3 * len(doc["trends"]) - 3


def test_query_rows_hold_the_indexed_numbers(served):
    doc = _ok(served, "query")
    assert doc["columns"] == ["id", "report_path", "step_time_us"]
    assert len(doc["rows"]) == 3
    for i, row in enumerate(doc["rows"]):
        cite = row["step_time_us"]["cite"]
        assert cite["row"] == i and cite["column"] == "step_time_us"
        summary = json.loads(open(f"{row['report_path']}/summary.json").read())
        assert row["step_time_us"]["value"] == pytest.approx(summary["step_time_us"])


def test_plan_rows_are_the_planners(served):
    doc = _ok(served, "plan")
    assert doc["predicted"] is True and doc["rows"]
    cmd = doc["rows"][0]["peak_memory_bytes"]["cite"]["plan"].split()
    assert cmd[:2] == ["meshscope", "plan"]
    from click.testing import CliRunner

    from meshscope.cli import main

    ran = CliRunner().invoke(main, cmd[1:])                # the cited command, in-process
    assert ran.exit_code == 0, ran.output
    plan = json.loads(ran.stdout)
    rows = {r["name"]: r for r in plan["rows"]}
    for row in doc["rows"]:
        cited = row["peak_memory_bytes"]
        assert cited["cite"]["row"] == {"name": row["name"]}
        assert cited["value"] == rows[row["name"]]["peak_memory_bytes"]
        assert row["step_time_us"]["value"] == rows[row["name"]]["estimate"]["step_time_us"]


@pytest.mark.parametrize("key", ["outside", "escape", "link"])
def test_a_path_outside_the_roots_is_refused(served, key):
    error, text = served["results"][key]
    assert error and "outside the folders this server reads" in text
