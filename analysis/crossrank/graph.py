"""The cross-rank dependency graph of one step, its replay, and its critical path.

Each rank's step is a chain of **points** in program order (``RankStep``): the moments it
*calls* an operation (arrives at a collective, posts a send or a recv) and the moments a
*wait* for an operation ends (it was blocked until the operation completed). Between two points
the rank spends ``own_us`` on its own work (everything that is not waiting). An operation
completes ``after_last_us`` after its last participant called it (its measured completion − last
call, ``matching.after_last_us``: not the bandwidth report's transfer, and for a send/recv it
may hold waiting as well); a wait ends at the later of
"the rank is ready" and "the operation completed" (plus the rank's measured resume latency).
Collectives join every rank of their group; a send/recv pair joins the two ranks.

``StepGraph.replay(scale)`` runs that model with each rank's own work multiplied by
``scale[rank]`` (a number, or one factor per point) and returns the step's makespan and every
point's time. With all factors 1 it reproduces the measured step (the measured waits are
exactly the model's). ``replay_each`` runs one such what-if per rank at once. The order in
which a replay times the points does not depend on the times (``StepGraph.order``, worked out
once per step), so every replay of a step walks the same order. ``critical_path`` walks back from the last rank to finish through the
binding dependency of each point: the rank's own previous point (its own work was binding) or
the last participant to call the operation it waited for (then the path crosses ranks,
through the operation's transfer).

This is the what-if engine of ``analysis/crossrank/whatif.py``: the saving of making a rank as
fast as its peers is the replayed makespan with its work at their pace, subtracted from the
replayed makespan as measured.

``critical_path`` columns: step, order (0 = first), rank, kind (``work`` — the rank's own
work; ``transfer`` — an operation completing once its last participant arrived), what (for
transfers: op and dimension), start_us, end_us, dur_us (times relative to the step's start).
"""
from __future__ import annotations

import dataclasses
import functools
from collections import Counter, defaultdict

import numpy as np
import pandas as pd

CALL, WAIT, END = "call", "wait", "end"
RELEASE = "release"   # in ``StepGraph.order``: a deadlocked wait released at its measured time
PATH_COLUMNS = ["step", "order", "rank", "kind", "what", "start_us", "end_us", "dur_us"]


# Point, RankStep and Operation have slots: a step's graph over every rank is a point per call
# and wait of each rank (~550 a rank and step of the 216k-event reference trace), and a point
# with an instance dictionary took ~100 bytes more (issue 51).
@dataclasses.dataclass(slots=True)
class Point:
    kind: str              # CALL, WAIT or END
    t_us: float            # measured time (aligned clock)
    own_us: float          # own work since the previous point
    mid: str = ""          # the operation called or waited for
    resume_us: float = 0.0  # WAIT: measured end − the operation's measured completion


@dataclasses.dataclass(slots=True)
class RankStep:
    rank: int
    start_us: float
    points: list[Point]    # in program order, the last one of kind END

    def segments(self) -> list[list[int]]:
        """Point indices grouped into segments that end at a call (and the last, at the end):
        the unit of comparison between peers, whose programs issue the same calls."""
        out, cur = [], []
        for i, p in enumerate(self.points):
            cur.append(i)
            if p.kind in (CALL, END):
                out.append(cur)
                cur = []
        if cur:
            out.append(cur)
        return out

    def call_ops(self, ops: dict[str, str]) -> tuple[str, ...]:
        return tuple(ops.get(p.mid, "?") for p in self.points if p.kind == CALL)

    @property
    def own_total_us(self) -> float:
        return float(sum(p.own_us for p in self.points))


@dataclasses.dataclass(slots=True)
class Operation:
    mid: str
    op: str
    dim: str
    participants: list[int]   # ranks that call it in this step
    after_last_us: float      # completion − last arrival, as measured (matching.after_last_us):
                              # what the replay takes once every participant is there; for a
                              # send/recv it holds waiting too, so it is not a transfer
    completion_us: float      # measured


class StepGraph:
    def __init__(self, step: int, ranks: dict[int, RankStep], ops: dict[str, Operation]):
        self.step, self.ranks, self.ops = step, ranks, ops
        self.t0 = min(r.start_us for r in ranks.values()) if ranks else 0.0
        # Where each operation is called: mid → [(rank, point index)].
        self._callers: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for r, rs in ranks.items():
            for i, p in enumerate(rs.points):
                if p.kind == CALL and p.mid in ops:
                    self._callers[p.mid].append((r, i))

    def measured_makespan_us(self) -> float:
        return max(rs.points[-1].t_us for rs in self.ranks.values()) - self.t0

    @functools.cached_property
    def order(self) -> tuple[list[tuple], dict[int, bool]]:
        """The order in which a replay times the points, and which ranks reach their end.

        Which rank runs, where it stops (at a wait for an operation that some participant has
        not called yet) and when it resumes (once the last call is made) depend on the graph
        alone, never on the times, so every replay of the step walks the same order; it is
        worked out once. Entries: ``(rank, point index, waits, calls)`` — ``waits`` when the
        point ends a wait for an operation that others call, ``calls`` when it calls one — and
        ``(RELEASE, mid)`` where every rank left waits for an operation some rank never calls:
        the oldest such wait is released at its measured time."""
        walk: list[tuple] = []
        pending = {mid: len(c) for mid, c in self._callers.items()}
        blocked: dict[str, list[int]] = defaultdict(list)
        nxt = {r: 0 for r in self.ranks}
        ready = list(self.ranks)
        while ready:
            r = ready.pop()
            rs, i = self.ranks[r], nxt[r]
            while i < len(rs.points):
                p = rs.points[i]
                waits = p.kind == WAIT and p.mid in self.ops and bool(self._callers.get(p.mid))
                if waits and pending[p.mid] > 0:
                    blocked[p.mid].append(r)
                    break
                calls = p.kind == CALL and p.mid in pending
                walk.append((r, i, waits, calls))
                if calls:
                    pending[p.mid] -= 1
                    if pending[p.mid] == 0:
                        ready.extend(blocked.pop(p.mid, []))
                i += 1
            nxt[r] = i
            if not ready and blocked:
                mid, waiting = next(iter(blocked.items()))
                del blocked[mid]
                pending[mid] = 0
                walk.append((RELEASE, mid))
                ready.extend(waiting)
        return walk, {r: nxt[r] == len(rs.points) for r, rs in self.ranks.items()}

    def _released_call_us(self, mid: str) -> float:
        """When the operation of a released wait counts as called: its measured completion
        less its ``after_last_us``."""
        return self.ops[mid].completion_us - self.ops[mid].after_last_us

    def replay(self, scale: dict[int, float | np.ndarray] | None = None,
               transfer_factor: dict[str, float] | None = None
               ) -> tuple[float, dict[int, np.ndarray], dict]:
        """(makespan, rank → point times, binding) with own work scaled by ``scale`` and the
        operations of dimension d taking ``transfer_factor[d]`` × their time;
        ``binding[(rank, i)]`` is (caller rank, caller index) where an operation set the time
        of point i, and absent where the rank's own work did (most points, which a thousand-
        rank step has hundreds of thousands of). A wait whose operation never gets all its
        calls (inconsistent input) ends at its measured time."""
        scale = scale or {}
        tf = transfer_factor or {}
        times = {r: np.full(len(rs.points), np.nan) for r, rs in self.ranks.items()}
        binding: dict[tuple[int, int], tuple[int, int]] = {}
        last_call: dict[str, tuple[float, tuple[int, int] | None]] = {}
        walk, _ = self.order
        for entry in walk:
            if entry[0] is RELEASE:
                last_call.setdefault(entry[1], (self._released_call_us(entry[1]), None))
                continue
            r, i, waits, calls = entry
            rs = self.ranks[r]
            p = rs.points[i]
            prev = times[r][i - 1] if i else rs.start_us
            f = scale.get(r, 1.0)
            t = prev + p.own_us * (f[i] if isinstance(f, np.ndarray) else f)
            if waits:
                arrive, who = last_call[p.mid]
                op = self.ops[p.mid]
                done = arrive + op.after_last_us * tf.get(op.dim, 1.0) + p.resume_us
                if done > t:
                    t = done
                    if who is not None:
                        binding[(r, i)] = who
            times[r][i] = t
            if calls and (p.mid not in last_call or t > last_call[p.mid][0]):
                last_call[p.mid] = (t, (r, i))
        ends = [times[r][-1] for r in self.ranks if len(times[r])]
        if any(np.isnan(e) for e in ends):
            return float("nan"), times, binding     # a wait whose op never got all its calls
        return float(max(ends) - self.t0), times, binding

    # What-ifs replayed side by side in one pass: each operation in flight holds a vector of
    # this many times. With one entry per rank whatever the job's size, a 1,024-rank step's
    # thousands of pipeline messages in flight held ranks × messages numbers at once.
    WHATIFS_PER_PASS = 256

    def replay_each(self, scales: dict[int, float | np.ndarray]) -> dict[int, float]:
        """rank → the makespan of ``replay({rank: scales[rank]})``, for every rank of
        ``scales``, ``WHATIFS_PER_PASS`` ranks to a pass over ``order``: each point's time is
        a vector with one entry per what-if, where only the entry of the point's own rank is
        scaled. The same arithmetic in the same order as ``replay``, so the numbers are the
        same to the last bit; the work is the graph's points once a pass, not once per rank."""
        who = list(scales)
        out: dict[int, float] = {}
        for lo in range(0, len(who), self.WHATIFS_PER_PASS):
            out.update(self._replay_side_by_side(
                {r: scales[r] for r in who[lo:lo + self.WHATIFS_PER_PASS]}))
        return out

    def _replay_side_by_side(self, scales: dict[int, float | np.ndarray]) -> dict[int, float]:
        """``replay_each`` for the ranks of ``scales``, in one pass."""
        who = list(scales)
        col = {r: j for j, r in enumerate(who)}
        n = len(who)
        if not n:
            return {}
        cur = {r: np.full(n, rs.start_us) for r, rs in self.ranks.items()}
        last_call: dict[str, np.ndarray] = {}
        walk, finished = self.order
        # An operation's vector of last-call times is dropped after its last wait: with a
        # vector per operation of every rank's pipeline messages kept to the end, the replay
        # held operations × ranks numbers, which grows with the square of the rank count.
        waiters = Counter(self.ranks[e[0]].points[e[1]].mid for e in walk
                          if e[0] is not RELEASE and e[2])
        for entry in walk:
            if entry[0] is RELEASE:
                if entry[1] not in last_call:
                    last_call[entry[1]] = np.full(n, self._released_call_us(entry[1]))
                continue
            r, i, waits, calls = entry
            p = self.ranks[r].points[i]
            prev = cur[r]
            t = prev + p.own_us
            j = col.get(r)
            if j is not None:
                f = scales[r]
                t[j] = prev[j] + p.own_us * (f[i] if isinstance(f, np.ndarray) else f)
            if waits:
                op = self.ops[p.mid]
                done = last_call[p.mid] + op.after_last_us + p.resume_us
                t = np.where(done > t, done, t)
                waiters[p.mid] -= 1
                if not waiters[p.mid]:
                    del last_call[p.mid]
            if calls:
                seen = last_call.get(p.mid)
                last_call[p.mid] = t if seen is None else np.where(t > seen, t, seen)
            cur[r] = t
        ends = [cur[r] if finished[r] else np.full(n, np.nan)
                for r, rs in self.ranks.items() if len(rs.points)]
        if not ends:
            return dict.fromkeys(who, float("nan"))
        stacked = np.vstack(ends)
        span = stacked.max(axis=0) - self.t0
        span[np.isnan(stacked).any(axis=0)] = np.nan
        return {r: float(span[col[r]]) for r in who}

    def critical_path(self, measured: tuple | None = None) -> pd.DataFrame:
        """The measured step's critical path (module docstring); ``measured``: ``replay()``'s
        result, when the caller has it already."""
        makespan, times, binding = measured or self.replay()
        rows = []
        if not self.ranks or np.isnan(makespan):
            return pd.DataFrame(columns=PATH_COLUMNS)
        r = max(self.ranks, key=lambda k: times[k][-1])
        i = len(self.ranks[r].points) - 1
        segs = []
        guard = sum(len(rs.points) for rs in self.ranks.values()) + 1
        while i >= 0 and guard > 0:
            guard -= 1
            end = times[r][i]
            who = binding.get((r, i))
            if who is not None:
                cr, ci = who
                op = self.ops[self.ranks[r].points[i].mid]
                segs.append((r, "transfer", f"{op.op} ({op.dim})", times[cr][ci], end))
                r, i = cr, ci
                continue
            start = times[r][i - 1] if i else self.ranks[r].start_us
            if end > start:
                segs.append((r, "work", "", start, end))
            i -= 1
        for order, (rank, kind, what, s, e) in enumerate(reversed(segs)):
            rows.append({"step": self.step, "order": order, "rank": rank, "kind": kind,
                         "what": what, "start_us": s - self.t0, "end_us": e - self.t0,
                         "dur_us": e - s})
        return pd.DataFrame(rows, columns=PATH_COLUMNS)


def waits_charged(graph: StepGraph, measured: tuple | None = None
                  ) -> list[tuple[int, int, float, float]]:
    """(waiting rank, rank charged, wait µs, end of the wait) for every wait of the measured
    step that the model says was binding. What is charged is the waiting that lateness caused:
    how much later than this rank the last participant called the operation (the operation's
    own transfer time is nobody's fault), at most the time waited. It is charged to the rank
    whose own work made the operation late: from the last participant to call it, back through
    calls that were themselves late only because their rank waited for another operation.
    ``measured``: ``graph.replay()``'s result, when the caller has it already."""
    makespan, times, binding = measured or graph.replay()
    out = []
    if np.isnan(makespan):
        return out
    for r, rs in graph.ranks.items():
        for i, p in enumerate(rs.points):
            who = binding.get((r, i))
            if who is None:
                continue
            prev = times[r][i - 1] if i else rs.start_us
            waited = times[r][i] - (prev + p.own_us)
            cr, ci = who
            if waited <= 0 or cr == r:   # the last to arrive: its "wait" is the operation itself
                continue
            own_call = next((times[r][j] for j in range(i - 1, -1, -1)
                             if rs.points[j].kind == CALL and rs.points[j].mid == p.mid), None)
            late = times[cr][ci] - own_call if own_call is not None else waited
            waited = min(waited, max(late, 0.0))
            if waited <= 0:
                continue
            for _ in range(64):       # follow late calls that only waited themselves
                crs = graph.ranks[cr]
                j = ci - 1
                own_since = crs.points[ci].own_us
                if j < 0 or own_since > 0.5 * waited:
                    break
                who2 = binding.get((cr, j))
                if crs.points[j].kind != WAIT or who2 is None:
                    break
                cr, ci = who2
            out.append((r, cr, float(waited), float(times[r][i])))
    return out
