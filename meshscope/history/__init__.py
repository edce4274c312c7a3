"""History across many runs (docs/history.md): the index of analysed runs (``index``,
``entry``), SQL over every indexed report (``query``), series of comparable runs and their
trends (``series``), change points (``changes``), the gate against a series' baseline
(``baseline``) and a review of it all (``review``).

It sits beside ``meshscope.layouts`` in the layers: it reads reports through the analysis
package (``analysis/report/reader``, ``analysis/compare``) and is read by the dashboard, the
command line and the agent server.
"""
