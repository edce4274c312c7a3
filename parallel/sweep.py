"""Moved to ``meshscope.layouts.sweep`` (issue 26): a re-export for ``analysis/compare.py``
only, deleted when compare moves to ``meshscope.layouts`` (``[tool.importlinter]`` names this
edge in ``ignore_imports``)."""
from meshscope.layouts.sweep import SweepError, is_complete_run, read_sweep  # noqa: F401
