"""Server-side data for the dashboard: which runs exist, and the small tables drawn from them.

Runs are discovered once, when the app is created (``discover``); callbacks then look a run up
by its id (the directory name) in that dict and never open a path named by a request. Every
aggregation happens here, so the browser only receives per-rank means and per-stage rows.
"""
from __future__ import annotations

import dataclasses
import pathlib

import pandas as pd

from meshscope.analysis.report.analyze import load_written
from meshscope.collectors import run_dir as rd

# Stacked segments of the step breakdown, bottom to top: (label, column, column subtracted or
# None, colour). Together they add up to ``window_us`` (docs/metrics.md).
SEGMENTS: tuple[tuple[str, str, str | None, str], ...] = (
    ("compute", "compute_us", "overlapped_comm_us", "#4C78A8"),
    ("overlapped comm", "overlapped_comm_us", None, "#72B7B2"),
    ("exposed comm", "exposed_comm_us", None, "#E45756"),
    ("bubble", "bubble_us", None, "#F2CF5B"),
    ("other", "other_us", None, "#B279A2"),
    ("idle", "idle_us", None, "#BAB0AC"),
)
# Parallel dimensions whose exposed communication the hover of "exposed comm" itemises.
EXPOSED_DIMS = ("pp", "tp", "cp", "ep", "dp", "unknown")


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """One run directory found at startup; ``report`` is None when it has not been analysed."""
    run_id: str
    path: pathlib.Path
    report: pathlib.Path | None

    @property
    def analysed(self) -> bool:
        return self.report is not None


def discover(runs_dir: pathlib.Path) -> dict[str, RunEntry]:
    """Subdirectories of ``runs_dir`` holding ``report/summary.json`` (analysed ones first) or
    only ``run.json`` (not analysed), keyed by directory name."""
    analysed, pending = {}, {}
    for d in sorted(p for p in pathlib.Path(runs_dir).iterdir() if p.is_dir()):
        report = d / rd.REPORT
        if (report / "summary.json").is_file():
            analysed[d.name] = RunEntry(d.name, d, report)
        elif (d / rd.RUN_JSON).is_file():
            pending[d.name] = RunEntry(d.name, d, None)
    return {**analysed, **pending}


def load(entry: RunEntry) -> dict[str, object]:
    """The written report of an analysed run (``analysis.report.load_written``)."""
    return load_written(entry.report)


def rank_means_ms(breakdown: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the mean over profiled steps of every segment in ``SEGMENTS`` and of the
    exposed communication of each dimension, in milliseconds; indexed by rank."""
    means = breakdown.drop(columns=["step"]).groupby("rank").mean().sort_index()
    out = pd.DataFrame(index=means.index)
    for label, col, minus, _ in SEGMENTS:
        out[label] = (means[col] - (means[minus] if minus else 0.0)) / 1e3
    for dim in EXPOSED_DIMS:
        col = f"exposed_comm_{dim}_us"
        out[f"exposed {dim}"] = means[col] / 1e3 if col in means else 0.0
    out["window"] = means["window_us"] / 1e3
    return out


def stage_rows(bubbles: pd.DataFrame) -> list[dict]:
    """Per pipeline stage: its ranks, the measured bubble fraction (mean over ranks and profiled
    steps), the schedule's theoretical fraction and their ratio; [] when there is no pipeline."""
    if bubbles.empty:
        return []
    rows = []
    for stage, g in bubbles.groupby("stage"):
        measured = float(g["bubble_fraction"].mean())
        theory = float(g["theory_fraction"].iloc[0])
        rows.append({"stage": int(stage), "ranks": sorted(int(r) for r in g["rank"].unique()),
                     "measured": measured, "theory": theory,
                     "ratio": measured / theory if theory > 0 else None})
    return rows
