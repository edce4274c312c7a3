"""Where a GPU's idle time goes: every idle microsecond of a step charged to one cause.

The device is idle where none of its streams runs a kernel, memcpy or memset. Each idle stretch
[a, b] ends when the next device activity starts; that activity was launched by a runtime call
on some host thread, from t to t' (``step_windows.launch_calls``). So:

- from a to t the device waited for its **host**: the launching thread had not yet asked for
  the work. That time is charged by what the thread was doing (``host_activity``), in this
  order: ``dataloader`` (in the data loader); ``sync`` (in a blocking synchronisation or an
  event wait; and, after a synchronisation that ended at most ``SYNC_TOL_US`` before the
  stretch began or inside it, the host time that follows it, up to what the synchronisation
  itself held the host — ``_after_sync``); ``wait_rank`` (in a host call of a collective:
  waiting for another rank); ``startup`` (in a runtime call that sets up rather than launches:
  CUDA initialisation, stream and event creation, module loading, allocations, graph capture);
  ``launch`` (in another runtime call: launching work); ``cpu`` (other host work: operators,
  Python, the optimizer on the host); ``other`` (no traced range: untraced Python, the
  profiler, the OS).
- from t to t' the host was **inside the call that launches** the work: ``launch`` — a first
  launch that loads its kernel's module can hold the host for a second, and that is launch
  time, not work waiting on the device. Where the launching thread is in a copy that blocks
  it meanwhile — one from or to pageable host memory (``cudaMemcpyAsync`` waits while the
  driver stages the data: ``blocking_copies``; a device-to-device or pinned copy returns at
  once and is a launch like any other) — or in a synchronisation, it is ``sync``.
- from t' to b the work was **queued** but not running: launch latency, or a wait for another
  stream's work (an event); a stretch whose next work was launched (and returned) before a is
  queued whole. This is HTA's "kernel wait" and "other" together.

Why the time after a synchronisation is bounded: the host waited inside the call, so it could
not run ahead of the device, and what it did next left the device idle. Without the call the
host would have been ahead by as much as the call held it, no more — so a 22 µs copy is not
charged with the 872 ms of stream creation after it. The time the device idled inside the call
counts against that allowance, so the sync time charged to a call never exceeds the time the
host spent in it.

The parts are disjoint and cover the idle time exactly: ``causes`` returns cause → interval
set (and, beside them, ``SLOW_LAUNCH``: the part of ``launch`` inside launch calls of at least
``host_activity.LONG_LAUNCH_US``), and the report's ``idle`` table
(``analysis/timeline/breakdown.py``, ``idle_rows``) clips them to each step window, so per
step the ``idle_<cause>_us`` columns add up to the breakdown's ``idle_us``.

HTA's ``get_idle_time_breakdown`` counts the same kind of time per stream (gaps between two
kernels of one stream) with three labels: host wait (the next kernel's launch came after the
previous kernel ended), kernel wait (a gap shorter than its threshold) and other.
``stream_idle`` gives exactly that, for comparison (``tests/test_gpu_traces.py``).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from meshscope.analysis.gpu.host_activity import COPY_NAMES, EVENT_WAIT_NAMES
from meshscope.analysis import intervals as iv
from meshscope.vocabulary import IDLE_CAUSES

# The causes, in the order they are charged.
CAUSES = IDLE_CAUSES
# Not a cause: the part of ``launch`` spent in launch calls that held the host at least
# ``host_activity.LONG_LAUNCH_US`` — first launches loading their modules, start-up work that
# the launch-bound finding does not claim (a CUDA graph would not remove it).
SLOW_LAUNCH = "slow_launch"
SYNC_TOL_US = 50.0
_HOST_COPY = re.compile(r"HtoD|DtoH|Pageable")
# The host kinds (``host_activity.HOST_KINDS``) that charge the host part of a stretch, in
# order, after the data loader and the synchronisations.
_HOST_ORDER = (("wait_rank", ("comm",)), ("startup", ("startup",)),
               ("launch", ("runtime", "copy")), ("cpu", ("cpu",)))


def causes(gaps: np.ndarray, dev_ts: np.ndarray, launch_ts: np.ndarray,
           launch_lane: np.ndarray, sets: dict[str, dict[str, np.ndarray]],
           main_lane: str | None, sync_spans: dict[str, tuple[np.ndarray, np.ndarray]],
           launch_end: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """cause → interval set, a partition of ``gaps`` (the device's idle time).

    ``dev_ts``: start of every device activity; ``launch_ts`` / ``launch_end`` /
    ``launch_lane``: the start, end and thread of the runtime call that launched each (NaN /
    None where unknown, −inf launched before the trace); ``sets``:
    ``host_activity.thread_sets``; ``sync_spans``: lane → (starts, ends) of its
    synchronisations, sorted by end (``sync_spans_by_lane``)."""
    out = {c: iv.EMPTY.copy() for c in CAUSES}
    out[SLOW_LAUNCH] = iv.EMPTY.copy()
    if not len(gaps):
        return out
    if launch_end is None:
        launch_end = launch_ts
    order = np.argsort(dev_ts, kind="stable")
    ts_sorted = dev_ts[order]
    a, b = gaps[:, 0], gaps[:, 1]
    nxt = np.searchsorted(ts_sorted, b - 1e-6, side="left")
    has = nxt < len(ts_sorted)
    idx = order[np.minimum(nxt, len(ts_sorted) - 1)]
    t = np.where(has, launch_ts[idx] if len(idx) else np.nan, np.inf)
    t_end = np.where(has, launch_end[idx] if len(idx) else np.nan, np.inf)
    lanes = np.where(has, launch_lane[idx] if len(idx) else None, None)
    unknown = np.isnan(t)
    t = np.where(unknown, b, t)                 # no launch record: all host time
    t_end = np.where(unknown | np.isnan(t_end), t, t_end)
    lanes = np.where(unknown | (lanes == None), main_lane, lanes)  # noqa: E711
    split = np.clip(t, a, b)
    in_call = np.column_stack([split, np.clip(t_end, split, b)])
    queued_parts = np.column_stack([split, b])
    host_parts = np.column_stack([a, split])
    for lane in pd.unique(lanes):
        mine = lanes == lane
        kinds = sets.get(lane, {}) if lane is not None else {}
        q = iv.of(queued_parts[mine])
        # Launched, but the launching call still blocks the host: a synchronous copy (from
        # pageable memory) or a synchronisation; else, while the launching call runs, launch.
        blocked = iv.intersect(q, iv.merge(kinds.get("sync", iv.EMPTY),
                                           kinds.get("blocking_copy", iv.EMPTY)))
        q = iv.subtract(q, blocked)
        launching = iv.intersect(q, iv.of(in_call[mine]))
        slow = kinds.get("slow_launch", iv.EMPTY)
        out["launch"] = iv.merge(out["launch"], launching)
        out[SLOW_LAUNCH] = iv.merge(out[SLOW_LAUNCH], iv.intersect(launching, slow))
        out["queued"] = iv.merge(out["queued"], iv.subtract(q, launching))
        h = iv.of(host_parts[mine])
        dl = iv.intersect(h, kinds.get("dataloader", iv.EMPTY))
        rest = iv.subtract(h, dl)
        inside = iv.intersect(rest, kinds.get("sync", iv.EMPTY))
        rest = iv.subtract(rest, inside)
        spans = sync_spans.get(lane) if lane is not None else None
        post = _after_sync(host_parts[mine], t[mine], spans, iv.merge(inside, blocked))
        post = iv.intersect(rest, post)
        rest = iv.subtract(rest, post)
        parts = {"dataloader": dl, "sync": iv.merge(inside, post, blocked)}
        for cause, wanted in _HOST_ORDER:
            have = iv.merge(*[kinds.get(k, iv.EMPTY) for k in wanted])
            parts[cause] = iv.intersect(rest, have)
            rest = iv.subtract(rest, parts[cause])
        parts["other"] = rest
        out[SLOW_LAUNCH] = iv.merge(out[SLOW_LAUNCH], iv.intersect(parts["launch"], slow))
        for cause, x in parts.items():
            out[cause] = iv.merge(out[cause], x)
    return out


def blocking_copies(device: pd.DataFrame, launch_ts: np.ndarray, launch_end: np.ndarray,
                    launch_lane: np.ndarray) -> dict[str, np.ndarray]:
    """lane → the spans of its copy calls that block the host: those whose device copy moves
    pageable host memory (Kineto names it ``Memcpy HtoD (Pageable -> Device)``, ``… DtoH
    (Device -> Pageable)``), or a host copy whose memory kind the trace does not say (``Memcpy
    HtoD``, ``Memcpy DtoH``); never a device-to-device or pinned copy. ``device``: the device
    events (``cat``, ``name``), aligned with the launch arrays."""
    if device.empty:
        return {}
    codes, names = pd.factorize(device["name"])
    blocks = np.array([bool(_HOST_COPY.search(n)) and ("Pageable" in n or "Pinned" not in n)
                       for n in names] + [False])[codes]
    blocking = (device["cat"] == "gpu_memcpy").to_numpy() & blocks
    ok = blocking & np.isfinite(launch_ts) & np.isfinite(launch_end)
    out = {}
    if not ok.any():
        return out
    lanes = launch_lane[ok]
    for lane in pd.unique(lanes):
        mine = lanes == lane
        if lane is not None:
            out[str(lane)] = iv.union(launch_ts[ok][mine], launch_end[ok][mine])
    return out


def covered_us(s: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each [start, end), how much of it the interval set ``s`` covers (µs)."""
    starts, ends = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    if not len(s):
        return np.zeros(len(starts))
    lengths = s[:, 1] - s[:, 0]
    before = np.concatenate([[0.0], np.cumsum(lengths)])

    def upto(x):
        i = np.searchsorted(s[:, 0], x, side="right") - 1
        j = np.maximum(i, 0)
        part = np.clip(x - s[j, 0], 0.0, lengths[j])
        return np.where(i >= 0, before[j] + part, 0.0)
    return np.maximum(upto(ends) - upto(starts), 0.0)


def _after_sync(host_parts: np.ndarray, t: np.ndarray,
                spans: tuple[np.ndarray, np.ndarray] | None, held: np.ndarray) -> np.ndarray:
    """The host time charged to the synchronisations that the stretches follow (module
    docstring): a stretch follows the last synchronisation of its thread that ended before
    the launch, when that one ended at most ``SYNC_TOL_US`` before the stretch began (or
    inside it); from that end, as much of the stretch is charged as the call held the host,
    less the device idle already charged inside it (``held``: this thread's sync-charged idle
    so far), shared in time order by the stretches that follow the same call."""
    if spans is None or not len(spans[1]) or not len(host_parts):
        return iv.EMPTY.copy()
    starts, ends = spans
    j = np.searchsorted(ends, np.minimum(t, host_parts[:, 1]), side="right") - 1
    ok = j >= 0
    last = np.where(ok, ends[np.maximum(j, 0)], -np.inf)
    hit = np.flatnonzero(ok & (last >= host_parts[:, 0] - SYNC_TOL_US))
    if not len(hit):
        return iv.EMPTY.copy()
    calls = np.unique(j[hit])
    allowance = dict(zip(calls.tolist(), ((ends[calls] - starts[calls])
                                          - covered_us(held, starts[calls], ends[calls])
                                          ).tolist()))
    rows = []
    for i in hit[np.argsort(host_parts[hit, 0], kind="stable")]:
        k = int(j[i])
        left = allowance[k]
        if left <= 0:
            continue
        lo = max(host_parts[i, 0], ends[k])
        hi = min(host_parts[i, 1], lo + left)
        if hi > lo:
            rows.append((lo, hi))
            allowance[k] = left - (hi - lo)
    return iv.of(np.array(rows, dtype=np.float64).reshape(-1, 2))


def sync_spans_by_lane(calls: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """lane → (starts, ends) of its synchronisations (``host_activity.sync_calls``), sorted by
    end; an event wait (``host_activity.EVENT_WAIT_NAMES``) is not one: the host did not wait
    for the device to drain."""
    if not len(calls):
        return {}
    calls = calls[~calls["name"].isin(EVENT_WAIT_NAMES)]
    out = {}
    for lane, g in calls.groupby("lane", sort=False):
        g = g.sort_values("end_us", kind="stable")
        out[str(lane)] = (g["ts_us"].to_numpy(dtype=np.float64),
                          g["end_us"].to_numpy(dtype=np.float64))
    return out


def charged_sync(calls: pd.DataFrame, sync_idle: np.ndarray) -> pd.DataFrame:
    """The sync-charged idle time, split by the synchronisation each stretch belongs to: the
    call it lies in, else the last one that ended before it (within ``SYNC_TOL_US`` of its
    start): ``calls`` with ``idle_after_us`` added."""
    out = calls.copy()
    out["idle_after_us"] = 0.0
    if not len(calls) or not len(sync_idle):
        return out
    ts, ends = calls["ts_us"].to_numpy(), calls["end_us"].to_numpy()
    acc = covered_us(iv.of(sync_idle), ts, ends)      # the idle inside each call
    # The rest follows a synchronisation (not a copy or an event wait: nothing follows them).
    waits = np.flatnonzero(~calls["name"].isin(COPY_NAMES | EVENT_WAIT_NAMES).to_numpy())
    order = waits[np.argsort(ends[waits], kind="stable")]
    outside = iv.subtract(iv.of(sync_idle), iv.union(ts, ends))
    lengths = outside[:, 1] - outside[:, 0]
    j = np.searchsorted(ends[order], outside[:, 0] + SYNC_TOL_US, side="right") - 1
    ok = j >= 0
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
