"""The template the dashboard's figures reach the browser with (``dashboard.figure_theme``):
given as the figure leaves, it is the JSON plotly.py itself writes for ``plotly_white``, and the
figure's own layout is kept."""
from __future__ import annotations

import plotly.graph_objects as go

from meshscope.dashboard.figure_theme import for_browser


def _figure() -> go.Figure:
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1.0, 2.0]))
    return fig.update_layout(height=321, title="two bars")


def test_the_browser_gets_plotly_whites_own_template_and_the_figures_layout():
    sent = for_browser(_figure())
    by_plotly = _figure().update_layout(template="plotly_white").to_plotly_json()
    assert sent["layout"]["template"] == by_plotly["layout"]["template"]
    assert sent["layout"]["height"] == 321 and sent["layout"]["title"] == {"text": "two bars"}
    assert sent["data"] == by_plotly["data"]

