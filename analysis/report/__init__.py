"""The report: the analysis run end to end, its findings, summary.json and the printed text."""
