"""Choosing a parallel layout: above both the runner and the analysis, because it uses both.

- ``plan``       — the planner: memory, traffic and step time of a layout before running it
                   (``meshscope plan``), torch-free;
- ``sweep``      — run every valid layout of N ranks and analyse each (``meshscope sweep``):
                   it launches ``meshscope.parallel`` in child processes and reads their runs
                   with ``meshscope.analysis``;
- ``throughput`` — a finished run's tokens/s and MFU per step, for ``meshscope run``'s
                   printout (the definitions are ``analysis.records.steps``').

``analysis/compare.py`` (runs and plans side by side) belongs here too and moves next; until
then ``meshscope.parallel.plan``, ``.sweep`` and ``.throughput`` re-export these for it.
"""
