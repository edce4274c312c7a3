"""Margins that already hold a figure's tick labels, axis titles, legend and colour bar, so
that plotly.js draws it once.

Plotly's ``automargin`` (on in the ``plotly_white`` template every page uses) draws a figure,
measures its labels and, when they do not fit the layout's margins, grows the margins and
draws the figure again: the bar charts of the many-rank pages, whose rank labels
(``rank 5 (pp1·dp2)``) are turned 30° on their x axis, were each drawn twice (measured in
headless Chromium: 96 ms for the 16-bar clock figure with its margins grown, 22 ms without;
docs/benchmarks.md, "Pages drawn in the browser"). ``fit_margins`` sets, before the figure is
sent, margins at least as large as what automargin would grow them to — estimated from the
labels' lengths in characters at plotly's default 12 px font — and, on a category x axis whose
labels would not fit side by side, the angle automargin would have chosen, so the first draw
is the last. Automargin stays on: where the estimate is short, the browser still grows the
margins (one more draw, never a clipped label).
"""
from __future__ import annotations

import math
import re

import plotly.graph_objects as go

CHAR_PX = 7.3           # plotly's 12 px default font: a character's width, generously
LINE_PX = 16            # a line of 12 px text
PLOT_WIDTH_PX = 1000    # the drawing area of a page's figure (a 1,300 px window)
MAX_EVERY_LABEL = 24    # plotly labels every category of an axis up to about this many
TAG = re.compile(r"<[^>]+>")


def _text_px(label) -> float:
    lines = TAG.sub("", str(label).replace("<br>", "\n")).split("\n")
    return CHAR_PX * max(len(line) for line in lines)


def _labels(fig: go.Figure, axis: str) -> tuple[list, bool]:
    """(the tick labels the traces on ``axis`` ('x', 'x2', 'y'…) put there, whether they are
    categories): a category axis' labels are the trace's own values, a numeric axis' a guess of
    seven characters (``-1.250k``)."""
    letter = axis[0]
    values: list = []
    for t in fig.data:
        if (getattr(t, f"{letter}axis", None) or letter) != axis:
            continue
        v = getattr(t, letter, None)
        if v is None:
            continue
        v = list(v) if not isinstance(v, (str, bytes)) else [v]
        values += [x for x in v if x is not None]
    category = any(isinstance(x, str) for x in values)
    return (list(dict.fromkeys(values)) if category else ["-0.000k"]), category


def _axes(fig: go.Figure, letter: str) -> list[str]:
    """``['x', 'x2']``: the axes of ``letter`` the layout or a trace names."""
    names = {k.replace("axis", "") for k in fig.layout.to_plotly_json()
             if k.startswith(f"{letter}axis")}
    return sorted(names | {letter} | {getattr(t, f"{letter}axis", None) or letter
                                      for t in fig.data})


def _layout_axis(fig: go.Figure, axis: str):
    return fig.layout[f"{axis[0]}axis{axis[1:]}"]


def fit_margins(fig: go.Figure) -> go.Figure:
    """``fig`` with margins that hold its labels (module docstring); returned for chaining."""
    m = fig.layout.margin
    left, bottom, right = m.l or 80, m.b or 80, m.r or 80
    for axis in _axes(fig, "y"):
        ax = _layout_axis(fig, axis)
        if ax.showticklabels is False or ax.side == "right" or ax.overlaying:
            continue
        labels, _ = _labels(fig, axis) if ax.ticktext is None else (list(ax.ticktext), True)
        need = max((_text_px(x) for x in labels), default=0.0) + 12
        if ax.title.text:
            need += LINE_PX + 12
        left = max(left, math.ceil(need))
    for axis in _axes(fig, "x"):
        ax = _layout_axis(fig, axis)
        if ax.showticklabels is False or ax.side == "top":
            continue
        labels, category = _labels(fig, axis) if ax.ticktext is None else \
            (list(ax.ticktext), True)
        wide = max((_text_px(x) for x in labels), default=0.0)
        angle = ax.tickangle
        if category and angle is None and labels:
            # side by side while they fit; else 30° while one line of text fits between
            # neighbours at that slant; else upright — as plotly's autotickangles choose.
            # Above MAX_EVERY_LABEL categories plotly labels only some (40 px apart or more):
            # its angle is left to it and 30° assumed.
            room = PLOT_WIDTH_PX / len(labels)
            if len(labels) > MAX_EVERY_LABEL:
                angle = -30 if wide + 8 > 40 else 0
            else:
                angle = 0 if wide + 8 <= room else -30 if room >= 2 * LINE_PX else -90
                ax.tickangle = angle
        slant = math.radians(abs(angle or 0))
        need = wide * math.sin(slant) + LINE_PX * math.cos(slant) + 12
        if category and labels and 0 < abs(angle or 0) < 90:
            # a slanted label ends under its tick and reaches left: the first one past the
            # axis' start by its slanted length less half a category
            reach = wide * math.cos(slant) - PLOT_WIDTH_PX / len(labels) / 2 + 12
            left = max(left, math.ceil(reach))
        if ax.title.text:
            need += LINE_PX + 14
        bottom = max(bottom, math.ceil(need))
    named = [t.name for t in fig.data if t.name and t.showlegend is not False]
    legend = fig.layout.legend
    show = fig.layout.showlegend
    shown = bool(show or (show is None and len(named) > 1))
    if shown and legend.orientation != "h":
        # a legend entry: its symbol (40 px) and padding beside the name
        right = max(right, math.ceil(max(_text_px(n) for n in named) + 80))
    elif shown and (legend.y if legend.y is not None else 1) < 0:
        # rows of entries under the axis, at ``y`` (a fraction of the plot's height) below it
        # (``common.lanes_layout``): as many rows as their names take of the figure's width,
        # each a line of text and its padding; the plot's height is the figure's less its
        # margins, so b ≥ |y|·(height − t − b) + rows
        rows = math.ceil(sum(_text_px(n) + 50 for n in named) / PLOT_WIDTH_PX)
        below = abs(legend.y)
        height = fig.layout.height or 450
        top = m.t if m.t is not None else 100
        need = (below * (height - top) + rows * (LINE_PX + 10) + 20) / (1 + below)
        bottom = max(bottom + rows * (LINE_PX + 8), math.ceil(need))
    if any(getattr(t, "showscale", None) is not False and t.type == "heatmap" and
           (t.colorbar.x is None or t.colorbar.x >= 1) for t in fig.data):
        right = max(right, 110)
    fig.update_layout(margin={"l": left, "b": bottom, "r": right})
    return fig
