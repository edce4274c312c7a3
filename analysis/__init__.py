"""Analysis of Kineto traces and meshscope run directories (docs/metrics.md).

``meshscope.analysis.open(path)`` is the notebook entry point (``analysis/api.py``);
``meshscope analyze`` and the dashboard use the same ``analysis.report.analyze``. The
sub-packages group the analysers by what they hold: ``ingest`` (traces → event tables),
``timeline`` (a rank's intervals and step breakdown), ``comm`` (the collective-instance table
and bandwidth), ``pipeline`` (bubbles), ``crossrank`` (clocks, the dependency graph, what-if,
stragglers), ``records`` (step timers, Flight Recorder) and ``report`` (the whole report).
"""


def open(path, **kwargs):  # noqa: A001 - the facade's name, as in ``analysis.open(path)``
    from meshscope.analysis.api import open as _open
    return _open(path, **kwargs)
