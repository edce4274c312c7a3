"""The agent tools as plain functions (``server.py`` serves them over MCP).

``Tools(roots, index, reports_dir)``: every path a tool is given must lie inside one of the
``roots`` (resolved: a symbolic link out of them is refused), and nothing inside them is
written — a run that has no report yet is analysed into ``reports_dir``, the server's own
folder outside the roots. Each tool returns a JSON-able dict whose numbers are cited
(``cited.py``); a bad input raises ``ToolError`` with one line naming it.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys
from typing import Any

from meshscope.analysis.compare import alike
from meshscope.analysis.compare.sides import CompareError, Side, is_report_dir, open_side
from meshscope.collectors.run_dir import ReportDir
from meshscope.history import review as history_review
from meshscope.history.index import IndexError_, RunIndex
from meshscope.history.query import QueryError, query
from meshscope.history.series import HistoryError, open_runs, ordered

from . import cited as C


class ToolError(ValueError):
    """A tool's input that cannot be used; the message says which and why."""


def _plain(x):
    """A JSON-able copy of a value read from a table (numpy numbers, NaN → None)."""
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float) and x != x:
        return None
    return x


@dataclasses.dataclass
class Tools:
    roots: list[pathlib.Path]
    index_path: pathlib.Path | None
    reports_dir: pathlib.Path

    def __post_init__(self) -> None:
        self.roots = [pathlib.Path(r).resolve() for r in self.roots]
        if not self.roots:
            raise ToolError("give at least one folder the tools may read (--root)")
        for r in self.roots:
            if not r.is_dir():
                raise ToolError(f"{r}: not a folder")
        self.reports_dir = pathlib.Path(self.reports_dir).resolve()
        if self._within(self.reports_dir):
            raise ToolError(f"{self.reports_dir}: the server's reports folder must lie outside "
                            f"the folders it reads (it never writes there)")

    def _within(self, p: pathlib.Path) -> bool:
        return any(p == r or p.is_relative_to(r) for r in self.roots)

    def path(self, given: str) -> pathlib.Path:
        """``given`` resolved, refused unless inside a root."""
        p = pathlib.Path(given).expanduser()
        p = (p if p.is_absolute() else self.roots[0] / p).resolve()
        if not self._within(p):
            raise ToolError(f"{given}: outside the folders this server reads "
                            f"({', '.join(map(str, self.roots))})")
        if not p.exists():
            raise ToolError(f"{given}: no such file or directory")
        return p

    def _side(self, given: str) -> Side:
        p = self.path(given)
        try:
            if is_report_dir(p):
                return open_side(p)
            own = ReportDir.of_run(p).path
            if is_report_dir(own):
                return open_side(own)
            return open_side(p, reports_dir=self.reports_dir)
        except CompareError as e:
            raise ToolError(str(e)) from None

    # -- the tools -------------------------------------------------------------------------
    def analyze(self, path: str) -> dict:
        s = self._side(path)
        rep, typed = s.report_dir, s.summary
        numbers = {}
        for field, value, unit in (("step_time_us", typed.step_time_us, "us"),
                                   ("window_us", typed.window_us, "us"),
                                   ("cross_rank.noise_us", typed.cross_rank.noise_us, "us"),
                                   ("throughput.tokens_per_s", typed.throughput.tokens_per_s,
                                    "per_s")):
            if value is not None:
                numbers[field] = C.summary_field(rep, field, value, unit)
        ranks = []
        for m in typed.per_rank_mean:
            ranks.append({"rank": m.rank, **{
                col: C.summary_field(rep, "per_rank_mean", getattr(m, col), "us",
                                     {"rank": m.rank}, col)
                for col in ("window_us", "compute_us", "exposed_comm_us", "idle_us")
                if getattr(m, col) is not None}})
        findings = []
        for f in typed.findings:
            item: dict[str, Any] = {"id": f.id.value, "severity": f.severity, "title": f.title,
                    "cites": [dataclasses.asdict(c) for c in f.cites]}
            if f.cost_us is not None:
                item["cost_us"] = C.summary_field(rep, "findings", f.cost_us, "us",
                                                  {"id": f.id.value, "title": f.title},
                                                  "cost_us")
            findings.append(item)
        return {"report": str(rep), "step_time_source": typed.step_time_source,
                "trust": typed.trust.verdict if typed.trust else None,
                "numbers": numbers, "ranks": ranks, "findings": findings}

    def compare(self, before: str, after: str) -> dict:
        a, b = self._side(before), self._side(after)
        rank_match = "id" if set(a.ranks) & set(b.ranks) else \
            ("position" if len(a.ranks) == len(b.ranks) else "none")
        out = []
        for name in C.CITED_QUANTITIES:
            x, y = C.quantity(a, name), C.quantity(b, name)
            if x is None and y is None:
                continue
            out.append({"quantity": name, "before": x, "after": y})
        return {"before": str(a.report_dir), "after": str(b.report_dir),
                "not_like_for_like": alike.differences(a, b, rank_match),
                "quantities": out}

    def history(self, paths: list[str], order: str = "start") -> dict:
        try:
            sides = ordered(open_runs([self.path(p) for p in paths]), order)
            r = history_review.review(sides, quantities=[
                q for q in C.CITED_QUANTITIES], explain=False)
        except HistoryError as e:
            raise ToolError(str(e)) from None
        runs = r.series.runs
        trends = []
        for t in r.trends:
            values = [C.quantity(s, t.name) for s in runs]
            trends.append({"quantity": t.name, "unit": t.unit,
                           "runs": [{"run": s.name, **(v or {"value": None})}
                                    for s, v in zip(runs, values)]})
        changes = [{"run": s.after_run, "position": s.at, "previous_run": s.before_run,
                    "quantities": [c.quantity for c in s.changes],
                    "note": "the levels are the means of the cited runs either side"}
                   for s in r.shifts]
        return {"series": [s.name for s in runs],
                "kept_apart": [{"run": n, "why": w} for n, w in r.series.kept_apart],
                "trends": trends, "change_points": changes}

    def query(self, sql: str) -> dict:
        try:
            with RunIndex(self.index_path, create=False) as idx:
                df = query(sql, idx, within=self.roots)
        except (IndexError_, QueryError) as e:
            raise ToolError(str(e)) from None
        rows = []
        for i, rec in enumerate(df.to_dict(orient="records")):
            row = {}
            for col, v in rec.items():
                v = _plain(v)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[col] = C.cited(v, None, {"query": sql, "row": i, "column": col})
                else:
                    row[col] = v
            rows.append(row)
        return {"columns": list(df.columns), "rows": rows}

    def plan(self, world: int, model: str = "tiny") -> dict:
        args = ["plan", "--world", str(int(world)), "--model", model, "--json"]
        proc = subprocess.run([sys.executable, "-m", "meshscope", *args], capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise ToolError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                            else f"meshscope plan exited {proc.returncode}")
        doc = json.loads(proc.stdout)
        rows = []
        for r in doc.get("rows", []):
            est = r.get("estimate") or {}
            cite = {"plan": " ".join(["meshscope", *args]), "row": {"name": r["name"]}}
            item = {"name": r["name"], "layout": r["candidate"]["layout"], "fits": r.get("fits")}
            if r.get("peak_memory_bytes") is not None:
                item["peak_memory_bytes"] = C.cited(r["peak_memory_bytes"], "bytes",
                                                    {**cite, "field": "peak_memory_bytes"})
            if est.get("step_time_us") is not None:
                item["step_time_us"] = C.cited(est["step_time_us"], "us",
                                               {**cite, "field": "estimate.step_time_us"})
            rows.append(item)
        return {"predicted": True, "rows": rows, "warnings": doc.get("warnings", [])}
