"""What a report's numbers rest on: checks of the evidence and the verdict they give.

Each check counts one kind of damage a trace can carry without being unreadable — times that
cannot be right, device activity the profiler lost, a trace cut short, ranks that saw a
different run — and says, when it does not pass, which of the report's numbers rest on what it
found. ``rank_checks`` runs per rank where the trace is read (``report/rank_work.py``: the event
table never leaves its worker); ``run_checks`` runs across ranks on the small tables the
cross-rank stage holds; ``report/trust_verdict.py`` turns both into ``model.Trust`` by the rule in
docs/metrics.md ("Trust"), and marks the findings whose numbers rest on a failed check.
"""
