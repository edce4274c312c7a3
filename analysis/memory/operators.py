"""What a memory event happened in: the operator and the module on its thread at its time.

An allocation is made by the innermost operator (``cpu_op``) running on the allocating
thread when it happened — ``aten::empty``, ``aten::mm`` … — and, where the trace has them, in
the innermost module (``python_function`` ranges named ``nn.Module: Linear_0``, written with
``with_modules`` or ``with_stack``) and under the innermost user range (``record_function``:
``meshscope/forward …``, ``Optimizer.step#AdamW.step``). Ranges on one thread nest, so the
innermost range covering a time is the latest-started of those still open then: one sweep per
thread over its ranges and the queried times, both in time order (``innermost``).

``context(events, lanes, times)`` returns, for each queried (thread, time), the three names
(None where nothing covers it); ``in_backward(events, lanes, times)`` whether the autograd
engine was running a backward function there (``autograd::engine::evaluate_function: …``, the
range PyTorch's profiler records around every node of the backward graph, on whichever thread
runs it — so a trace without any ``record_function`` of its own still says which allocations
the backward made).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

MODULE_PREFIX = "nn.Module: "
OPERATOR_CATS = ("cpu_op",)
ANNOTATION_CATS = ("user_annotation",)
BACKWARD_PREFIX = "autograd::engine::evaluate_function"


def innermost(starts: np.ndarray, ends: np.ndarray, names: list, times: np.ndarray) -> list:
    """For each of ``times`` (sorted), the name of the innermost of the ranges ``starts`` …
    ``ends`` (sorted by start; properly nested, as one thread's are) covering it — start ≤ t
    ≤ end —, None where none does."""
    out: list = [None] * len(times)
    stack: list[int] = []
    j, n = 0, len(starts)
    for i, t in enumerate(times):
        while j < n and starts[j] <= t:
            while stack and ends[stack[-1]] < starts[j]:
                stack.pop()
            stack.append(j)
            j += 1
        while stack and ends[stack[-1]] < t:
            stack.pop()
        if stack:
            out[i] = names[stack[-1]]
    return out


def _of_kind(ev: pd.DataFrame, lane: str, mask: np.ndarray) -> tuple:
    rows = ev.loc[mask & (ev["lane"] == lane).to_numpy(), ["ts_us", "end_us", "name"]]
    order = np.argsort(rows["ts_us"].to_numpy(), kind="stable")
    rows = rows.iloc[order]
    return rows["ts_us"].to_numpy(), rows["end_us"].to_numpy(), \
        rows["name"].astype(object).tolist()


def context(events: pd.DataFrame, lanes: np.ndarray, times: np.ndarray
            ) -> tuple[list, list, list]:
    """(operator, module, annotation) of each (``lanes[i]``, ``times[i]``): the innermost
    ``cpu_op``, ``nn.Module`` python range and user range on that thread covering that time
    (module docstring); None where none does."""
    n = len(times)
    ops: list = [None] * n
    mods: list = [None] * n
    notes: list = [None] * n
    if n == 0 or events is None or events.empty:
        return ops, mods, notes
    cat = events["cat"]
    is_op = cat.isin(OPERATOR_CATS).to_numpy()
    is_mod = ((cat == "python_function")
              & events["name"].astype(str).str.startswith(MODULE_PREFIX)).to_numpy() \
        if (cat == "python_function").any() else np.zeros(len(events), dtype=bool)
    is_note = cat.isin(ANNOTATION_CATS).to_numpy()
    lanes = np.asarray(lanes, dtype=object)
    times = np.asarray(times, dtype=np.float64)
    for lane in pd.unique(lanes):
        idx = np.flatnonzero(lanes == lane)
        idx = idx[np.argsort(times[idx], kind="stable")]
        t = times[idx]
        for mask, out, strip in ((is_op, ops, ""), (is_mod, mods, MODULE_PREFIX),
                                 (is_note, notes, "")):
            if not mask.any():
                continue
            s, e, names = _of_kind(events, lane, mask)
            if not len(s):
                continue
            found = innermost(s, e, names, t)
            for i, name in zip(idx, found):
                out[i] = name[len(strip):] if (name is not None and strip) else name
    return ops, mods, notes


def in_backward(events: pd.DataFrame, lanes: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each (``lanes[i]``, ``times[i]``), whether an ``autograd::engine::evaluate_function``
    operator range covers it on that thread (module docstring)."""
    n = len(times)
    out = np.zeros(n, dtype=bool)
    if n == 0 or events is None or events.empty:
        return out
    mask = (events["cat"].isin(OPERATOR_CATS)
            & events["name"].astype(str).str.startswith(BACKWARD_PREFIX)).to_numpy()
    if not mask.any():
        return out
    lanes = np.asarray(lanes, dtype=object)
    times = np.asarray(times, dtype=np.float64)
    for lane in pd.unique(lanes):
        idx = np.flatnonzero(lanes == lane)
        idx = idx[np.argsort(times[idx], kind="stable")]
        s, e, names = _of_kind(events, lane, mask)
        if not len(s):
            continue
        found = innermost(s, e, names, times[idx])
        out[idx] = [f is not None for f in found]
    return out
