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

from meshscope.analysis.ingest.event_table import names_where

MODULE_PREFIX = "nn.Module: "
OPERATOR_CATS = ("cpu_op",)
ANNOTATION_CATS = ("user_annotation",)
BACKWARD_PREFIX = "autograd::engine::evaluate_function"


def innermost(starts: np.ndarray, ends: np.ndarray, names: list, times: np.ndarray) -> list:
    """For each of ``times``, the name of the innermost of the ranges ``starts`` … ``ends``
    (sorted by start; properly nested, as one thread's are) covering it — start ≤ t ≤ end —,
    None where none does (``innermost_index``)."""
    return [names[j] if j >= 0 else None for j in innermost_index(starts, ends, times).tolist()]


# Ranges per block of ``innermost_index``'s search (the largest end of each block is kept).
_BLOCK = 256


def innermost_index(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each of ``times``, the position of the innermost range covering it among ``starts``
    … ``ends`` (sorted by start), -1 where none does: the last range in that order that
    starts at or before t and ends at or after it. (Of ranges that nest, the covering ones
    are the open ones of a sweep in time, and the innermost is the last opened; of two that
    cross, the later-started one.) Found without walking the ranges: the last range started
    by t is found by bisection, then the last one at or before it whose end reaches t, in its
    block of ``_BLOCK`` ranges or in the last block whose largest end does."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    times = np.asarray(times, dtype=np.float64)
    out = np.full(len(times), -1, dtype=np.int64)
    n = len(starts)
    if n == 0 or not len(times):
        return out
    last = np.searchsorted(starts, times, side="right") - 1
    blocks = -(-n // _BLOCK)
    padded = np.full(blocks * _BLOCK, -np.inf)
    padded[:n] = ends
    block_end = padded.reshape(blocks, _BLOCK).max(axis=1)
    for i in np.flatnonzero(last >= 0).tolist():
        j, t = int(last[i]), times[i]
        b = j // _BLOCK
        hit = np.flatnonzero(ends[b * _BLOCK:j + 1] >= t)
        if len(hit):
            out[i] = b * _BLOCK + int(hit[-1])
            continue
        reach = np.flatnonzero(block_end[:b] >= t)
        if len(reach):
            k = int(reach[-1])
            out[i] = k * _BLOCK + int(np.flatnonzero(ends[k * _BLOCK:(k + 1) * _BLOCK] >= t)[-1])
    return out


def _of_kind(ev: pd.DataFrame, lane: str, mask: np.ndarray) -> tuple:
    """(starts, ends, names) of the ranges of ``mask`` on ``lane``, sorted by start; ``names``
    their column (made Python objects only where read: ``_names_at``)."""
    rows = ev.loc[mask & (ev["lane"] == lane).to_numpy(), ["ts_us", "end_us", "name"]]
    order = np.argsort(rows["ts_us"].to_numpy(), kind="stable")
    rows = rows.iloc[order]
    return rows["ts_us"].to_numpy(), rows["end_us"].to_numpy(), rows["name"]


def _names_at(names: pd.Series, found: np.ndarray) -> list:
    """The names at positions ``found`` of ``names`` (as ``astype(object)`` gives them), None
    at -1."""
    hit = found >= 0
    out: list = [None] * len(found)
    for i, name in zip(np.flatnonzero(hit).tolist(),
                       names.iloc[found[hit]].astype(object).tolist()):
        out[i] = name
    return out


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
    is_mod = ((cat == "python_function").to_numpy()
              & names_where(events["name"], lambda n: n.startswith(MODULE_PREFIX))) \
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
            found = _names_at(names, innermost_index(s, e, t))
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
    mask = events["cat"].isin(OPERATOR_CATS).to_numpy() \
        & names_where(events["name"], lambda n: n.startswith(BACKWARD_PREFIX))
    if not mask.any():
        return out
    lanes = np.asarray(lanes, dtype=object)
    times = np.asarray(times, dtype=np.float64)
    for lane in pd.unique(lanes):
        idx = np.flatnonzero(lanes == lane)
        idx = idx[np.argsort(times[idx], kind="stable")]
        s, e, _ = _of_kind(events, lane, mask)
        if not len(s):
            continue
        out[idx] = innermost_index(s, e, times[idx]) >= 0
    return out
