"""Moved to ``meshscope.layouts.plan.serial``: a re-export for ``analysis/compare.py`` only,
deleted when compare moves (see ``parallel/plan/__init__.py``)."""
from meshscope.layouts.plan.serial import load_rates, plan_to_dict  # noqa: F401
