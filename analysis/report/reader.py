"""Reading a report's summary.json: the one place that knows its older schema versions.

The dashboard, ``meshscope compare`` and the text report read the quantities below through
these functions, so each is found under one name and shown with one label whatever the
report's age:

- ``step_time(summary) -> StepTime``: the headline step time, its source (``timer``,
  ``replayed``, ``window``) and label, and the three step times under their own names.
  Schema 3 writes them (``analysis/report/summary.py``); schema 2 wrote the replayed makespan
  as ``step_time_us`` beside ``throughput.step_time_us`` (the step timer), and schema 1 only the
  per-rank windows: both are mapped here onto schema 3's names, the timer first.
- ``stage_imbalance(summary) -> (measured, without_straggler)``: the pipeline stages'
  max/mean, measured (compute per microbatch, ``stage_imbalance.parquet``) and replayed with
  the straggler at its peers' pace (``crossrank/whatif.py``; schema 2's ``stage_imbalance``).
"""
from __future__ import annotations

import dataclasses

from meshscope.analysis.report.summary import STEP_TIME_SOURCES

#: Short labels of the step-time sources, for a table's column or a chart's axis.
SHORT = {"timer": "step timer", "replayed": "replayed", "window": "profiled window"}


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x \
        else None


@dataclasses.dataclass(frozen=True)
class StepTime:
    us: float | None                 # the headline: timer, else replayed, else window
    source: str | None               # "timer" | "replayed" | "window" | None
    timer_us: float | None
    replayed_us: float | None
    window_us: float | None

    @property
    def label(self) -> str:
        """What the headline is, in words (a tooltip or a footnote)."""
        return STEP_TIME_SOURCES.get(self.source or "", "unknown")

    @property
    def short(self) -> str:
        return SHORT.get(self.source or "", "-")

    @property
    def ms(self) -> float | None:
        return None if self.us is None else self.us / 1e3

    def text(self) -> str:
        """``"202.84 ms (step timer)"``, or ``"-"``."""
        return "-" if self.us is None else f"{self.us / 1e3:.2f} ms ({self.short})"


def _window(summary: dict) -> float | None:
    windows = [_num(m.get("window_us")) for m in summary.get("per_rank_mean") or []
               if isinstance(m, dict)]
    windows = [w for w in windows if w is not None]
    return max(windows) if windows else None


def step_time(summary: dict) -> StepTime:
    """The report's step times under schema 3's names (older schemas mapped)."""
    version = summary.get("schema_version")
    tp = summary.get("throughput") if isinstance(summary.get("throughput"), dict) else {}
    if isinstance(version, int) and version >= 3:
        timer, replayed = _num(summary.get("step_time_timer_us")), \
            _num(summary.get("step_time_replayed_us"))
        window = _num(summary.get("window_us"))
    else:
        timer = _num(tp.get("step_time_us"))
        old = _num(summary.get("step_time_us"))
        src = str(summary.get("step_time_source") or "")
        replayed = old if old is not None and src.startswith("replayed") else None
        window = old if old is not None and not src.startswith("replayed") else _window(summary)
    head, source = next(((v, k) for v, k in ((timer, "timer"), (replayed, "replayed"),
                                              (window, "window")) if v is not None),
                        (None, None))
    return StepTime(head, source, timer, replayed, window)


def stage_imbalance(summary: dict) -> tuple[dict | None, dict | None]:
    """(measured, without the straggler) stage imbalance dicts, each with ``max_over_mean``
    and ``slowest_stage``; None where the report has none."""
    def d(x):
        return x if isinstance(x, dict) and _num(x.get("max_over_mean")) is not None else None
    if isinstance(summary.get("schema_version"), int) and summary["schema_version"] >= 3:
        return d(summary.get("stage_imbalance_measured")), \
            d(summary.get("stage_imbalance_without_straggler"))
    return None, d(summary.get("stage_imbalance"))
