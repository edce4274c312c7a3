"""Reading traces: one rank's Kineto trace into its event table, many ranks in parallel, cached."""
