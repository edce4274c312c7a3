"""Where a GPU's idle time goes: every idle microsecond of a step charged to one cause.

The device is idle where none of its streams runs a kernel, memcpy or memset. Each idle stretch
[a, b] ends when the next device activity starts; that activity was launched by a runtime call
on some host thread at t (``rank_timeline.launch_times``). So:

- from a to t the device waited for its **host**: the launching thread had not yet asked for
  the work. That time is charged by what the thread was doing (``host_activity``), in this
  order: ``dataloader`` (in the data loader); ``sync`` (in a blocking synchronisation — or
  anywhere in the stretch when a synchronisation on that thread ended at most ``SYNC_TOL_US``
  before a: the host waited for the device to drain, so it could not run ahead, and everything
  it did afterwards left the device idle); ``wait_rank`` (in a host call of a collective:
  waiting for another rank); ``launch`` (in another runtime call: launching work); ``cpu``
  (other host work: operators, Python, the optimizer on the host); ``other`` (no traced range:
  untraced Python, the profiler, the OS).
- from t to b the work was **queued** but not running: launch latency, or a wait for another
  stream's work (an event); a stretch whose next work was launched before a is queued whole.
  This is HTA's "kernel wait" and "other" together — except where the launching thread is
  still blocked in that call or in a synchronisation: a copy from pageable host memory
  (``cudaMemcpyAsync`` waits while the driver stages the data) or a ``cudaFree``. That time is
  ``sync``.

The parts are disjoint and cover the idle time exactly: ``causes`` returns cause → interval
set, and the report's ``idle`` table (``analysis/timeline/breakdown.py``, ``idle_rows``) clips
them to each step window, so per step the ``idle_<cause>_us`` columns add up to the
breakdown's ``idle_us``.

HTA's ``get_idle_time_breakdown`` counts the same kind of time per stream (gaps between two
kernels of one stream) with three labels: host wait (the next kernel's launch came after the
previous kernel ended), kernel wait (a gap shorter than its threshold) and other.
``stream_idle`` gives exactly that, for comparison (``tests/test_gpu_traces.py``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.timeline import intervals as iv
from meshscope.vocabulary import IDLE_CAUSES

# The causes, in the order they are charged.
CAUSES = IDLE_CAUSES
SYNC_TOL_US = 50.0


def causes(gaps: np.ndarray, dev_ts: np.ndarray, launch_ts: np.ndarray,
           launch_lane: np.ndarray, sets: dict[str, dict[str, np.ndarray]],
           main_lane: str | None, sync_ends: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """cause → interval set, a partition of ``gaps`` (the device's idle time).

    ``dev_ts``: start of every device activity; ``launch_ts`` / ``launch_lane``: the start and
    thread of the runtime call that launched each (NaN / None where unknown, −inf launched
    before the trace); ``sets``: ``host_activity.thread_sets``; ``sync_ends``: lane → sorted
    ends of its synchronisations."""
    out = {c: iv.EMPTY.copy() for c in CAUSES}
    if not len(gaps):
        return out
    order = np.argsort(dev_ts, kind="stable")
    ts_sorted = dev_ts[order]
    a, b = gaps[:, 0], gaps[:, 1]
    nxt = np.searchsorted(ts_sorted, b - 1e-6, side="left")
    has = nxt < len(ts_sorted)
    idx = order[np.minimum(nxt, len(ts_sorted) - 1)]
    t = np.where(has, launch_ts[idx] if len(idx) else np.nan, np.inf)
    lanes = np.where(has, launch_lane[idx] if len(idx) else None, None)
    unknown = np.isnan(t)
    t = np.where(unknown, b, t)                 # no launch record: all host time
    lanes = np.where(unknown | (lanes == None), main_lane, lanes)  # noqa: E711
    split = np.clip(t, a, b)
    queued_parts = np.column_stack([split, b])
    host_parts = np.column_stack([a, split])
    for lane in pd.unique(lanes):
        mine = lanes == lane
        kinds = sets.get(lane, {}) if lane is not None else {}
        q = iv.of(queued_parts[mine])
        # Launched, but the launching call still blocks the host: a synchronous copy (from
        # pageable memory) or a synchronisation.
        blocked = iv.intersect(q, iv.merge(kinds.get("sync", iv.EMPTY),
                                           kinds.get("copy", iv.EMPTY)))
        out["sync"] = iv.merge(out["sync"], blocked)
        out["queued"] = iv.merge(out["queued"], iv.subtract(q, blocked))
        h = iv.of(host_parts[mine])
        if not len(h):
            continue
        ends = sync_ends.get(lane, np.zeros(0)) if lane is not None else np.zeros(0)
        post = _after_sync(host_parts[mine], t[mine], ends)
        dl = iv.intersect(h, kinds.get("dataloader", iv.EMPTY))
        rest = iv.subtract(h, dl)
        sync = iv.intersect(rest, iv.merge(kinds.get("sync", iv.EMPTY), post))
        rest = iv.subtract(rest, sync)
        parts = {"dataloader": dl, "sync": sync}
        for cause, kind in (("wait_rank", "comm"), ("launch", "runtime"), ("cpu", "cpu")):
            have = kinds.get(kind, iv.EMPTY)
            if kind == "runtime":
                have = iv.merge(have, kinds.get("copy", iv.EMPTY))
            parts[cause] = iv.intersect(rest, have)
            rest = iv.subtract(rest, parts[cause])
        parts["other"] = rest
        for cause, x in parts.items():
            out[cause] = iv.merge(out[cause], x)
    return out


def _after_sync(host_parts: np.ndarray, t: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The host parts of the stretches that follow a synchronisation of their thread: the last
    synchronisation that ended before the launch ended at most ``SYNC_TOL_US`` before the
    stretch began."""
    if not len(ends) or not len(host_parts):
        return iv.EMPTY.copy()
    j = np.searchsorted(ends, np.minimum(t, host_parts[:, 1]), side="right") - 1
    ok = j >= 0
    last = np.where(ok, ends[np.maximum(j, 0)], -np.inf)
    hit = ok & (last >= host_parts[:, 0] - SYNC_TOL_US)
    return iv.of(host_parts[hit])


def sync_ends_by_lane(calls: pd.DataFrame) -> dict[str, np.ndarray]:
    """lane → sorted ends of its synchronisations (``host_activity.sync_calls``)."""
    return {str(lane): np.sort(g["end_us"].to_numpy()) for lane, g in
            calls.groupby("lane", sort=False)} if len(calls) else {}


def charged_sync(calls: pd.DataFrame, sync_idle: np.ndarray) -> pd.DataFrame:
    """The sync-charged idle time, split by the synchronisation each stretch followed (the
    last one of its thread that ended before it): ``calls`` with ``idle_after_us`` added."""
    out = calls.copy()
    out["idle_after_us"] = 0.0
    if not len(calls) or not len(sync_idle):
        return out
    ends = calls["end_us"].to_numpy()
    order = np.argsort(ends, kind="stable")
    lengths = sync_idle[:, 1] - sync_idle[:, 0]
    j = np.searchsorted(ends[order], sync_idle[:, 0] + SYNC_TOL_US, side="right") - 1
    ok = j >= 0
    acc = np.zeros(len(calls))
    np.add.at(acc, order[j[ok]], lengths[ok])
    out["idle_after_us"] = acc
    return out


STREAM_COLUMNS = ["rank", "stream", "idle_us", "host_wait_us", "kernel_wait_us", "other_us"]
# HTA's default ``consecutive_kernel_delay``, which its docstring gives in nanoseconds while the
# gaps it compares it with are in µs: a gap under 30 µs is a kernel wait.
KERNEL_WAIT_US = 30.0


def stream_idle(rank: int, device: pd.DataFrame, launch_ts: np.ndarray) -> pd.DataFrame:
    """HTA's idle time breakdown, per stream (module docstring): for each device activity, the
    gap since the previous one on its stream ended is ``host_wait`` when its launch started
    after that end, else ``kernel_wait`` when shorter than ``KERNEL_WAIT_US``, else
    ``other``. ``device``: the device events HTA reads (kernels, memcpy, memset), with
    ``launch_ts`` aligned to them. Columns ``STREAM_COLUMNS``."""
    rows = []
    if device.empty:
        return pd.DataFrame(columns=STREAM_COLUMNS)
    d = device.assign(launch=launch_ts)
    for lane, g in d.groupby("lane", sort=True):
        g = g.sort_values("ts_us", kind="stable")
        prev_end = g["end_us"].shift(1).to_numpy()
        gap = g["ts_us"].to_numpy() - prev_end
        valid = ~np.isnan(prev_end)
        host = valid & (g["launch"].to_numpy() > prev_end)
        kernel = valid & ~host & (gap < KERNEL_WAIT_US)
        other = valid & ~host & ~kernel
        rows.append({"rank": rank, "stream": str(lane), "idle_us": float(gap[valid].sum()),
                     "host_wait_us": float(gap[host].sum()),
                     "kernel_wait_us": float(gap[kernel].sum()),
                     "other_us": float(gap[other].sum())})
    return pd.DataFrame(rows, columns=STREAM_COLUMNS)
