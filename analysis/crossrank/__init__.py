"""Cross-rank timing: clock alignment, the step's dependency graph, critical path, what-if savings, the straggler."""
