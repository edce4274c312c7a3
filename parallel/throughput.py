"""Moved to ``meshscope.layouts.throughput`` (issue 26): a re-export for ``analysis/compare.py``
and ``tests/test_compare.py`` only, deleted when compare moves to ``meshscope.layouts``."""
from meshscope.layouts.throughput import step_table  # noqa: F401
