"""The meshscope dashboard (Dash): an overview page over a folder of runs.

``create_app(runs_dir)`` discovers the runs once; the page has a run picker (``run-select``;
``?run=ID`` in the address picks a run, so a view can be linked)
and, for the chosen run, a header (layout, world size, schedule, microbatches), any missing
ranks and analysis problems, the per-rank step breakdown (``breakdown-graph``) and the
pipeline bubble against the schedule's theory (``bubble-table``). All figures and tables are
built on the server from the written report (``dashboard.runs``).
"""
from __future__ import annotations

import pathlib

import plotly.graph_objects as go
from urllib.parse import parse_qs

from dash import Dash, Input, Output, dcc, html, no_update

from . import runs as R

PAGE = {"fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif", "maxWidth": "1100px",
        "margin": "0 auto", "padding": "16px 24px", "color": "#222"}
NOTE = {"color": "#555", "fontStyle": "italic"}
WARN = {"background": "#fff4e5", "border": "1px solid #f0b36a", "borderRadius": "4px",
        "padding": "8px 12px", "margin": "8px 0"}
CELL = {"padding": "4px 12px", "borderBottom": "1px solid #ddd", "textAlign": "right"}
HEAD = {**CELL, "borderBottom": "2px solid #888", "fontWeight": "600"}


def _option(entry: R.RunEntry) -> dict:
    label = entry.run_id if entry.analysed else f"{entry.run_id} (not analysed)"
    return {"label": label, "value": entry.run_id}


def _header(run_id: str, summary: dict) -> html.Div:
    """Run id and what the run was: layout, world size, schedule, microbatches, steps."""
    run = summary.get("run") or {}
    facts = [("layout", run.get("layout_str")), ("world size", run.get("world_size")),
             ("schedule", run.get("schedule")), ("microbatches", run.get("microbatches")),
             ("profiled steps", ", ".join(map(str, summary.get("steps", []))) or None),
             ("device", summary.get("device"))]
    items = [html.Span([html.B(f"{k}: "), str(v)], style={"marginRight": "20px"})
             for k, v in facts if v not in (None, "")]
    if not run:
        items.append(html.Span("no run.json: a plain folder of traces", style=NOTE))
    return html.Div([html.H2(run_id, style={"marginBottom": "4px"}), html.Div(items)],
                    id="run-header", style={"marginBottom": "16px"})


def _warnings(summary: dict) -> list:
    """Ranks the run should have but whose trace is missing, and problems met in analysis."""
    out = []
    if summary.get("missing_ranks"):
        out.append(html.Div([html.B("Missing ranks: "),
                             ", ".join(map(str, summary["missing_ranks"]))], style=WARN))
    if summary.get("problems"):
        out.append(html.Div([html.B("Problems during analysis:"),
                             html.Ul([html.Li(p) for p in summary["problems"]])], style=WARN))
    return out


def breakdown_figure(means) -> go.Figure:
    """One stacked bar per rank: mean time per profiled step in each segment of ``SEGMENTS``."""
    x = [f"rank {r}" for r in means.index]
    fig = go.Figure()
    for label, _, _, colour in R.SEGMENTS:
        extra = {}
        if label == "exposed comm":
            extra["customdata"] = [
                "<br>".join(f"  {d}: {row[f'exposed {d}']:.2f} ms" for d in R.EXPOSED_DIMS
                            if row[f"exposed {d}"] > 0) or "  none"
                for _, row in means.iterrows()]
            extra["hovertemplate"] = ("%{x}<br>exposed comm: %{y:.2f} ms<br>%{customdata}"
                                      "<extra></extra>")
        else:
            extra["hovertemplate"] = f"%{{x}}<br>{label}: %{{y:.2f}} ms<extra></extra>"
        fig.add_bar(name=label, x=x, y=means[label].round(4).tolist(), marker_color=colour,
                    **extra)
    fig.update_layout(barmode="stack", template="plotly_white", height=420,
                      margin={"l": 60, "r": 20, "t": 40, "b": 40},
                      title="Step breakdown per rank (mean over profiled steps)",
                      yaxis_title="ms per step", xaxis={"type": "category"},
                      legend={"traceorder": "reversed"})  # as stacked
    return fig


def bubble_section(rows: list[dict]) -> html.Div:
    """Per pipeline stage: measured bubble fraction against the schedule's theory."""
    if not rows:
        return html.Div(html.P("No pipeline parallelism in this run: no bubble to compare "
                               "with theory.", id="bubble-none", style=NOTE))
    cols = ["stage", "ranks", "measured bubble", "theory", "measured / theory"]
    body = [html.Tr([html.Td(r["stage"], style=CELL),
                     html.Td(", ".join(map(str, r["ranks"])), style=CELL),
                     html.Td(f"{100 * r['measured']:.1f} %", style=CELL),
                     html.Td(f"{100 * r['theory']:.1f} %", style=CELL),
                     html.Td("—" if r["ratio"] is None else f"{r['ratio']:.2f}×", style=CELL)])
            for r in rows]
    return html.Div([
        html.H3("Pipeline bubble vs theory"),
        html.Table([html.Thead(html.Tr([html.Th(c, style=HEAD) for c in cols])),
                    html.Tbody(body)], id="bubble-table",
                   style={"borderCollapse": "collapse", "fontVariantNumeric": "tabular-nums"}),
        html.P("Measured: mean over the stage's ranks and profiled steps of bubble time / "
               "pipeline window. Theory: the schedule's idle fraction, e.g. (p−1)/(m+p−1) "
               "for 1F1B.", style={**NOTE, "fontSize": "0.9em"})])


def overview(runs: dict[str, R.RunEntry], run_id: str | None) -> list:
    """The page body for ``run_id``; a message instead when it is unknown, not analysed or its
    report cannot be read."""
    entry = runs.get(run_id) if isinstance(run_id, str) else None
    if entry is None:
        return [html.P(f"Unknown run {run_id!r}: pick one from the list." if run_id else
                       "No run selected.", id="run-message", style=NOTE)]
    if not entry.analysed:
        return [html.H2(entry.run_id),
                html.P(["This run has not been analysed yet: run ",
                        html.Code(f"meshscope analyze {entry.run_id}"), " in the runs folder."],
                       id="run-message", style=NOTE)]
    try:
        report = R.load(entry)
        means = R.rank_means_ms(report["breakdown"])
        rows = R.stage_rows(report["bubbles"])
    except Exception as e:  # an unreadable report must not take the page down
        return [html.H2(entry.run_id),
                html.P(f"Could not read this run's report: {type(e).__name__}: {e}",
                       id="run-message", style=WARN)]
    summary = report["summary"]
    graph = (dcc.Graph(id="breakdown-graph", figure=breakdown_figure(means),
                       config={"displaylogo": False}) if not means.empty else
             html.P("The report has no profiled steps.", id="run-message", style=NOTE))
    return [_header(entry.run_id, summary), *_warnings(summary), graph, bubble_section(rows)]


def create_app(runs_dir: pathlib.Path) -> Dash:
    """The Dash app over the runs found in ``runs_dir`` now (see ``dashboard.runs.discover``)."""
    runs_dir = pathlib.Path(runs_dir)
    runs = R.discover(runs_dir)
    app = Dash(__name__, title="meshscope")
    options = [_option(e) for e in runs.values()]
    picker = (dcc.Dropdown(id="run-select", options=options, value=options[0]["value"],
                           clearable=False, style={"width": "420px"}) if options else
              html.P(f"No runs in {runs_dir}: a run is a folder with run.json "
                     "(analysed ones have report/summary.json).", style=NOTE))
    app.layout = html.Div(style=PAGE, children=[
        html.H1("meshscope", style={"marginBottom": "4px"}),
        html.Div(f"{len(runs)} run(s) in {runs_dir}", style={"color": "#666"}),
        html.Div(picker, style={"margin": "12px 0"}),
        dcc.Loading(html.Div(id="run-view"), type="dot"),
        dcc.Location(id="url", refresh=False)])

    if options:
        @app.callback(Output("run-view", "children"), Input("run-select", "value"))
        def show_run(run_id):
            return overview(runs, run_id)

        @app.callback(Output("run-select", "value"), Input("url", "search"))
        def pick_from_url(search):
            """``?run=ID`` in the address picks that run (a link to share); an unknown id
            leaves the default."""
            chosen = parse_qs((search or "").lstrip("?")).get("run", [None])[0]
            return chosen if chosen in runs else no_update
    return app
