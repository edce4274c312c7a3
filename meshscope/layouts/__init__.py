"""Choosing a parallel layout: above both the runner and the analysis, because it uses both.

- ``plan``       — the planner: memory, traffic and step time of a layout before running it
                   (``meshscope plan``), torch-free;
- ``sweep``      — run every valid layout of N ranks and analyse each (``meshscope sweep``):
                   it launches ``meshscope.parallel`` in child processes and reads their runs
                   with ``meshscope.analysis``;
- ``throughput`` — a finished run's tokens/s and MFU per step, for ``meshscope run``'s
                   printout (the definitions are ``analysis.records.steps``');
- ``compare``    — runs (and a sweep) side by side with the planner's prediction for each
                   (``meshscope compare``, the dashboard's compare page): it reads reports
                   through ``analysis.report.reader`` and calibrates the planner.
"""
