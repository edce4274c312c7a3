"""The meshscope dashboard: a multi-page Dash app over a folder of runs.

``create_app(runs_dir)`` builds it. Every view is a URL (``dashboard.state``): the page is the
path, the run(s), rank, step and mesh colouring are the query string, so copying the address
shares the view. One callback renders the page for the URL; the step, rank and colour pickers
only rewrite the URL. The navigation bar's links keep the query string, so moving between pages
keeps the selected run.

Pages (``dashboard.pages``): runs list (``/``), overview, GPU (``/gpu``: idle causes,
step categories, kernels, GEMMs, synchronisations), memory (``/memory``: peaks per rank,
allocated and reserved over time, what is live at the peak, snapshots), pipeline, communication, stragglers,
timeline, health, compare, history (``/history``: a series of comparable runs, its trends and
change points, ``meshscope.history``). Each is built on the server from the run's written
report (``dashboard.data``) into sections (``dashboard.sections``): the browser receives
figures of aggregated data only. A run that has not been analysed yet is analysed when it is
first opened (``dashboard.jobs``), the page showing the progress. Pages are built in a pool of
their own (``dashboard.page_builds``): a request waits for its page at most ``page_timeout_s``,
then the page says it is still being built and asks again, so an enormous report never holds a
server thread for ever. A report that cannot be read
gives "report unreadable, run `meshscope analyze --no-cache RUN`"; the details go to the server log.

Two downloads, by run id: ``/export/html?run=ID`` (the static report, ``static_report``) and
``/export/perfetto?run=ID`` (the aligned timeline as a Chrome/Perfetto trace).
"""
from __future__ import annotations

import io
import logging
import pathlib
import tempfile

# Dash serves a component library's scripts only when it was imported before the app
# answers (never inside a callback): the compare page's grid (sections.Grid).
import dash_ag_grid  # noqa: F401
from dash import Dash, Input, Output, State, callback_context, dcc, html, no_update

from meshscope.analysis.report import reader
from meshscope.collectors import run_dir as rd

from . import sections as S
from . import state as st
from .data import ReportUnreadable, open_report, read_summary
from .jobs import Analyses, Limits
from .page_builds import PageBuilds, Pending
from .pages import communication, compare, device, health, history, memory, overview, \
    pipeline, runs_list, stragglers, timeline
from .pages.common import PageContext, evidence_section, many_ranks, pick_step, rank_label
from .runs import RunIndex

log = logging.getLogger("meshscope.dashboard")

PAGE = {"fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif", "maxWidth": "1200px",
        "margin": "0 auto", "padding": "8px 24px 40px", "color": "#222"}
NAV = {"display": "flex", "gap": "18px", "alignItems": "baseline", "flexWrap": "wrap",
       "borderBottom": "1px solid #ddd", "padding": "8px 0", "marginBottom": "12px"}
BUILDERS = {"overview": overview.sections, "gpu": device.sections,
            "memory": memory.sections, "pipeline": pipeline.sections,
            "communication": communication.sections, "stragglers": stragglers.sections,
            "timeline": timeline.sections, "health": health.sections}
# Which pickers each page offers.
PICKERS = {"pipeline": ("step", "rank"), "timeline": ("step", "rank"),
           "overview": ("color", "rank"), "gpu": ("rank",), "memory": ("rank",),
           "stragglers": ("rank",), "communication": ("rank",)}
# Pages whose rank picker shows only for many ranks (``common.many_ranks``): there it reaches
# the ranks their figures leave out (the top ranks and the distribution, docs/dashboard.md).
RANK_PICKER_IF_MANY = ("overview", "stragglers", "communication")


def nav_pages(index: RunIndex, state: st.ViewState) -> tuple[str, ...]:
    """The pages the navigation bar links to for ``state``: every page, but the GPU page only
    when the selected run's summary says its device is a GPU (``Summary.device``, read from
    summary.json alone: cheap, and never a page build) — a CPU run's GPU page would only say it
    has nothing to show — and the Memory page only when it has memory to show (a device
    recorded with memory events, or a snapshot: ``Summary.memory``). ``/gpu`` and
    ``/memory`` themselves still answer, with that explanation."""
    entry = index.get(state.run) if state.run else None
    gpu, mem = _nav_facts(entry) if entry is not None and entry.analysed else (False, False)
    return ("runs",) + tuple(p for p in st.PAGES
                             if (p != "gpu" or gpu) and (p != "memory" or mem))


# (summary.json's path, mtime, size) → (GPU run, memory to show): a 1,024-rank summary.json
# is megabytes, and decoding it on every page request cost most of a second (issue 51).
_NAV_FACTS: dict[tuple, tuple[bool, bool]] = {}


def _nav_facts(entry) -> tuple[bool, bool]:
    """Whether the run's report says GPU, and whether it has memory to show: read from
    summary.json once per version of the file."""
    path = rd.ReportDir(entry.report_dir).summary
    try:
        st_ = path.stat()
    except OSError:
        return False, False
    key = (str(path), st_.st_mtime_ns, st_.st_size)
    hit = _NAV_FACTS.get(key)
    if hit is not None:
        return hit
    doc = read_summary(entry)
    typed = reader.read_summary(doc) if doc is not None else None
    facts = (typed is not None and typed.device == "gpu",
             typed is not None and bool(typed.memory.devices or typed.memory.snapshots))
    if len(_NAV_FACTS) > 256:
        _NAV_FACTS.clear()
    _NAV_FACTS[key] = facts
    return facts


def _nav(state: st.ViewState, pages: tuple[str, ...]) -> list:
    links = [dcc.Link("meshscope", href=state.href("runs"), id="nav-home",
                      style={"fontWeight": "700", "fontSize": "1.3em", "color": "#222",
                             "textDecoration": "none"})]
    for page in pages:
        active = page == state.page
        links.append(dcc.Link(st.TITLES[page], href=state.href(page), id=f"nav-{page}",
                              style={"color": "#222" if active else "#1f5fa8",
                                     "fontWeight": "600" if active else "400",
                                     "textDecoration": "none"}))
    return links


def _message(text: str, warn: bool = False) -> list:
    return [html.P(text, id="run-message", style=S.WARN if warn else S.NOTE)]


def _unreadable(run_id: str) -> list:
    return _message(f"Report unreadable — run `meshscope analyze --no-cache {run_id}` to "
                    f"rewrite it (the server log has the details).", warn=True)


def _pickers(ctx: PageContext) -> list:
    rep, state = ctx.report, ctx.state
    out = []
    for kind in PICKERS.get(state.page, ()):
        if kind == "step" and rep.steps:
            out.append(html.Label(["step ", dcc.Dropdown(
                id="step-select", options=[{"label": str(s), "value": s} for s in rep.steps],
                value=pick_step(rep, state.step), clearable=False,
                style={"width": "120px", "display": "inline-block", "verticalAlign": "middle"})],
                style={"marginRight": "24px"}))
        if kind == "rank" and len(rep.ranks) > 1 and (
                device.is_gpu(rep) if state.page == "gpu" else
                memory.has_memory(rep) if state.page == "memory" else
                many_ranks(rep) if state.page in RANK_PICKER_IF_MANY else True):
            focus = memory.focus_rank(ctx) if state.page == "memory" else \
                device.focus_rank(ctx)
            out.append(html.Label(["rank ", dcc.Dropdown(
                id="rank-select", options=rank_options(rep, focus), value=focus,
                clearable=False, placeholder="type a rank",
                style={"width": "200px", "display": "inline-block", "verticalAlign": "middle"})],
                style={"marginRight": "24px"}))
        if kind == "color":
            opts = [{"label": v, "value": k} for k, v in overview.COLOR_CHOICES.items()
                    if overview.metric(ctx, k)]
            if opts:
                out.append(html.Label(["colour the mesh by ", dcc.Dropdown(
                    id="color-select", options=opts, value=overview.color_key(ctx),
                    clearable=False, style={"width": "260px", "display": "inline-block",
                                            "verticalAlign": "middle"})]))
    return [html.Div(out, id="pickers", style={"margin": "6px 0 10px"})] if out else []


MAX_RANK_OPTIONS = 48     # the rank picker's list; the others are found by typing


def rank_options(rep, focus: int | None, typed: str | None = None) -> list[dict]:
    """The rank picker's choices: every rank, but of more than ``MAX_RANK_OPTIONS`` ranks
    those whose label holds ``typed`` (the picker's search text, any case; none typed: the
    first ranks) — at most ``MAX_RANK_OPTIONS``, and the focused rank always, so the picker
    can show it. The browser's dropdown indexed every option it was given on every page load
    (1,024 options: 0.3–0.5 s of script, docs/benchmarks.md); the search asks the server
    (``_register_rank_search``), so typing reaches every rank."""
    ranks = rep.ranks
    if len(ranks) > MAX_RANK_OPTIONS:
        text = (typed or "").strip().lower()
        hit = [r for r in ranks if text in rank_label(r, rep).lower()] if text else ranks
        ranks = hit[:MAX_RANK_OPTIONS]
        if focus is not None and focus in rep.ranks and focus not in ranks:
            ranks = [focus, *ranks]
    return [{"label": rank_label(r, rep), "value": r} for r in ranks]


def _title(ctx: PageContext) -> list:
    rep, state = ctx.report, ctx.state
    bits = [html.H2([st.TITLES[state.page], " · ", html.Span(rep.run_id, id="run-title")],
                    style={"margin": "6px 0"})]
    bare = state.query(rank=None, step=None, color=None)
    extra = [html.A("static HTML report", href=f"/export/html{bare}", id="export-html",
                    style={"marginRight": "16px"})]
    if state.rank is not None and state.rank in rep.ranks:
        extra.append(html.Span(f"focus: {rank_label(state.rank, rep)}", id="rank-focus"))
    bits.append(html.Div(extra, style={"fontSize": "0.9em"}))
    return bits + S.to_dash([evidence_section(rep)])


def _building(run_id: str, report_dir: pathlib.Path, elapsed_s: float) -> list:
    """What a page still being built shows (``page_builds.Pending``); it polls again."""
    try:
        size = sum(f.stat().st_size for f in rd.ReportDir(report_dir).tables())
    except OSError:
        size = 0
    return [html.H2(run_id),
            html.P(f"This page is still being built ({elapsed_s:.0f} s so far): this run's "
                   f"report is large ({size / (1 << 20):.0f} MiB of tables). It will show here "
                   f"when it is ready.", id="page-building", style=S.NOTE)]


def create_app(runs_dir: pathlib.Path, limits: Limits | None = None,
               page_timeout_s: float = 20.0) -> Dash:
    """The Dash app over the runs under ``runs_dir`` (module docstring); ``limits``: what each
    analysis it starts may use (``dashboard.jobs.Limits``); ``page_timeout_s``: how long a
    request waits for its page to be built (``dashboard.page_builds``)."""
    index = RunIndex(pathlib.Path(runs_dir))
    analyses = Analyses(index.root, limits)
    builds = PageBuilds(page_timeout_s, workers=2)
    app = Dash(__name__, title="meshscope", suppress_callback_exceptions=True,
               update_title=None, serve_locally=True)
    app.layout = html.Div(style=PAGE, children=[
        dcc.Location(id="url", refresh=False),
        html.Nav(id="nav", style=NAV),
        dcc.Loading(html.Div(id="page"), type="dot", delay_show=400),
        dcc.Interval(id="poll", interval=1000, disabled=True)])
    app.server.config["MESHSCOPE_INDEX"] = index
    app.server.config["MESHSCOPE_ANALYSES"] = analyses
    app.server.config["MESHSCOPE_PAGE_BUILDS"] = builds
    pages = _Pages(index, analyses, builds)

    @app.callback(Output("nav", "children"), Output("page", "children"),
                  Output("poll", "disabled"),
                  Input("url", "pathname"), Input("url", "search"), Input("poll", "n_intervals"))
    def show(pathname, search, _n):
        state = st.parse(pathname, search)
        body, polling = pages.render(state)
        return _nav(state, nav_pages(index, state)), body, not polling

    _register_url_controls(app)
    _register_rank_search(app, index)
    runs_list.register(app)
    compare.register(app)
    history.register(app)
    _register_exports(app, index, analyses)
    from .errors import install_error_page
    install_error_page(app.server)
    return app


class _Pages:
    """What the page area shows for a view (``render``): the Runs list, a comparison, a run's
    page, or what stands in for it — a run being analysed, a page still being built, a report
    that cannot be read, an error in meshscope."""

    def __init__(self, index: RunIndex, analyses: Analyses, builds: PageBuilds):
        self.index, self.analyses, self.builds = index, analyses, builds

    def render(self, state: st.ViewState) -> tuple[list, bool]:
        """The page body for ``state`` and whether to keep polling (an analysis running)."""
        if state.page == "runs":
            self.index.refresh()
            return S.to_dash(runs_list.sections(self.index, state)) + runs_list.controls(), False
        if state.page in ("compare", "history"):
            page = compare if state.page == "compare" else history
            built = self.builds.build(state, lambda: page.render(self.index, state))
            if isinstance(built, Pending):
                return [html.P(f"This {'comparison' if page is compare else 'history'} is still "
                               f"being built ({built.elapsed_s:.0f} s "
                               f"so far).", id="page-building", style=S.NOTE)], True
            return built, False
        entry = self.index.get(state.run)
        if entry is None:
            if not state.run:
                return _message("No run selected: pick one on the Runs page."), False
            return _message("Unknown run: there is no run of that name in this dashboard's "
                            "runs folder. Pick one on the Runs page.", warn=True), False
        if not entry.analysed:
            return self._analysing(entry)
        return self._run_page(entry, state)

    def _analysing(self, entry) -> tuple[list, bool]:
        """A run not analysed yet: its analysis started, and what it is doing (polling on),
        or why it failed (polling off)."""
        self.analyses.start(entry)
        status = self.analyses.status(entry.run_id)
        if status is not None and status.state == "failed":
            return [html.H2(entry.run_id)] + _message(status.text, warn=True), False
        text = status.text if status else "Analysing…"
        return [html.H2(entry.run_id),
                html.P(["This run had not been analysed yet: ",
                        html.Code(f"meshscope analyze {entry.run_id}"),
                        " is running now and the page will show the report when it is "
                        "done."], style=S.NOTE),
                html.P(text, id="analysis-progress")], True

    def _run_page(self, entry, state: st.ViewState) -> tuple[list, bool]:
        """A page of an analysed run, built in the page builds' pool (``page_builds``)."""
        def page() -> list:
            report = open_report(entry)
            ctx = PageContext(report, state)
            body = S.to_dash(BUILDERS[state.page](ctx))
            return _title(ctx) + _pickers(ctx) + body

        try:
            built = self.builds.build(state, page)
            if isinstance(built, Pending):
                return _building(entry.run_id, entry.report_dir, built.elapsed_s), True
            return built, False
        except ReportUnreadable as e:
            log.warning("report unreadable: %s", e)
            return [html.H2(entry.run_id)] + _unreadable(entry.run_id), False
        except Exception:
            # Not the report's fault: re-analysing would not help, so the page does not ask
            # for it (the unreadable panel is for a report that cannot be read).
            log.exception("page %s of %s", state.page, entry.run_id)
        return [html.H2(entry.run_id)] + [html.P(
            f"This page cannot be drawn from the report of {entry.run_id}: an error in "
            f"meshscope (the server log has it; please report it). The other pages and "
            f"`meshscope analyze {entry.run_id}` still show the report.",
            id="page-error", style=S.WARN)], False


# A picker's choice replaces the URL's entry in the browser's history instead of adding one
# (Dash's Location only pushes): the page's own state is not a page to go Back to, so Back
# leaves the page in one press. The Location hears the change through the event its own
# links raise, and the page callback draws the new view.
REPLACE_QUERY = """
function(value) {
    const nu = window.dash_clientside.no_update;
    if (value === null || value === undefined) { return nu; }
    const url = new URL(window.location.href);
    if (url.searchParams.get("%s") === String(value)) { return nu; }
    url.searchParams.set("%s", value);
    window.history.replaceState(window.history.state, "", url.pathname + url.search + url.hash);
    window.dispatchEvent(new CustomEvent("_dashprivate_pushstate"));
    return nu;
}
"""


def _register_url_controls(app: Dash) -> None:
    """The controls that write the view into the URL: the step, colour and rank pickers (in
    the browser, replacing the history entry: ``REPLACE_QUERY``), and a click on a rank's bar
    or mesh cell (``rank=R``)."""
    for key, component in (("step", "step-select"), ("color", "color-select"),
                           ("rank", "rank-select")):
        app.clientside_callback(REPLACE_QUERY % (key, key),
                                Output(component, "className"), Input(component, "value"),
                                prevent_initial_call=True)

    @app.callback(Output("url", "search", allow_duplicate=True),
                  Input("breakdown-graph", "clickData"), Input("mesh-graph", "clickData"),
                  State("url", "pathname"), State("url", "search"),
                  prevent_initial_call=True)
    def focus_rank(bars, mesh, pathname, search):
        """A click on a rank's bar or mesh cell puts ``rank=R`` in the URL."""
        click = callback_context.triggered[0]["value"] if callback_context.triggered else None
        try:
            rank = int(click["points"][0]["customdata"])
        except (TypeError, KeyError, IndexError, ValueError):
            return no_update
        state = st.parse(pathname, search)
        return no_update if state.rank == rank else state.query(rank=rank)


def _register_rank_search(app: Dash, index: RunIndex) -> None:
    """The rank picker of many ranks searched on the server (``rank_options``): its choices
    are the ranks whose label holds what is typed."""
    @app.callback(Output("rank-select", "options"), Input("rank-select", "search_value"),
                  State("rank-select", "value"), State("url", "pathname"),
                  State("url", "search"), prevent_initial_call=True)
    def search_ranks(typed, value, pathname, search):
        entry = index.get(st.parse(pathname, search).run)
        if not typed or entry is None or not entry.analysed:
            return no_update
        try:
            rep = open_report(entry)
        except ReportUnreadable:
            return no_update
        if len(rep.ranks) <= MAX_RANK_OPTIONS:
            return no_update        # every rank is a choice already
        return rank_options(rep, value, typed)


def page_request(app: Dash, pathname: str, search: str) -> dict:
    """The body of the request a browser sends to render the page at ``pathname?search``
    (Dash's callback of the page), for scripts and tests that ask the server as a browser
    would: ``app.server.test_client().post("/_dash-update-component", json=...)``."""
    output = next(k for k in app.callback_map if "page.children" in k)
    return {"output": output,
            "outputs": [{"id": "nav", "property": "children"},
                        {"id": "page", "property": "children"},
                        {"id": "poll", "property": "disabled"}],
            "inputs": [{"id": "url", "property": "pathname", "value": pathname},
                       {"id": "url", "property": "search", "value": search},
                       {"id": "poll", "property": "n_intervals", "value": None}],
            "changedPropIds": ["url.search"], "state": []}


def _inside(p: pathlib.Path, folder: pathlib.Path) -> bool:
    try:
        return p.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def _regular_inside(p: pathlib.Path, folder: pathlib.Path) -> bool:
    """Whether ``p`` resolves to a regular file inside ``folder`` (no link leading out, no
    FIFO or device)."""
    import stat
    if not _inside(p, folder):
        return False
    try:
        return stat.S_ISREG(p.resolve().stat().st_mode)
    except OSError:
        return False


def _register_exports(app: Dash, index: RunIndex, analyses: Analyses) -> None:
    from flask import Response, request, send_file

    def _entry():
        entry = index.get(request.args.get("run"))
        if entry is None or not entry.analysed:
            return None
        if not _inside(entry.report_dir, entry.path):
            log.warning("export of %s refused: its report folder leads outside the run",
                        entry.run_id)
            return None
        return entry

    @app.server.route("/export/html")
    def export_html():
        entry = _entry()
        if entry is None:
            return Response("unknown or unanalysed run\n", 404, mimetype="text/plain")
        from .static_report import render_html
        try:
            text = render_html(open_report(entry))
        except ReportUnreadable as e:
            log.warning("report unreadable: %s", e)
            return Response(f"report unreadable, run `meshscope analyze --no-cache "
                            f"{entry.run_id}`\n", 500, mimetype="text/plain")
        name = entry.run_id.replace("/", "_") + "-report.html"
        return Response(text, mimetype="text/html",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @app.server.route("/export/perfetto")
    def export_perfetto():
        entry = _entry()
        if entry is None:
            return Response("unknown or unanalysed run\n", 404, mimetype="text/plain")
        from meshscope.analysis.errors import InputError
        from meshscope.analysis.report.inputs import find_traces

        traces = entry.path / rd.TRACES
        try:
            outside = [traces] if traces.exists() and not _inside(traces, entry.path) else \
                [f for f in find_traces(entry.path) if not _regular_inside(f, entry.path)]
        except (InputError, ValueError, OSError) as e:
            outside = [e]
        if not outside and not find_traces(entry.path):
            # A run with records only (Flight Recorder dumps, step timers): nothing to export.
            return Response("this run has no traces to export (its report is from its "
                            "Flight Recorder records or step timers only)\n", 404,
                            mimetype="text/plain")
        if outside:
            log.warning("perfetto export of %s refused: %s is not a regular file inside the run",
                        entry.run_id, outside[0])
            return Response("this run's traces cannot be exported: a trace file is not a "
                            "regular file inside the run\n", 403, mimetype="text/plain")
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "trace.json.gz"
            # In a child process with the analyses' limits: parsing the traces never grows
            # the server (dashboard.jobs).
            failed = analyses.export_perfetto(entry, out)
            if failed is not None or not out.is_file():
                log.warning("perfetto export of %s: %s", entry.run_id, failed)
                return Response("this run's traces cannot be exported (see the server log)\n",
                                500, mimetype="text/plain")
            data = io.BytesIO(out.read_bytes())
        name = entry.run_id.replace("/", "_") + "-trace.json.gz"
        return send_file(data, mimetype="application/gzip", as_attachment=True,
                         download_name=name)
