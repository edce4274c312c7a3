"""One rank's timeline as interval sets, and the per-step breakdown read from it."""
