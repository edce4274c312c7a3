"""Moved to ``meshscope.layouts.plan`` (issue 26): the planner sits above both the runner and
the analysis. This re-export exists only for ``analysis/compare.py`` and ``tests/test_compare.py``
until compare moves to ``meshscope.layouts``; delete it then (``[tool.importlinter]`` names this
edge in ``ignore_imports``)."""
from meshscope.layouts.plan import *  # noqa: F401,F403
from meshscope.layouts.plan import __all__  # noqa: F401
