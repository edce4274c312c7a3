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
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["rank", "offset_us", "uncertainty_us", "n", "source", "applied_us"]
SAME_HOST_US = 50_000.0


def _collective_pairs(inst: pd.DataFrame) -> dict[tuple[int, int], tuple[float, float, int]]:
    """(r, q) → (median of end_r − end_q, 1.4826·MAD, count) over shared collectives."""
    coll = inst[~inst["p2p"] & (inst["match_id"] != "")]
    if coll.empty:
        return {}
    ends = coll.pivot_table(index="match_id", columns="rank", values="end_us", aggfunc="first")
    out = {}
    ranks = list(ends.columns)
    for i, r in enumerate(ranks):
        for q in ranks[i + 1:]:
            d = (ends[r] - ends[q]).dropna()
            if d.empty:
                continue
            med = float(d.median())
            mad = float((d - med).abs().median()) * 1.4826
            out[(int(r), int(q))] = (med, mad, int(len(d)))
            out[(int(q), int(r))] = (-med, mad, int(len(d)))
    return out


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


def clock_offsets(inst: pd.DataFrame, p2p: pd.DataFrame | None, ranks: list[int],
                  hosts: dict[int, str | None] | None = None) -> pd.DataFrame:
    """Per rank offset against the lowest rank (module docstring); ``hosts``: rank → the
    host its trace was recorded on (None when unknown)."""
    if not ranks:
        return pd.DataFrame(columns=COLUMNS)
    evidence = [("collectives", _collective_pairs(inst)), ("send/recv", _p2p_pairs(p2p))]
    ranks = sorted(int(r) for r in ranks)
    known = {ranks[0]: (0.0, 0.0, 0, "reference")}
    while len(known) < len(ranks):
        best, best_key = None, None
        for order, (source, pairs) in enumerate(evidence):
            for (r, q), (est, unc, n) in pairs.items():
                if r in known or q not in known:
                    continue
                q_off, q_unc, _, _ = known[q]
                combined = float(np.hypot(q_unc, unc))
                key = (n < 2, combined, order, -n)        # smallest key wins
                if best_key is None or key < best_key:
                    best, best_key = (r, q_off + est, combined, n, source), key
        if best is None:
            break
        r, off, unc, n, src = best
        known[r] = (off, unc, n, src)
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


def align_instances(inst: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """The instance table with each rank's applied offset subtracted from its times."""
    if inst.empty or offsets.empty:
        return inst
    shift = inst["rank"].map(offsets.set_index("rank")["applied_us"]).fillna(0.0)
    out = inst.copy()
    for c in TIME_COLUMNS:
        out[c] = out[c] - shift
    return out


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
