"""Clock alignment: how far each rank's trace clock is from the reference rank's, estimated
before any cross-rank figure (pipeline windows, bubbles, waits, the dependency graph) and
applied to all of them.

Ranks on one host share a clock; ranks on different hosts disagree by up to seconds. Two kinds
of evidence, both from matched operations (``analysis/comm/matching.py``):

- **collectives**: the ranks of a group leave a collective nearly together, so for rank r and a
  reference q sharing collectives, offset(r) − offset(q) is the median of (end_r − end_q) over
  them; uncertainty 1.4826 × the median absolute deviation of those differences;
- **send/recv** (pipelines without collectives between two ranks): a message is received after
  it was sent, so each A → B message bounds offset(B) − offset(A) from above by
  (B's recv end − A's send post), and each B → A message bounds it from below; the estimate is
  the middle of the tightest bounds, its uncertainty half their distance (as NTP does).

Offsets chain from the lowest rank, each rank reached through the pair that gives it the
smallest combined uncertainty (the hypotenuse of its own and its partner's; Dijkstra's order):
a rank whose messages with a far rank are loose but whose collectives with a near one are
tight is aligned through the near one. A single shared collective says nothing about its
spread and is taken only when nothing else reaches the rank. An offset is applied —
subtracted from every time of that rank — when it exceeds twice its uncertainty; a smaller
one cannot be told from zero and is not. Ranks on the same host (the traces' ``host_name``)
share one clock, and what the evidence shows between them is the backends' own lag (a gloo worker thread closes its range a few milliseconds after
another's under load): there an offset is applied only beyond ``SAME_HOST_US`` — a trace whose
clock was shifted after the fact, say.

``clock_offsets(collectives, p2p)`` columns: rank, offset_us, uncertainty_us, n (operations
used), source (``reference``, ``collectives``, ``send/recv``, ``none``), applied_us.

**One alignment.** ``to_aligned_us(times_us, applied_us)`` is the only place a rank's offset
is applied: a time on the rank's own clock minus its ``applied_us`` is the time on the
reference rank's clock. ``applied_by_rank(offsets)`` reads the offsets table as rank →
applied_us (0 for a rank the table lacks). ``align_instances`` puts the instance table on the
aligned clock with it, once, in ``analyze``; the Perfetto export moves raw trace events with
it (``analysis/report/perfetto.py``); every other table is written on the clock that
summary.json's ``table_clocks`` names and read as it is.
"""
from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pandas as pd

from meshscope.analysis.codes import id_codes
from meshscope.analysis.records.steps import MAD_TO_SIGMA

COLUMNS = ["rank", "offset_us", "uncertainty_us", "n", "source", "applied_us"]
SAME_HOST_US = 50_000.0


# The differences of one rank's ends against others' made at once (``_collective_pairs``).
PAIR_BYTES = 4 << 20


def _column_medians(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The median of each column's ``n`` values that are not NaN (the mean of the middle two
    for an even count); ``np.nanmedian`` does the same through masked arrays, far slower."""
    x = np.sort(x, axis=0)                         # NaNs sort last
    lo = np.take_along_axis(x, ((n - 1) // 2)[None, :], axis=0)[0]
    hi = np.take_along_axis(x, (n // 2)[None, :], axis=0)[0]
    return (lo + hi) / 2


@dataclasses.dataclass
class _Collectives:
    """The collectives' evidence between every two ranks that share one, as parallel arrays
    with one entry per pair (a, b), a < b, numbered ``t`` in the order found (by a, then b):
    ``est`` estimates offset(a) − offset(b) (the median of end_a − end_b over the collectives
    both took part in), ``unc`` its uncertainty (1.4826 × the median absolute deviation), ``n``
    the count. Each pair gives two estimates: of a from b (numbered 2t) and of b from a (−est,
    2t + 1); the numbers break ties in the chaining. ``by_rank`` lists, for each rank, the
    pairs it is in (``rank → (first, last)`` into ``members``).

    Arrays, not a dict with a tuple per pair: a data-parallel group of n ranks has n² pairs,
    and at a thousand ranks the tuples were the larger part of the analysis' memory; nor
    rank × rank matrices, which would hold every pair of a job whose groups are small."""
    a: np.ndarray
    b: np.ndarray
    est: np.ndarray
    unc: np.ndarray
    n: np.ndarray
    members: np.ndarray
    by_rank: dict[int, tuple[int, int]]

    def gives(self, rank: int):
        """What ``rank``'s offset, once known, says of the others: (other ranks, est, unc, n,
        number), or None."""
        if rank not in self.by_rank:
            return None
        lo, hi = self.by_rank[rank]
        t = self.members[lo:hi]
        first = self.a[t] == rank
        return (np.where(first, self.b[t], self.a[t]),
                np.where(first, -self.est[t], self.est[t]), self.unc[t], self.n[t],
                np.where(first, 2 * t + 1, 2 * t))


def ends_by_rank(inst: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each matched collective's end on each rank: a collective × rank matrix (NaN where the
    rank took no part, or its end is unknown; a rank's first known end where it has several
    rows of one id), and the ranks of its columns, ascending. Filled from integer codes of the
    ids and ranks: a pivot table of the rows held a frame of them and the grouping's indexes,
    about 100 bytes a row, while the clocks were aligned (issue 51)."""
    ids = inst["match_id"].to_numpy()
    rows = np.flatnonzero(~inst["p2p"].to_numpy(dtype=bool) & (ids != ""))
    end = inst["end_us"].to_numpy(dtype=np.float64)[rows]
    rows, end = rows[~np.isnan(end)], end[~np.isnan(end)]
    codes, uniques = id_codes(ids[rows])
    ranks, rank_codes = np.unique(inst["rank"].to_numpy(dtype=np.int64)[rows],
                                  return_inverse=True)
    e = np.full((len(uniques), len(ranks)), np.nan)
    _, first = np.unique(codes * len(ranks) + rank_codes, return_index=True)
    e[codes[first], rank_codes[first]] = end[first]
    return e, ranks


def stacked_ends(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The matrices of ``ends_by_rank`` of parts of an instance table whose collectives
    are each all in one part, put together: their rows one under another, a column per rank
    of any part (NaN where a part has none of that rank)."""
    parts = [(e, r) for e, r in parts if e.size]
    if not parts:
        return np.full((0, 0), np.nan), np.zeros(0, dtype=np.int64)
    ranks = np.unique(np.concatenate([r for _, r in parts]))
    out = np.full((sum(len(e) for e, _ in parts), len(ranks)), np.nan)
    row = 0
    for e, r in parts:
        out[row:row + len(e), np.searchsorted(ranks, r)] = e
        row += len(e)
    return out, ranks


def _collective_pairs(e: np.ndarray, ranks: np.ndarray) -> _Collectives:
    """The collectives' evidence (``_Collectives``) from their ends by rank
    (``ends_by_rank``)."""
    parts: list[tuple] = []
    if e.size:
        # One rank against the later ranks, as many at once as make ``PAIR_BYTES`` of
        # differences: a few numpy passes per rank, and each pass's arrays (the differences,
        # their sorted copies) bounded — against every later rank at once they were the
        # matrix's size four times over (issue 51: 16,160 collectives × 128 ranks, 66 MB).
        width = max(1, PAIR_BYTES // (8 * len(e)))
        for i in range(len(ranks) - 1):
            for lo in range(i + 1, len(ranks), width):
                d = e[:, i:i + 1] - e[:, lo:lo + width]
                n = np.count_nonzero(~np.isnan(d), axis=0)
                shared = np.flatnonzero(n)
                if not shared.size:
                    continue
                d, n = d[:, shared], n[shared]
                med = _column_medians(d, n)
                mad = _column_medians(np.abs(d - med), n) * MAD_TO_SIGMA
                parts.append((np.full(len(shared), ranks[i]), ranks[lo + shared], med, mad, n))
    a, b, est, unc, n = (np.concatenate(x) for x in zip(*parts)) if parts else \
        (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0),
         np.zeros(0, dtype=np.int64))
    del parts
    pairs = np.arange(len(a))
    who = np.concatenate([a, b])
    order = np.argsort(who, kind="stable")
    members = np.concatenate([pairs, pairs])[order]
    ranks_in, first = np.unique(who[order], return_index=True)
    last = np.append(first[1:], len(order))
    return _Collectives(a, b, est, unc, n, members,
                        {int(r): (int(lo), int(hi)) for r, lo, hi in zip(ranks_in, first, last)})


def _p2p_pairs(p2p: pd.DataFrame) -> dict[tuple[int, int], tuple[float, float, int]]:
    """(b, a) → (estimate of offset_b − offset_a, uncertainty, count) from messages both
    ways; pairs with messages in one direction only give no estimate."""
    if p2p is None or p2p.empty:
        return {}
    bound = (p2p["completion_us"] - p2p["send_us"])
    upper = bound.groupby([p2p["src"], p2p["dst"]]).min()     # offset(dst) − offset(src) ≤ U
    count = p2p.groupby(["src", "dst"]).size()
    out = {}
    for (a, b), u in upper.items():
        if (b, a) not in upper.index:
            continue
        v = upper[(b, a)]                                      # offset(a) − offset(b) ≤ V
        est, unc = (u - v) / 2.0, (u + v) / 2.0
        out[(int(b), int(a))] = (float(est), float(max(unc, 0.0)),
                                 int(count[(a, b)] + count[(b, a)]))
    return out


SOURCES = ("collectives", "send/recv")


def clock_offsets(inst: pd.DataFrame | None, p2p: pd.DataFrame | None, ranks: list[int],
                  hosts: dict[int, str | None] | None = None,
                  ends: tuple[np.ndarray, np.ndarray] | None = None) -> pd.DataFrame:
    """Per rank offset against the lowest rank (module docstring); ``hosts``: rank → the
    host its trace was recorded on (None when unknown). ``ends``: the collectives' ends by
    rank (``ends_by_rank``) where the caller has them and not ``inst`` (the cross-rank stage
    gathers them a part of the table at a time, ``stacked_ends``)."""
    if not ranks:
        return pd.DataFrame(columns=COLUMNS)
    if ends is None:
        assert inst is not None, "clock_offsets needs the instance table or its ends"
        ends = ends_by_rank(inst)
    colls, p2ps = _collective_pairs(*ends), _p2p_pairs(p2p)
    del ends
    ranks = sorted(int(r) for r in ranks)
    # For each rank, the send/recv estimates it gives of other ranks once its own offset is
    # known (the collectives' come from ``_Collectives.gives``).
    p2p_gives: dict[int, list] = {}
    for index, ((r, q), (est, unc, n)) in enumerate(p2ps.items()):
        p2p_gives.setdefault(q, []).append((r, est, unc, n, index))
    known: dict[int, tuple] = {}
    best: dict[int, tuple] = {}
    # Dijkstra over (rank, partner) estimates: the frontier estimate with the smallest key is
    # taken next (a lone shared collective last, then the smallest combined uncertainty,
    # collectives before send/recv, more operations first, then the order found). An entry
    # joins the frontier only when its key beats the best one already there for its rank —
    # keys are unique, so the ranks are taken in the same order as with every entry pushed.
    frontier = [((False, 0.0, -1, 0, 0), ranks[0], 0.0, 0.0, 0, "reference")]

    def offer(off, unc, order, others, ests, uncs, ns, indices):
        combined = np.hypot(unc, np.asarray(uncs, dtype=np.float64)).tolist()
        for other, est, c, e_n, index in zip(others, ests, combined, ns, indices):
            if other in known:
                continue
            key = (e_n < 2, c, order, -e_n, index)
            if other in best and best[other] <= key:
                continue
            best[other] = key
            heapq.heappush(frontier, (key, other, off + est, c, e_n, SOURCES[order]))

    while frontier and len(known) < len(ranks):
        _, r, off, unc, n, src = heapq.heappop(frontier)
        if r in known:
            continue
        known[r] = (off, unc, n, src)
        mine = colls.gives(r)
        if mine is not None:
            offer(off, unc, 0, *(a.tolist() for a in mine))
        if r in p2p_gives:
            offer(off, unc, 1, *zip(*p2p_gives[r]))
    hosts = hosts or {}
    ref_host = hosts.get(ranks[0])
    rows = []
    for r in ranks:
        off, unc, n, src = known.get(r, (0.0, float("nan"), 0, "none"))
        floor = SAME_HOST_US if ref_host is not None and hosts.get(r) == ref_host else 0.0
        applied = off if src not in ("none", "reference") and abs(off) > max(2 * unc, floor) \
            else 0.0
        rows.append({"rank": r, "offset_us": off, "uncertainty_us": unc, "n": n,
                     "source": src, "applied_us": applied})
    return pd.DataFrame(rows, columns=COLUMNS)


TIME_COLUMNS = ("call_ts_us", "call_end_us", "exec_ts_us", "exec_end_us", "arrival_us",
                "end_us")


def applied_by_rank(offsets: pd.DataFrame | None) -> dict[int, float]:
    """rank → the offset the analysis applied to it (``applied_us``; NaN read as 0): what
    ``to_aligned_us`` subtracts. Empty for a missing or empty table."""
    if offsets is None or offsets.empty or not {"rank", "applied_us"} <= set(offsets.columns):
        return {}
    return {int(r): float(a) if pd.notna(a) else 0.0
            for r, a in zip(offsets["rank"], offsets["applied_us"])}


def to_aligned_us(times_us, applied_us):
    """Times on a rank's own clock → the reference rank's clock: ``times_us − applied_us``.
    Both may be scalars or arrays/Series of equal length (one offset per time)."""
    return times_us - applied_us


def align_instances(inst: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """The instance table with each rank's applied offset subtracted from its times
    (``to_aligned_us``); ``inst`` is left as it is."""
    if inst.empty or offsets.empty:
        return inst
    # Only the time columns are new: pandas copies a column on write (copy-on-write), so the
    # other columns are shared with ``inst`` rather than the whole table copied (issue 51).
    out = inst.copy(deep=False)
    shift_instances(out, offsets)
    return out


def shift_instances(inst: pd.DataFrame, offsets: pd.DataFrame) -> None:
    """``align_instances`` on ``inst`` itself: each time column replaced by its aligned one,
    so that a table nobody else holds is not kept on both clocks at once (issue 51: the six
    time columns of every rank's rows, twice, while the cross-rank stage aligned them)."""
    if inst.empty or offsets.empty:
        return
    shift = inst["rank"].map(applied_by_rank(offsets)).fillna(0.0).astype(float)
    for c in TIME_COLUMNS:
        inst[c] = to_aligned_us(inst[c], shift)


def describe(offsets: pd.DataFrame, step_us: float | None) -> list[str]:
    """One note per applied offset: "rank 1's clock is 10.02 s ahead of rank 0's (± 3 µs);
    aligned", saying when the offset is larger than a step."""
    notes = []
    if offsets.empty:
        return notes
    ref = int(offsets["rank"].min())
    for row in offsets.itertuples():
        if row.applied_us == 0:
            continue
        off = abs(row.applied_us)
        text = (f"{off / 1e6:.2f} s" if off >= 1e6 else f"{off / 1e3:.2f} ms" if off >= 1e3
                else f"{off:.0f} µs")
        unc = row.uncertainty_us
        unc_text = f"{unc / 1e3:.2f} ms" if unc >= 1e3 else f"{unc:.0f} µs"
        larger = " — more than a whole step" if step_us and off > step_us else ""
        notes.append(f"rank {row.rank}'s clock is {text} {'ahead of' if row.applied_us > 0 else 'behind'} "
                     f"rank {ref}'s (± {unc_text}, from {row.source}){larger}; aligned before "
                     f"every cross-rank figure")
    return notes
