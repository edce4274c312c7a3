"""Reading a report's summary.json: the one place that knows its older schema versions.

The dashboard, ``meshscope compare`` and the text report read the quantities below through
these functions, so each is found under one name and shown with one label whatever the
report's age:

- ``step_time(summary) -> StepTime``: the headline step time, its source (``timer``,
  ``replayed``, ``window``) and label, and the three step times under their own names.
  Schema 3 writes them (``analysis/report/summary.py``); schema 2 wrote the replayed makespan
  as ``step_time_us`` beside ``throughput.step_time_us`` (the step timer), and schema 1 only the
  per-rank windows: both are mapped here onto schema 3's names, the timer first.
- ``read_summary(doc) -> Summary``: the fields a reader shows, typed (findings as ``Finding``),
  tokens/s and MFU only beside the step timer's step time they were computed from.
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


@dataclasses.dataclass(frozen=True)
class Finding:
    id: str
    title: str
    severity: str
    dimension: str | None
    cost_us: float | None
    cost_pct: float | None
    evidence: dict
    remedy: str
    symptoms: list


@dataclasses.dataclass(frozen=True)
class Summary:
    """summary.json as typed fields, whatever its schema version (the fields a reader
    needs to show a run; ``raw`` keeps the document for the rest)."""
    schema_version: int
    generated: str | None
    run: dict                       # from run.json; {} for a plain folder of traces
    ranks: list[int]
    steps: list[int]
    step_time: StepTime
    tokens_per_s: float | None      # the step timers': None unless the headline is the timer
    mfu_pct: float | None
    stage_imbalance_measured: dict | None
    stage_imbalance_without_straggler: dict | None
    straggler: dict | None
    findings: list[Finding]
    raw: dict

    @property
    def status(self) -> str | None:
        return self.run.get("status") if self.run else None


def _ints(xs) -> list[int]:
    return [int(x) for x in xs or [] if isinstance(x, (int, float)) and not isinstance(x, bool)]


def read_summary(doc: dict) -> Summary:
    """The typed ``Summary`` of a summary.json document (schema 1, 2 or 3)."""
    st = step_time(doc)
    tp = doc.get("throughput") if isinstance(doc.get("throughput"), dict) else {}
    timer = st.source == "timer"
    measured, corrected = stage_imbalance(doc)
    cross = doc.get("cross_rank") if isinstance(doc.get("cross_rank"), dict) else {}
    found = []
    for f in doc.get("findings") or []:
        if isinstance(f, dict) and isinstance(f.get("id"), str):
            found.append(Finding(
                id=f["id"], title=str(f.get("title") or f["id"]),
                severity=str(f.get("severity") or ""), dimension=f.get("dimension"),
                cost_us=_num(f.get("cost_us")), cost_pct=_num(f.get("cost_pct")),
                evidence=f.get("evidence") if isinstance(f.get("evidence"), dict) else {},
                remedy=str(f.get("remedy") or ""),
                symptoms=f.get("symptoms") if isinstance(f.get("symptoms"), list) else []))
    version = doc.get("schema_version")
    return Summary(
        schema_version=version if isinstance(version, int) else 0,
        generated=str(doc["generated"]) if doc.get("generated") else None,
        run=doc.get("run") if isinstance(doc.get("run"), dict) else {},
        ranks=_ints(doc.get("ranks")), steps=_ints(doc.get("steps")), step_time=st,
        tokens_per_s=_num(tp.get("tokens_per_s")) if timer else None,
        mfu_pct=_num(tp.get("mfu_pct")) if timer else None,
        stage_imbalance_measured=measured, stage_imbalance_without_straggler=corrected,
        straggler=cross.get("straggler") if isinstance(cross.get("straggler"), dict) else None,
        findings=found, raw=doc)
