"""Model states and activations measured from a trace — ``report/memory_terms.parquet``, what
``meshscope compare --detail`` sets beside the planner's terms (``meshscope/layouts/
memory_vs_plan.py``).

From the ``[memory]`` events of a rank's device (``source`` ``events``), where the trace shows
them:

- ``grads`` — the bytes freed by ``Optimizer.zero_grad`` (its ``record_function`` range,
  ``Optimizer.zero_grad#AdamW.zero_grad``) on its thread: with ``set_to_none=True`` (the
  default) it drops every gradient, so what it frees is the gradients the rank held. The
  largest over the profiled steps (on a CPU trace the first profiled step frees gradients
  allocated before the profiler started, which PyTorch does not report).
- ``optimizer_state`` — the bytes allocated inside ``Optimizer.step`` ranges and never freed
  in the trace: Adam's moments are made at the optimizer's first step, so this is seen when
  the profiled steps include the first one, and is absent otherwise.
- ``activations`` — at the step's allocated peak, the bytes of live blocks allocated inside the
  runner's forward ranges (``meshscope/forward stage=… mb=…``): what the forward passes keep
  for the backward, for every microbatch in flight. The largest over the profiled steps.

From the runner's own count, written into its trace's metadata (``meshscope_memory``,
``collectors/memory_census.py``; ``source`` ``census``): ``weights``, ``grads`` and
``optimizer_state`` as the bytes of the distinct storages of the rank's parameters, their
gradients and the optimizer's state at the end of the first profiled step, and, on a GPU,
``torch.cuda.max_memory_allocated`` per profiled step (``max_allocated``).

Columns (``COLUMNS``): ``rank``, ``device``, ``term``, ``bytes``, ``source``, ``detail``.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from meshscope.analysis.memory.live import pairs
from meshscope.analysis.memory.series import Series
from meshscope.analysis.memory.steps import StepPeak
from meshscope.collectors import annotations

COLUMNS = ["rank", "device", "term", "bytes", "source", "detail"]
TERMS = ("weights", "grads", "optimizer_state", "runtime_buffers", "activations")
ZERO_GRAD = re.compile(r"^Optimizer\.zero_grad#")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
FORWARD = re.compile(r"^" + re.escape(annotations.PREFIX) + r"forward ")
CENSUS_KEY = "meshscope_memory"
CENSUS_TERMS = {"params_bytes": "weights", "grads_bytes": "grads",
                "optimizer_bytes": "optimizer_state"}


def ranges(events: pd.DataFrame, pattern: re.Pattern) -> dict[str, np.ndarray]:
    """lane → the (start, end) rows of the user ranges whose name matches ``pattern``, sorted
    by start."""
    if events is None or events.empty:
        return {}
    notes = events[events["cat"] == "user_annotation"]
    if notes.empty:
        return {}
    names = notes["name"].astype(str)
    hit = notes[names.str.match(pattern).to_numpy()]
    out = {}
    for lane, g in hit.groupby("lane", observed=True):
        spans = g[["ts_us", "end_us"]].to_numpy(dtype=np.float64)
        out[str(lane)] = spans[np.argsort(spans[:, 0], kind="stable")]
    return out


def inside(s: Series, spans: dict[str, np.ndarray], index: np.ndarray | None = None
           ) -> np.ndarray:
    """Which events of ``s`` (all, or those of ``index``) lie inside one of ``spans`` on their
    own thread."""
    idx = np.arange(len(s)) if index is None else np.asarray(index)
    out = np.zeros(len(idx), dtype=bool)
    if not spans or not len(idx):
        return out
    lanes = s.lane[idx]
    ts = s.ts_us[idx]
    for lane, sp in spans.items():
        mine = lanes == lane
        if not mine.any():
            continue
        t = ts[mine]
        j = np.searchsorted(sp[:, 0], t, side="right") - 1
        ok = j >= 0
        ok[ok] = t[ok] <= sp[j[ok], 1]
        out[np.flatnonzero(mine)] = ok
    return out


def event_terms(rank: int, s: Series, events: pd.DataFrame, peaks: list[StepPeak],
                live_at_peak: dict[int, np.ndarray]) -> list[dict]:
    """The terms a device's events show (module docstring); ``live_at_peak``: step → the
    indices of the blocks live at that step's allocated peak."""
    out = []
    zero = ranges(events, ZERO_GRAD)
    if zero:
        freed = inside(s, zero) & (s.bytes < 0)
        best = None
        for p in peaks:
            sl = np.zeros(len(s), dtype=bool)
            sl[p.first:p.last + 1] = True
            got = int(-s.bytes[freed & sl].sum())
            if got and (best is None or got > best[0]):
                best = (got, p.step)
        if best:
            out.append(_row(rank, s, "grads", best[0], "events",
                            f"freed by Optimizer.zero_grad in step {best[1]}"))
    opt = ranges(events, OPTIMIZER_STEP)
    if opt:
        kept = inside(s, opt) & (s.bytes > 0) & (pairs(s) < 0)
        if kept.any():
            out.append(_row(rank, s, "optimizer_state", int(s.bytes[kept].sum()), "events",
                            f"allocated in Optimizer.step and never freed "
                            f"({int(kept.sum())} blocks)"))
    fwd = ranges(events, FORWARD)
    if fwd and live_at_peak:
        best = None
        for step, idx in live_at_peak.items():
            got = int(s.bytes[idx[inside(s, fwd, idx)]].sum()) if len(idx) else 0
            if got and (best is None or got > best[0]):
                best = (got, step)
        if best:
            out.append(_row(rank, s, "activations", best[0], "events",
                            f"live at step {best[1]}'s peak, allocated in forward ranges"))
    return out


def census_terms(rank: int, device: str, meta: dict) -> list[dict]:
    """The runner's own count of its model states (module docstring), where the trace's
    metadata holds one for ``device``; values that are not non-negative integers are left
    out."""
    doc = meta.get(CENSUS_KEY) if isinstance(meta, dict) else None
    if not isinstance(doc, dict) or doc.get("device") != device:
        return []
    out = []
    step = doc.get("step")
    for key, term in CENSUS_TERMS.items():
        v = doc.get(key)
        if type(v) is int and v >= 0:
            out.append({"rank": rank, "device": device, "term": term, "bytes": v,
                        "source": "census",
                        "detail": f"storages at the end of step {step}" if step is not None
                        else "storages"})
    peaks = doc.get("max_allocated_bytes")
    if isinstance(peaks, dict):
        vals = [v for v in peaks.values() if type(v) is int and v >= 0]
        if vals:
            out.append({"rank": rank, "device": device, "term": "max_allocated",
                        "bytes": max(vals), "source": "census",
                        "detail": "torch.cuda.max_memory_allocated, largest profiled step"})
    return out


def _row(rank: int, s: Series, term: str, nbytes: int, source: str, detail: str) -> dict:
    return {"rank": rank, "device": s.device, "term": term, "bytes": int(nbytes),
            "source": source, "detail": detail}
