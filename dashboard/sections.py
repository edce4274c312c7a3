"""What a page shows, independent of how it is shown: the dashboard renders it as Dash components
(``to_dash``), the static HTML report as plain HTML with the figures embedded (``to_html``).

A page is a list of ``Section`` (a heading and its items); an item is a ``Figure`` (a plotly
figure), a ``Table`` (column names and rows of already formatted cells; a ``Cell`` is a cell
whose full text shows as its tooltip, for names cut short; a ``LinkCell`` a cell that links to
another view, shown as its text alone in the static report), a ``Grid`` (a table of raw values
the reader sorts and filters), a ``Note`` (a sentence:
what is missing, what to run) or a ``Facts`` line (label: value pairs). Every item has an ``id``
that the browser tests find it by, in the dashboard and in the static report alike.
"""
from __future__ import annotations

import dataclasses
import html as _html
from typing import Sequence, Union

import plotly.graph_objects as go

from meshscope.analysis.report.model import REPORT_SCHEMA_VERSION, Citation, Finding, human_bytes

from .figure_margins import fit_margins
from .figure_theme import for_browser, with_template
from .state import TITLES, ViewState

NOTE = {"color": "#555", "fontStyle": "italic"}
WARN = {"background": "#fff4e5", "border": "1px solid #f0b36a", "borderRadius": "4px",
        "padding": "8px 12px", "margin": "8px 0"}
CELL = {"padding": "4px 10px", "borderBottom": "1px solid #ddd", "textAlign": "right",
        "verticalAlign": "top"}
HEAD = {**CELL, "borderBottom": "2px solid #888", "fontWeight": "600"}
HIGHLIGHT = {"background": "#fde8e8"}


@dataclasses.dataclass
class Figure:
    id: str
    figure: go.Figure
    caption: str | None = None


@dataclasses.dataclass(frozen=True)
class Cell:
    """A table cell shown as ``text`` with ``title`` as its tooltip (a long name cut short)."""
    text: str
    title: str

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class LinkCell:
    """A table cell that links to another view of the dashboard (``href``); the static report,
    which has no server behind it, shows its text alone."""
    text: str
    href: str

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass
class Table:
    id: str
    columns: Sequence[str]
    rows: Sequence[Sequence[object]]
    caption: str | None = None
    # (row index, column index) of cells to highlight, e.g. the best/worst of a comparison.
    highlight: frozenset = frozenset()
    left: int = 1                   # how many leading columns are text (left-aligned)


@dataclasses.dataclass
class Grid:
    """A table the reader sorts and filters (the dashboard's AG Grid, ``dash-ag-grid``; a plain
    table in the static report): ``columns`` are (label, key, kind) with kind ``text`` or ``number``,
    ``rows`` dicts of raw values by key (numbers stay numbers, so they sort as numbers),
    shown with ``digits`` decimals."""
    id: str
    columns: Sequence[tuple[str, str, str]]
    rows: Sequence[dict]
    caption: str | None = None
    digits: int = 2
    page_size: int = 20


@dataclasses.dataclass
class Note:
    id: str
    text: str
    warn: bool = False


@dataclasses.dataclass
class Facts:
    id: str
    items: Sequence[tuple[str, object]]


@dataclasses.dataclass
class Link:
    """A link to a download or another view of the dashboard (left out of the static
    report, which has no server behind it)."""
    id: str
    text: str
    href: str
    before: str = ""


@dataclasses.dataclass
class Search:
    """A box to search the figure ``target`` by name (the dashboard's text input, its
    matches said in ``<id>-result``; the page registers what a search does). The static
    report, with no server and no callback behind it, leaves it out."""
    id: str
    target: str
    placeholder: str = "search by name"


Item = Union[Figure, Table, Grid, Note, Facts, Link, Search]


@dataclasses.dataclass
class Section:
    """A heading and its items. Consecutive sections of one ``tabs`` name are the tabs of one
    tab bar in the dashboard (``to_dash``: only the open tab's figures are drawn, the others
    when their tab is opened), one after the other in the static report."""
    title: str | None
    items: list[Item]
    id: str | None = None
    tabs: str | None = None


def as_tabs(sections: Sequence[Section], name: str) -> list[Section]:
    """``sections`` as the tabs of one tab bar called ``name`` (``Section.tabs``)."""
    return [dataclasses.replace(s, tabs=name) for s in sections]


def missing(id_: str, what: str, run_id: str | None = None, *,
            schema_version: int | None = None, why: str | None = None) -> Note:
    """The note for a table or key this report does not have. A report older than this
    meshscope writes (``schema_version`` below today's, or unknown) may lack it only for its
    age: re-running ``meshscope analyze`` shows it. A report of today's version lacks it
    because the input did: the note says what the input lacks (``why``, else "This run has no
    …"), never an instruction that would change nothing."""
    if schema_version is not None and schema_version >= REPORT_SCHEMA_VERSION:
        return Note(id_, why or f"This run has no {what}.")
    cmd = f"meshscope analyze {run_id}" if run_id else "meshscope analyze"
    return Note(id_, f"This report has no {what} — re-run `{cmd}` with this version of "
                     f"meshscope to see it.")


def fmt(x, digits: int = 2, unit: str = "") -> str:
    """A number for a table cell ("—" for unknown)."""
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return f"{x}{unit}"
    if isinstance(x, float):
        return f"{x:.{digits}f}{unit}"
    return str(x)


def ms(us, digits: int = 2) -> str:
    return "—" if us is None or us != us else f"{us / 1e3:.{digits}f} ms"


# ---- Dash --------------------------------------------------------------------------------

def clip(text, n: int) -> str:
    """``text`` in at most ``n`` characters, cut at a word boundary with "…" — never mid-word."""
    text = "" if text is None else str(text)
    if len(text) <= n:
        return text
    cut = text[:n - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > n // 2 else cut).rstrip(" ,;:") + "…"


# Bytes in binary units, as every view writes them (``model.human_bytes``: KiB, MiB, GiB).
BYTES = "bytes"
_UNITS = (("_us", "ms", 1e-3), ("_pct", "%", 1.0), ("_gbps", "GB/s", 1.0),
          ("_bytes", BYTES, 1.0), ("_fraction", "%", 100.0))
# Evidence keys holding a fraction of 1 whose name carries no unit suffix (``*_share``, and
# pipeline-bubble evidence): shown in % like the ``_fraction`` ones.
_FRACTION_KEYS = frozenset({"theory_at_twice_the_microbatches"})


def _value(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_value(x) for x in v[:12]) + (" …" if len(v) > 12 else "")
    return str(v)


def evidence_text(ev) -> str:
    """A finding's evidence as short labelled sentences with units ("Exposed on path:
    13.70 ms. Rank: 1. Steps: 4, 5."): ``_us`` in ms, ``_pct`` and fractions in %, bytes in
    binary units (``human_bytes``: MiB, GiB), nested tables as "key value" pairs; one quantity
    in two units (``saving_us`` and ``saving_pct``) is one sentence ("Saving: 63.14 ms
    (20.5%)."); the raw numbers stay in summary.json."""
    if not isinstance(ev, dict):
        return "" if ev is None else clip(ev, 300)
    said: dict[str, str] = {}          # label -> its sentence's text, in order
    for k, v in ev.items():
        if v is None:
            continue
        label, unit, scale = str(k), "", 1.0
        for suffix, u, f in _UNITS:
            if label.endswith(suffix):
                label, unit, scale = label[: -len(suffix)], u, f
                break
        if label in _FRACTION_KEYS or label.endswith("_share"):
            unit, scale = "%", 100.0
        label = label.replace("_", " ").strip().capitalize() or str(k)
        if isinstance(v, dict):
            parts = [f"{kk} {_num(vv, scale, unit)}" for kk, vv in list(v.items())[:8]]
            text = ", ".join(parts) + (" …" if len(v) > 8 else "")
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            text = "; ".join(_row(x) for x in v[:8]) + (" …" if len(v) > 8 else "")
        else:
            text = _num(v, scale, unit)
        said[label] = f"{said[label]} ({text})" if label in said else text
    return " ".join(f"{label}: {text}." for label, text in said.items())


def shown_at(finding: Finding) -> Citation | None:
    """The first of a finding's citations that names a dashboard page: where its evidence is
    shown (None for a finding without one, or a report written before findings cited)."""
    return next((c for c in finding.cites if c.page), None)


def place_text(c: Citation) -> str:
    """``"Stragglers, rank 3, step 5"``: the page, rank and step a citation names."""
    return ", ".join([TITLES.get(c.page or "", str(c.page))]
                     + ([f"rank {c.rank}"] if c.rank is not None else [])
                     + ([f"step {c.step}"] if c.step is not None else []))


def evidence_cell(finding: Finding, state: ViewState) -> LinkCell | str:
    """A finding's evidence place as a table cell: a link to the page, rank and step of its
    first citation with a page; in the static report (no server) the place as text, "see
    Stragglers, rank 3"; "—" when it cites no page."""
    c = shown_at(finding)
    if c is None:
        return "—"
    if state.static:
        return f"see {place_text(c)}"
    return LinkCell(place_text(c), state.href(c.page, rank=c.rank, step=c.step))


def _row(d: dict) -> str:
    """One row of a nested table ("stage 0, bubble 38.4%"), each value with its unit."""
    parts = []
    for k, v in d.items():
        label, unit, scale = str(k), "", 1.0
        for suffix, u, f in _UNITS:
            if label.endswith(suffix):
                label, unit, scale = label[: -len(suffix)], u, f
                break
        parts.append(f"{label.replace('_', ' ')} {_num(v, scale, unit)}")
    return ", ".join(parts)


def _num(v, scale: float, unit: str) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and unit == BYTES:
        return human_bytes(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and unit:
        x = v * scale
        return f"{x:,.2f} {unit}" if unit != "%" else f"{x:.1f}%"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_num(x, scale, unit)}" for k, x in list(v.items())[:8])
    return _value(v)


def _dash_item(item: Item):
    from dash import dcc, html

    if isinstance(item, Figure):
        out = [dcc.Graph(id=item.id, figure=for_browser(fit_margins(item.figure)),
                         config={"displaylogo": False, "responsive": True})]
        if item.caption:
            out.append(html.P(item.caption, style={**NOTE, "fontSize": "0.9em"}))
        return html.Div(out)
    if isinstance(item, Table):
        head = html.Thead(html.Tr([html.Th(c, style={**HEAD, **({"textAlign": "left"}
                                                              if i < item.left else {})})
                                   for i, c in enumerate(item.columns)]))
        body = html.Tbody([
            html.Tr([html.Td(html.A(v.text, href=v.href) if isinstance(v, LinkCell) else str(v),
                             style={**CELL,
                                    **({"textAlign": "left"} if j < item.left else {}),
                                    **(HIGHLIGHT if (i, j) in item.highlight else {})},
                             **({"title": v.title} if isinstance(v, Cell) else {}))
                     for j, v in enumerate(row)])
            for i, row in enumerate(item.rows)])
        out = [html.Table([head, body], id=item.id,
                          style={"borderCollapse": "collapse",
                                 "fontVariantNumeric": "tabular-nums", "margin": "4px 0"})]
        if item.caption:
            out.append(html.P(item.caption, style={**NOTE, "fontSize": "0.9em"}))
        return html.Div(out, style={"overflowX": "auto"})
    if isinstance(item, Grid):
        import dash_ag_grid as dag

        fmt_number = {"function": f"params.value == null ? '—' : "
                                  f"d3.format(',.{item.digits}f')(params.value)"}
        columns = [{"field": key, "headerName": label,
                    **({"filter": "agNumberColumnFilter", "valueFormatter": fmt_number,
                        "type": "rightAligned"} if kind == "number" else
                       {"filter": "agTextColumnFilter", "tooltipField": key,
                        "maxWidth": 420})}
                   for label, key, kind in item.columns]
        grid = dag.AgGrid(
            id=item.id, rowData=[dict(r) for r in item.rows], columnDefs=columns,
            defaultColDef={"sortable": True, "filter": True, "resizable": True,
                           "floatingFilter": True},
            dashGridOptions={"pagination": True, "paginationPageSize": item.page_size,
                             "domLayout": "autoHeight", "tooltipShowDelay": 300,
                             "suppressColumnVirtualisation": True},
            columnSize="autoSize", className="ag-theme-alpine", style={"width": "100%"})
        out = [grid]
        if item.caption:
            out.append(html.P(item.caption, style={**NOTE, "fontSize": "0.9em"}))
        return html.Div(out, style={"margin": "4px 0"})
    if isinstance(item, Note):
        return html.P(item.text, id=item.id, style=WARN if item.warn else NOTE)
    if isinstance(item, Facts):
        return html.Div([html.Span([html.B(f"{k}: "), str(v)], style={"marginRight": "18px"})
                         for k, v in item.items], id=item.id, style={"margin": "4px 0"})
    if isinstance(item, Link):
        return html.P([item.before, html.A(item.text, href=item.href, id=item.id)])
    if isinstance(item, Search):
        return html.Div([dcc.Input(id=item.id, type="search", debounce=True,
                                   placeholder=item.placeholder,
                                   style={"width": "320px", "marginRight": "12px"}),
                         html.Span(id=f"{item.id}-result", style=NOTE)],
                        style={"margin": "6px 0"})
    raise TypeError(type(item))


TAB = {"padding": "6px 14px"}


def to_dash(sections: list[Section]) -> list:
    from dash import dcc, html

    out: list = []
    for s in sections:
        children = ([html.H3(s.title)] if s.title else []) + [_dash_item(i) for i in s.items]
        section = html.Section(children, id=s.id) if s.id else html.Section(children)
        if s.tabs is None:
            out.append(section)
            continue
        # dcc.Tabs mounts the open tab's children only: a closed tab's figures are drawn
        # when it is opened
        if not (out and isinstance(out[-1], dcc.Tabs) and out[-1].id == s.tabs):
            out.append(dcc.Tabs(id=s.tabs, value="0", children=[],
                                style={"margin": "10px 0 4px"}))
        bar = out[-1]
        i = len(bar.children)
        bar.children.append(dcc.Tab(label=s.title or f"{i + 1}", value=str(i),
                                    id=f"{s.tabs}-{i}", children=[section], style=TAB,
                                    selected_style={**TAB, "fontWeight": "600"}))
    return out


# ---- static HTML -------------------------------------------------------------------------

def _esc(x) -> str:
    return _html.escape(str(x))


def _title(v) -> str:
    return f' title="{_esc(v.title)}"' if isinstance(v, Cell) else ""


def _html_item(item: Item) -> str:
    if isinstance(item, Figure):
        div = with_template(fit_margins(item.figure)).to_html(full_html=False, include_plotlyjs=False, div_id=item.id,
                                  config={"displaylogo": False, "responsive": True})
        cap = f'<p class="note">{_esc(item.caption)}</p>' if item.caption else ""
        return f'<div class="figure">{div}{cap}</div>'
    if isinstance(item, Table):
        head = "".join(f'<th class="{"l" if i < item.left else ""}">{_esc(c)}</th>'
                       for i, c in enumerate(item.columns))
        rows = "".join(
            "<tr>" + "".join(
                f'<td class="{"l" if j < item.left else ""}'
                f'{" hi" if (i, j) in item.highlight else ""}"{_title(v)}>{_esc(v)}</td>'
                for j, v in enumerate(row)) + "</tr>"
            for i, row in enumerate(item.rows))
        cap = f'<p class="note">{_esc(item.caption)}</p>' if item.caption else ""
        return (f'<div class="table"><table id="{_esc(item.id)}"><thead><tr>{head}</tr></thead>'
                f"<tbody>{rows}</tbody></table>{cap}</div>")
    if isinstance(item, Grid):
        return _html_item(Table(
            item.id, [label for label, _, _ in item.columns],
            [[fmt(r.get(key), item.digits) if kind == "number" else
              ("—" if r.get(key) is None else str(r.get(key)))
              for _, key, kind in item.columns] for r in item.rows],
            caption=item.caption,
            left=sum(1 for _, _, kind in item.columns[:1] if kind != "number")))
    if isinstance(item, Note):
        return f'<p id="{_esc(item.id)}" class="{"warn" if item.warn else "note"}">' \
               f"{_esc(item.text)}</p>"
    if isinstance(item, Facts):
        return f'<div id="{_esc(item.id)}" class="facts">' + "".join(
            f"<span><b>{_esc(k)}:</b> {_esc(v)}</span>" for k, v in item.items) + "</div>"
    if isinstance(item, (Link, Search)):
        return ""
    raise TypeError(type(item))


def to_html(sections: list[Section]) -> str:
    parts = []
    for s in sections:
        sid = f' id="{_esc(s.id)}"' if s.id else ""
        title = f"<h3>{_esc(s.title)}</h3>" if s.title else ""
        parts.append(f"<section{sid}>{title}" + "".join(_html_item(i) for i in s.items)
                     + "</section>")
    return "\n".join(parts)
