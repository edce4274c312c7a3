"""Analysis of Kineto traces and meshscope run directories (docs/metrics.md).

``analysis.open(path)`` is the notebook entry point (analysis/api.py); ``meshscope analyze``
and the dashboard use the same ``analysis.report.analyze``.
"""


def open(path, **kwargs):  # noqa: A001 - the facade's name, as in ``analysis.open(path)``
    from .api import open as _open
    return _open(path, **kwargs)
