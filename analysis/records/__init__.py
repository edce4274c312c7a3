"""The always-on records: step timers (heatmap, warm-up, slow steps) and Flight Recorder verdicts."""
