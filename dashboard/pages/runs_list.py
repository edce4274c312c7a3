"""Runs: every run found under the runs folder, one row each — sortable and filterable — with
its layout, ranks, schedule, step time, tokens/s, MFU, status, date and top finding; ticking
several rows and "compare selected" opens the compare page with them. Sweep folders are listed
with a link that compares all their runs.

The figures come from each run's summary.json as written, read through
``analysis/report/reader.py`` (the headline ``step_time_us`` and its source — the step timer
where the run has one, the column "step time from" says which —, ``throughput``'s tokens/s and
MFU beside the timer's step time only), else from run.json alone for a run not analysed yet.
"""
from __future__ import annotations

from dash import Input, Output, State, dash_table, dcc, html

from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.run_json import read_run_info

from meshscope.analysis.report import reader

from ..data import read_summary
from ..runs import RunIndex
from ..sections import NOTE, Link, Note, Section, clip
from ..state import ViewState

COLUMNS = [("run", "run"), ("sweep", "sweep"), ("layout", "layout"), ("ranks", "ranks"),
           ("schedule", "schedule"), ("step_ms", "step time (ms)"),
           ("step_source", "step time from"),
           ("tokens_per_s", "tokens/s"), ("mfu_pct", "MFU %"), ("status", "status"),
           ("date", "date"), ("top_finding", "top finding")]


def _num(x, digits):
    return round(float(x), digits) if isinstance(x, (int, float)) and x == x else None


def run_row(entry) -> dict:
    """The runs-list row of one run (summary.json, else run.json)."""
    summary = read_summary(entry) if entry.analysed else None
    label = "".join("\\" + c if c in "\\`*_[]()<>#!" else c for c in entry.run_id)
    row = {"id": entry.run_id,
           "run": f"[{label}](/overview{ViewState(page='overview', runs=(entry.run_id,)).query()})",
           "sweep": entry.sweep or "", "status": "not analysed" if not entry.analysed else ""}
    layout = schedule = world = None        # run.json's facts, through the typed readers
    if summary is not None:
        typed = reader.read_summary(summary)
        layout, schedule, world = (typed.run_fact("layout_str"), typed.run_fact("schedule"),
                                   typed.run_fact("world_size"))
        st = typed.step_time
        row.update(step_ms=_num(st.ms, 2), step_source=st.short if st.us is not None else "",
                   tokens_per_s=_num(typed.tokens_per_s, 0), mfu_pct=_num(typed.mfu_pct, 2),
                   ranks=len(typed.ranks) or None,
                   top_finding=clip(typed.findings[0].title, 120) if typed.findings
                   else "none", date=(typed.generated or "")[:10])
        row["status"] = typed.status or "analysed"
    elif entry.has_run_json:
        try:
            info = read_run_info(entry.path)
        except RunDirError:
            info = None
        if info is not None:
            layout, schedule, world = info.layout_str, info.schedule, info.world_size
            row.update(ranks=info.world_size, date=(info.start_time or "")[:10])
    row.update(layout=layout or ("traces" if not entry.has_run_json else ""),
               schedule=schedule or "")
    row.setdefault("ranks", world)
    return row


def sections(index: RunIndex, state: ViewState) -> list[Section]:
    if not index.runs:
        return [Section("Runs", [Note("runs-none", "No runs in this folder: a run is a "
                                      "folder with run.json or with Kineto traces "
                                      "(`meshscope run`, `meshscope analyze`).")])]
    out = []
    if index.sweeps:
        links = [Link(f"sweep-{i}", f"compare the {len(runs)} runs of {sweep}",
                      ViewState(page="compare", sweep=sweep).href())
                 for i, (sweep, runs) in enumerate(sorted(index.sweeps.items()))]
        out.append(Section("Sweeps", links))
    return out


def controls() -> list:
    """The runs table (a sortable, filterable DataTable) and the compare link."""
    return [html.H3("Runs"),
            html.P("Click a run to open it; tick two or more to compare them. Sort with the "
                   "arrows, filter by typing in the row under the headers.", style=NOTE),
            dash_table.DataTable(
                id="runs-table", columns=[{"name": label, "id": key,
                                           "presentation": "markdown"} if key == "run" else
                                          {"name": label, "id": key,
                                           "type": "numeric" if key in (
                                               "ranks", "step_ms", "tokens_per_s", "mfu_pct")
                                           else "text"} for key, label in COLUMNS],
                data=[], sort_action="native", filter_action="native",
                row_selectable="multi", selected_rows=[], page_action="none",
                markdown_options={"link_target": "_self"},
                style_cell={"fontFamily": "inherit", "padding": "4px 8px",
                            "textAlign": "left", "maxWidth": "320px", "whiteSpace": "normal"},
                style_header={"fontWeight": "600"}),
            html.Div(dcc.Link("compare selected runs", href="/compare", id="compare-link"),
                     style={"margin": "10px 0"}),
            dcc.Store(id="runs-loaded", data=True)]


def register(app) -> None:
    index: RunIndex = app.server.config["MESHSCOPE_INDEX"]

    @app.callback(Output("runs-table", "data"), Input("runs-loaded", "data"))
    def fill(_):
        return [run_row(e) for e in index.runs.values()]

    @app.callback(Output("compare-link", "href"), Input("runs-table", "selected_rows"),
                  State("runs-table", "data"))
    def compare_link(selected, data):
        ids = [data[i]["id"] for i in selected or [] if 0 <= i < len(data or [])]
        return ViewState(page="compare", runs=tuple(ids)).href()
