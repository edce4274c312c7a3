"""Cross-rank timing: clock alignment, arrival skew, waits, and the straggler.

**Instances.** ``rank_collectives`` lists every collective (on CPU traces point-to-point is
excluded; on GPUs every NCCL kernel counts, as all-to-all runs as SendRecv) of one rank in the
profiled steps: rank, step, group (its ranks, ``"0,1"``), dim, op, k (its index
among the rank's collectives of that group and op in that step), arrival_us and end_us. On
CPU/gloo traces the arrival is the calling thread's ``c10d::`` call (the rank is ready to
reduce) and the end is the end of the ``gloo:`` range paired with it
(``collectives.gloo_pairs``); on GPU traces
both come from the NCCL kernel (it starts when launched and spins until every rank arrives).
The group comes from the trace's own process-group arguments where present, else from
run.json via the collective's dimension (``timeline.comm_dimension``).

**Matching.** An instance is matched across ranks by (group, step, op, k) — order within the
group, as the ranks of a group issue its collectives in the same order. If some rank of a group
is absent, or the ranks of a group saw different numbers of collectives in a step (a trace
subsampled or cut short), the group cannot be matched and ``analyze`` says so rather than
inventing skews.

**Clocks.** Ends of a matched collective are nearly simultaneous, so rank r's clock offset
against the group's lowest rank is the median of (end_r − end_ref); offsets chain across groups
to the lowest rank overall. Uncertainty: 1.4826 × the median absolute deviation of those
differences (the spread of end times, which bounds how well the offset is known). An offset
larger than twice its uncertainty is subtracted from every arrival of that rank before skews and
waits are computed; a smaller one cannot be told from zero and is not applied.

**Waits and the straggler.** Per matched instance: skew_us = latest − earliest arrival,
holdup_us = latest − second-latest arrival (how long the last rank alone held the group up),
and each rank's wait = latest arrival − its arrival. Per rank: last_count (instances it arrived
last to), last_share, wait_caused_us — over steps, the largest holdup_us of the instances it
arrived last to in that step (collectives of one step overlap in time, so they are not added)
— and wait_us, likewise its own largest wait per step, summed. The straggler is the rank that
caused the most wait; the evidence is its last_share and wait_caused_us.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.ingest import classify
from meshscope.analysis.comm.bandwidth import canonical_op
from meshscope.analysis.comm.collectives import gloo_pairs, rank_groups
from meshscope.analysis.timeline.rank_timeline import comm_dimension, scope_at

INSTANCE_COLUMNS = ["rank", "step", "group", "dim", "op", "k", "arrival_us", "end_us"]


def rank_collectives(tr, tl, run: dict | None) -> pd.DataFrame:
    """The collective instances of one rank (``tr`` its RankTrace, ``tl`` its timeline)."""
    ev = tr.events
    comm = ev[ev["kind"] == classify.COMMUNICATION]
    groups = rank_groups(tr.rank, run, tr.meta)
    if tl.on_gpu:
        # NCCL runs all-to-all as SendRecv kernels: on a GPU every communication kernel counts.
        events = [(k.name, k.ts_us, k.end_us, canonical_op(k.name) or k.name,
                   getattr(k, "pg_ranks", None)) for k in comm[comm["device"]].itertuples()]
    else:
        events = [(call.name, call.ts_us, rng.end_us, op, None)
                  for call, rng, op in gloo_pairs(comm, p2p=False)]
    events.sort(key=lambda x: x[1])
    rows = []
    for step, (s, e) in sorted(tl.steps.items()):
        counters: dict = {}
        for name, ts, end, op, pg in events:
            if not s <= ts < e:
                continue
            dim = comm_dimension(name, run, scope_at(tl.scopes, ts))
            group = pg if isinstance(pg, str) and pg else groups.get(dim, "")
            k = counters.get((group, op), 0)
            counters[(group, op)] = k + 1
            rows.append({"rank": tr.rank, "step": step, "group": group, "dim": dim, "op": op,
                         "k": k, "arrival_us": ts, "end_us": end})
    return pd.DataFrame(rows, columns=INSTANCE_COLUMNS)


def matchability(table: pd.DataFrame, ranks: list[int], world_size: int | None = None
                 ) -> list[str]:
    """Why groups cannot be matched (empty when every group can)."""
    why = []
    if table.empty:
        return why
    if world_size and len(ranks) < world_size:
        why.append(f"only {len(ranks)} of the job's {world_size} ranks have a trace: "
                   f"collectives whose other ranks are absent have nothing to match")
    for group, g in table.groupby("group"):
        if not group:
            why.append(f"{len(g)} collectives with no known process group (no run.json and no "
                       f"group arguments on them in the traces)")
            continue
        members = [int(x) for x in group.split(",")]
        absent = [r for r in members if r not in ranks]
        if absent:
            why.append(f"group {{{group[:60]}}}: {len(absent)} of its {len(members)} ranks have "
                       f"no trace")
            continue
        counts = g.groupby(["step", "op", "rank"]).size().unstack("rank")
        uneven = counts[counts.nunique(axis=1) > 1]
        if not uneven.empty:
            step, op = uneven.index[0]
            seen = uneven.iloc[0].dropna().astype(int).to_dict()
            why.append(f"group {{{group}}}: ranks saw different numbers of {op} in step {step} "
                       f"({seen}); the traces are incomplete or subsampled")
    return why


def clock_offsets(table: pd.DataFrame) -> pd.DataFrame:
    """rank, offset_us (estimated), uncertainty_us, n (matched instances used), applied_us
    (the offset subtracted from the rank's times: the estimate when it exceeds twice its
    uncertainty, else 0 — an offset the data cannot tell from zero is not applied)."""
    cols = ["rank", "offset_us", "uncertainty_us", "n", "applied_us"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    ends = table.dropna(subset=["end_us"]).pivot_table(
        index=["group", "step", "op", "k"], columns="rank", values="end_us")
    ranks = sorted(table["rank"].unique())
    offset = {ranks[0]: (0.0, 0.0, 0)}
    changed = True
    while changed:
        changed = False
        for r in ranks:
            if r in offset:
                continue
            for ref, (ref_off, ref_unc, _) in list(offset.items()):
                if r not in ends or ref not in ends:
                    continue
                d = (ends[r] - ends[ref]).dropna()
                if d.empty:
                    continue
                med = float(d.median())
                mad = float((d - med).abs().median()) * 1.4826
                offset[r] = (ref_off + med, float(np.hypot(ref_unc, mad)), int(len(d)))
                changed = True
                break
    return pd.DataFrame([{"rank": r, "offset_us": o, "uncertainty_us": u, "n": n,
                          "applied_us": o if abs(o) > 2 * u else 0.0}
                         for r, (o, u, n) in sorted(offset.items())], columns=cols)


def waits(table: pd.DataFrame, offsets: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(instances: group, step, op, k, skew_us, holdup_us, last_rank; per rank: rank,
    instances, last_count, last_share, wait_caused_us, wait_us)."""
    off = offsets.set_index("rank")["applied_us"] if not offsets.empty else pd.Series(dtype=float)
    t = table.assign(arrival=table["arrival_us"] - table["rank"].map(off).fillna(0.0))
    inst_rows, waited = [], []
    for key, g in t.groupby(["group", "step", "op", "k"]):
        if len(g) < 2:
            continue
        arr = g.sort_values("arrival")
        latest = float(arr["arrival"].iloc[-1])
        inst_rows.append({"group": key[0], "step": key[1], "op": key[2], "k": key[3],
                          "skew_us": latest - float(arr["arrival"].iloc[0]),
                          "holdup_us": latest - float(arr["arrival"].iloc[-2]),
                          "last_rank": int(arr["rank"].iloc[-1])})
        for r, a in zip(arr["rank"], arr["arrival"]):
            waited.append({"rank": int(r), "step": key[1], "wait": latest - float(a)})
    inst = pd.DataFrame(inst_rows, columns=["group", "step", "op", "k", "skew_us", "holdup_us",
                                            "last_rank"])
    cols = ["rank", "instances", "last_count", "last_share", "wait_caused_us", "wait_us"]
    if inst.empty:
        return inst, pd.DataFrame(columns=cols)
    w = pd.DataFrame(waited)
    # Collectives of one step overlap in time, so per step only the largest counts.
    wait_us = w.groupby(["rank", "step"])["wait"].max().groupby("rank").sum()
    count = w.groupby("rank").size()
    caused = inst.groupby(["last_rank", "step"])["holdup_us"].max().groupby("last_rank").sum()
    last = inst.groupby("last_rank").size()
    ranks = pd.DataFrame({"rank": count.index, "instances": count.values})
    ranks["last_count"] = ranks["rank"].map(last).fillna(0).astype(int)
    ranks["last_share"] = ranks["last_count"] / ranks["instances"]
    ranks["wait_caused_us"] = ranks["rank"].map(caused).fillna(0.0)
    ranks["wait_us"] = ranks["rank"].map(wait_us).fillna(0.0)
    return inst, ranks[cols]


def verdict(per_rank: pd.DataFrame) -> dict | None:
    if per_rank.empty or per_rank["wait_caused_us"].max() <= 0:
        return None
    top = per_rank.loc[per_rank["wait_caused_us"].idxmax()]
    return {"rank": int(top["rank"]), "wait_caused_us": float(top["wait_caused_us"]),
            "last_share": float(top["last_share"]), "instances": int(top["instances"])}


def step_heatmap(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step (all steps, from the step timers): wall_time_us and slow — the step's
    slowest rank took more than median + 3 × 1.4826 × MAD of all steps' slowest times."""
    cols = ["rank", "step", "wall_time_us", "slow"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    worst = steps.groupby("step")["wall_time_us"].max()
    med = worst.median()
    mad = (worst - med).abs().median() * 1.4826
    slow_steps = set(worst[worst > med + 3 * max(mad, 1e-9)].index)
    out = steps[["rank", "step", "wall_time_us"]].copy()
    out["slow"] = out["step"].isin(slow_steps)
    return out[cols]
