"""The dashboard's plotly template (``plotly_white``), given to each figure once, as it leaves
for the browser.

Setting ``template="plotly_white"`` on a figure in Python (``update_layout``) makes plotly.py
copy and validate the whole template — 27–38 ms a figure on the development machine, measured
alone; the 1,024-rank Stragglers page's six figures set it twelve times, about a third of the
page's server build (docs/benchmarks.md, "Dashboard latency"). The pages build their figures
without a template (``pages.common.LAYOUT``); ``for_browser`` turns a figure into the plain
dict the browser gets with the template's JSON, made once per process, in its layout — what
plotly.js receives is the same as before. The static report (``sections.to_html``), made
once, sets the template the ordinary way (``with_template``).
"""
from __future__ import annotations

import functools

import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE = "plotly_white"


@functools.lru_cache(maxsize=1)
def _template_json() -> dict:
    return pio.templates[TEMPLATE].to_plotly_json()


def for_browser(fig: go.Figure) -> dict:
    """``fig`` as the dict ``dcc.Graph`` sends, its layout's template ``TEMPLATE``. Only the
    layout's top level is copied: the template's JSON is shared, never changed."""
    out = fig.to_plotly_json()
    out["layout"] = {**out.get("layout", {}), "template": _template_json()}
    return out


def with_template(fig: go.Figure) -> go.Figure:
    """``fig`` with ``TEMPLATE`` set through plotly.py (validated: for the static report)."""
    return fig.update_layout(template=TEMPLATE)
