"""A bounded copy of a device's allocated and reserved series — ``report/memory_curve.parquet``,
what the Memory page draws and the Perfetto export's counters carry.

A rank can have millions of memory events; the page needs a few thousand points. The series is
cut into ``points // 2`` buckets of equal event count and each bucket keeps its lowest and its
highest allocated point, in time order (a min–max envelope: every peak and every trough of the
series is drawn at its height, which evenly spaced samples would miss); the series' own peak
is always kept. A series with fewer events than ``points`` is kept whole.

Columns (``COLUMNS``): ``rank``, ``device``, ``ts_us`` (the rank's own clock),
``allocated_bytes``, ``reserved_bytes`` (null where unknown), ``step`` (the profiled step
whose host range holds the point; -1 outside them).
"""
from __future__ import annotations

import numpy as np

from meshscope.analysis.memory.series import Series

COLUMNS = ["rank", "device", "ts_us", "allocated_bytes", "reserved_bytes", "step"]
POINTS = 4000


def envelope(values: np.ndarray, points: int = POINTS) -> np.ndarray:
    """Indices of the points kept of ``values`` (module docstring), sorted."""
    n = len(values)
    if n <= points:
        return np.arange(n)
    buckets = max(points // 2, 1)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = [int(np.argmax(values))]
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            part = values[a:b]
            keep += [a + int(np.argmin(part)), a + int(np.argmax(part))]
    return np.unique(np.array(keep, dtype=np.int64))


def curve_rows(rank: int, s: Series, host_steps: dict[int, tuple[float, float]],
               points: int = POINTS) -> dict[str, np.ndarray]:
    """The kept points of ``s`` as columns (``COLUMNS``)."""
    idx = envelope(s.allocated, points)
    ts = s.ts_us[idx]
    step = np.full(len(idx), -1, dtype=np.int64)
    for k, (a, b) in host_steps.items():
        step[(ts >= a) & (ts <= b)] = k
    return {"rank": np.full(len(idx), rank, dtype=np.int64),
            "device": np.full(len(idx), s.device, dtype=object), "ts_us": ts,
            "allocated_bytes": s.allocated[idx],
            "reserved_bytes": s.reserved[idx].astype(np.float64) if s.reserved is not None
            else np.full(len(idx), np.nan), "step": step}
