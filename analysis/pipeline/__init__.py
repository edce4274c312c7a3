"""Pipeline parallelism: bubbles against the schedule's theory, microbatch timeline, stage imbalance."""
