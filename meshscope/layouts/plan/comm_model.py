"""How long one collective takes: from a measured table, or from a latency and a bandwidth.

``CommModel.time_us(op, n, size_bytes)`` answers from, in order:

1. a **table** of measured times (``time_us`` by ``op``, ``n_ranks``, ``size_bytes``): a
   ``meshscope bench-comm`` baseline or nccl-tests output (``analysis.comm.nccl_tests``), or
   the transfers measured in a run (``plan --from``). Between two measured sizes the time is
   interpolated linearly in size (a latency plus bytes over a bandwidth, piecewise) and
   extended beyond them along the end segment (a single measured size: along the α-β line of
   ``busbw_gbps`` through it), never below the latency floor ``alpha_us``. A group size the table lacks for that op is scaled
   from the nearest one by nccl-tests' bus factor, busbw being what stays constant across
   group sizes; an op the table lacks (send/recv answer for each other and for
   ``send_recv``) is timed as the table's all_reduce moving the same bus traffic.
2. otherwise ``alpha_us + S · f(op, n) / busbw`` — an α-β model with the bus factor f of
   ``analysis.comm.bandwidth`` (nccl-tests' definitions).
"""
from __future__ import annotations

import dataclasses
import math

from meshscope.theory.bus_factors import bus_factor

_P2P = ("send", "recv", "send_recv")


@dataclasses.dataclass
class CommModel:
    alpha_us: float = 50.0
    busbw_gbps: float = 1.0
    table: dict[tuple[str, int], list[tuple[float, float]]] = dataclasses.field(
        default_factory=dict)     # (op, n) -> sorted [(size_bytes, time_us)]
    source: str = "assumed"

    @classmethod
    def from_rows(cls, rows, *, alpha_us: float = 50.0, busbw_gbps: float = 1.0,
                  source: str = "table") -> "CommModel":
        """From rows with ``op``, ``n_ranks``, ``size_bytes``, ``time_us`` (a DataFrame's
        ``itertuples()`` or dicts). Sizes within 25% of each other are one point, their
        median size and median time — so that two nearly equal sizes timed under different
        conditions (two pipeline stages' gradient buckets) never make a slope."""
        acc: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for r in rows:
            get = (lambda k: r[k]) if isinstance(r, dict) else (lambda k: getattr(r, k))
            op, n, s, t = get("op"), int(get("n_ranks")), float(get("size_bytes")), \
                float(get("time_us"))
            if op in _P2P:
                op = "send_recv"
            if (n >= 2 or op == "send_recv") and s > 0 and t > 0 and math.isfinite(t):
                acc.setdefault((op, n), []).append((s, t))
        table: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for key, pts in acc.items():
            pts.sort()
            clusters: list[list[tuple[float, float]]] = []
            for p in pts:
                if clusters and p[0] <= clusters[-1][0][0] * 1.25:
                    clusters[-1].append(p)
                else:
                    clusters.append([p])
            table[key] = [(sorted(x[0] for x in c)[len(c) // 2],
                           sorted(x[1] for x in c)[len(c) // 2]) for c in clusters]
        return cls(alpha_us=alpha_us, busbw_gbps=busbw_gbps, table=table, source=source)

    def merged(self, other: "CommModel") -> "CommModel":
        """This table, with ``other``'s entries for the (op, n) this one lacks."""
        table = dict(other.table)
        table.update(self.table)
        return CommModel(self.alpha_us, self.busbw_gbps, table,
                         f"{self.source} + {other.source}")

    def _interp(self, points: list[tuple[float, float]], s: float, op: str, n: int) -> float:
        """Piecewise linear through the measured points; beyond them the end segment's slope
        (one point: the latency-bandwidth line of ``busbw_gbps`` through it), never below
        the latency floor min(alpha_us, the smallest time)."""
        floor = min(self.alpha_us, points[0][1])
        if len(points) == 1:
            (s0, t0), = points
            slope = bus_factor(op, max(n, 2)) / (self.busbw_gbps * 1e3)   # µs per byte
            return max(floor, t0 + (s - s0) * slope)
        if s <= points[0][0]:
            (s0, t0), (s1, t1) = points[0], points[1]
        elif s >= points[-1][0]:
            (s0, t0), (s1, t1) = points[-2], points[-1]
        else:
            (s0, t0), (s1, t1) = next(((a, b) for a, b in zip(points, points[1:])
                                       if a[0] <= s <= b[0]))
        slope = max(0.0, (t1 - t0) / (s1 - s0))
        return max(floor, t0 + (s - s0) * slope)

    def time_us(self, op: str, n: int, size_bytes: float) -> float:
        if size_bytes <= 0 or (n <= 1 and op not in _P2P):
            return 0.0
        key_op = "send_recv" if op in _P2P else op
        sizes = [k[1] for k in self.table if k[0] == key_op]
        if sizes:
            n0 = min(sizes, key=lambda x: (abs(x - n), -x))
            t = self._interp(self.table[(key_op, n0)], size_bytes, key_op, n0)
            if n0 != n and key_op != "send_recv":
                t *= bus_factor(key_op, n) / bus_factor(key_op, n0)
            return t
        if any(k[0] == "all_reduce" for k in self.table) and n > 1:
            f_ar = bus_factor("all_reduce", n)
            return self.time_us("all_reduce", n, size_bytes * bus_factor(op, n) / f_ar)
        return self.alpha_us + size_bytes * bus_factor(op, max(n, 2)) / (
            self.busbw_gbps * 1e3)

    def describe(self) -> str:
        if self.table:
            ops = sorted({f"{op}(n={n})" for op, n in self.table})
            return f"{self.source}: {', '.join(ops)}"
        return f"{self.source}: latency {self.alpha_us:g} µs, bus bandwidth " \
               f"{self.busbw_gbps:g} GB/s"
