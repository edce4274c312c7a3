"""The checks across ranks, on the small tables the cross-rank stage holds
(``report/analyze.py``; docs/metrics.md "Trust" gives each threshold and why).

- ``missing-ranks`` — ranks of the job (run.json's world size, else the traces'
  ``distributedInfo.world_size``) without a usable trace: every cross-rank number covers the
  ranks present only. A caveat.
- ``different-steps`` — ranks that profiled other steps than the rest: the cross-rank numbers
  of a step cover only the ranks that profiled it. A caveat.
- ``collective-counts`` — ranks of one process group (those of its members that have a trace)
  that issued different numbers of one collective over the steps they all profiled: a
  group's ranks run the same collectives, so a trace lost some (subsampled, or the activity
  buffer filled). A caveat.
- ``clock-offsets`` — ranks whose clock differed from the reference rank's by more than twice
  the estimate's own uncertainty, so that it was corrected (``crossrank/clocks.py``): the
  cross-rank times rest on that correction, right to within its uncertainty. A caveat; not
  trustworthy when the uncertainty exceeds ``OFFSET_UNTRUSTED_PCT`` of the median step.
"""
from __future__ import annotations

import pandas as pd

from meshscope.analysis.comm.matching import CollectiveCounts
from meshscope.analysis.trust.measured import Measured, pct
from meshscope.vocabulary import TrustCheckId as C

OFFSET_UNTRUSTED_PCT = 10.0


def run_checks(ranks: list[int], world_size: int | None, breakdown: pd.DataFrame,
               instances: pd.DataFrame | CollectiveCounts, offsets: pd.DataFrame,
               step_us: float | None) -> list[Measured]:
    """Every check across ranks (module docstring), passed or not. ``breakdown``: the step
    breakdown (its ``rank`` and ``step`` say which steps each rank profiled); ``instances``:
    the aligned instance table, or its collectives counted (``matching.CollectiveCounts``: the
    cross-rank stage does not hold the table whole); ``offsets``: ``clock_offsets``;
    ``step_us``: the headline."""
    return [_missing(ranks, world_size), _steps(breakdown), _counts(instances, breakdown),
            _offsets(offsets, step_us)]


def _missing(ranks: list[int], world: int | None) -> Measured:
    if not world or world <= 1:
        return Measured(C.MISSING_RANKS, None, (), 0, world)
    gone = sorted(set(range(world)) - set(ranks))
    n = len(gone)
    shown = ", ".join(map(str, gone[:8])) + ("…" if n > 8 else "")
    return Measured(C.MISSING_RANKS, "caveat" if n else None, tuple(gone), n, world, None,
                    pct(n, world),
                    text=f"{n} of the job's {world} ranks have no usable trace ({shown}): "
                         f"cross-rank numbers cover the {len(ranks)} present" if n else "")


def _steps(breakdown: pd.DataFrame) -> Measured:
    if breakdown.empty:
        return Measured(C.DIFFERENT_STEPS, None, (), 0)
    sets = breakdown.groupby("rank")["step"].agg(lambda s: tuple(sorted(set(int(x) for x in s))))
    if sets.nunique() <= 1:
        return Measured(C.DIFFERENT_STEPS, None, (), 0, len(sets))
    common = sets.value_counts().index[0]
    odd = sets[sets != common]
    union = set().union(*sets.tolist())
    steps = tuple(sorted(union - set.intersection(*(set(s) for s in sets.tolist()))))
    first = odd.index[0]
    return Measured(C.DIFFERENT_STEPS, "caveat", tuple(int(r) for r in odd.index), len(odd),
                    len(sets), steps=steps,
                    text=f"{len(odd)} of {len(sets)} ranks profiled other steps than the rest "
                         f"(rank {first}: {list(odd[first])}, most: {list(common)}): the "
                         f"cross-rank numbers of steps {list(steps)} cover only the ranks "
                         f"that profiled them")


def _counts(instances: pd.DataFrame | CollectiveCounts, breakdown: pd.DataFrame) -> Measured:
    cc = instances if isinstance(instances, CollectiveCounts) else \
        CollectiveCounts.of(instances)
    if not cc.rows:
        return Measured(C.COLLECTIVE_COUNTS, None, (), 0)
    counts = cc.counts[cc.counts.index.get_level_values("pg_ranks") != ""]
    if not breakdown.empty:
        sets = breakdown.groupby("rank")["step"].agg(lambda s: set(int(x) for x in s))
        common = set.intersection(*sets.tolist()) if len(sets) else set()
        counts = counts[counts.index.get_level_values("step").isin(common)]
    present = cc.present
    uneven, groups, example = set(), 0, ""
    for group, g in counts.groupby(level="pg_ranks"):
        members = [int(x) for x in str(group).split(",") if int(x) in present]
        if len(members) < 2:
            continue
        groups += 1
        per_rank = g.groupby(level=["op", "rank"]).sum().unstack("rank") \
            .reindex(columns=members).fillna(0).astype(int)
        bad = per_rank[per_rank.nunique(axis=1) > 1]
        if len(bad):
            row = bad.iloc[0]
            uneven |= {int(r) for r, v in row.items() if v != row.max()}
            example = example or (f"group {{{str(group)[:40]}}}: {bad.index[0]} "
                                  f"{dict(sorted(row.to_dict().items())[:4])}")
    n = len(uneven)
    return Measured(C.COLLECTIVE_COUNTS, "caveat" if n else None, tuple(sorted(uneven)), n,
                    groups,
                    text=f"ranks of one process group issued different numbers of a "
                         f"collective over the same steps ({example}): the traces lost some "
                         f"(subsampled, or a full activity buffer) — waits, bandwidth and "
                         f"matching rest on the ones seen" if n else "")


def _offsets(offsets: pd.DataFrame, step_us: float | None) -> Measured:
    if offsets.empty or "applied_us" not in offsets:
        return Measured(C.CLOCK_OFFSETS, None, (), 0)
    moved = offsets[offsets["applied_us"].fillna(0.0).abs() > 0]
    if moved.empty:
        return Measured(C.CLOCK_OFFSETS, None, (), 0, len(offsets))
    worst = moved.loc[moved["uncertainty_us"].fillna(0.0).idxmax()]
    unc = float(worst["uncertainty_us"] or 0.0)
    share = pct(unc, step_us) if step_us else None
    sev = "untrustworthy" if share is not None and share > OFFSET_UNTRUSTED_PCT else "caveat"
    big = moved.loc[moved["applied_us"].abs().idxmax()]
    return Measured(C.CLOCK_OFFSETS, sev, tuple(int(r) for r in moved["rank"]), len(moved),
                    len(offsets), float(abs(big["applied_us"])), share,
                    text=f"{len(moved)} rank clocks differed from the reference's beyond their "
                         f"uncertainty and were corrected (rank {int(big['rank'])} by "
                         f"{float(big['applied_us']) / 1e3:,.2f} ms; the least sure ±"
                         f"{unc / 1e3:,.2f} ms): cross-rank times rest on that correction")
