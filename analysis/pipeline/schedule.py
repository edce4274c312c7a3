"""The pipeline report: microbatch timeline, schedule phases, stage imbalance, schedule replay.

``microbatch_table`` — one row per microbatch span of a profiled step (from the runner's
``meshscope/<phase> stage=S chunk=C mb=M`` annotations): rank, step, stage, chunk, mb, phase
(forward / backward / weight-grad), start_us and end_us relative to the step's pipeline window
start, dur_us.

``phase_table`` — per rank and step, the schedule's three phases as this rank saw them:
warmup_us from the pipeline window's start to the rank's first backward, cooldown_us from its
last forward's end to the window's end, steady_us the rest.

``imbalance_table`` — per stage (mean over profiled steps): compute_per_mb_us (forward +
backward + weight-grad time per microbatch) and ratio_to_mean; ``imbalance_summary`` gives
max/mean and names the slowest stage.

``replay`` — a small event simulation of each step: every rank runs its own microbatch spans in
the order it actually ran them, each taking its measured duration, but starting as soon as its
dependencies allow (forward of stage s after forward of s−1 for the same microbatch; backward
of s after backward of s+1 and its own forward; weight-grad after backward), with transfers
taking no time. The replayed bubble (1 − busy / replayed makespan) is what the schedule alone
explains given the measured compute; the gap to the measured bubble comes from elsewhere —
transfer time, launch overhead, contention for cores, a straggler.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.timeline.rank_timeline import RankTimeline
from meshscope.analysis.rank_order import in_rank_order

MB_COLUMNS = ["rank", "step", "stage", "chunk", "mb", "phase", "start_us", "end_us", "dur_us"]
PHASE_COLUMNS = ["rank", "step", "warmup_us", "steady_us", "cooldown_us"]
IMBALANCE_COLUMNS = ["stage", "compute_per_mb_us", "ratio_to_mean"]


def microbatch_table(timelines: dict[int, RankTimeline],
                     windows: dict[int, dict[int, object]]) -> pd.DataFrame:
    parts: dict[str, list[np.ndarray]] = {c: [] for c in MB_COLUMNS}
    for rank, tl in in_rank_order(timelines):
        mb = tl.microbatches
        if mb.empty:
            continue
        ts, end = mb["ts_us"].to_numpy(float), mb["end_us"].to_numpy(float)
        labels = {c: mb[c].to_numpy() for c in ("stage", "chunk", "mb", "phase")}
        for step, (s, e) in sorted(tl.steps.items()):
            win = windows.get(rank, {}).get(step)
            origin = float(win[0, 0]) if win is not None and len(win) else s
            inside = np.flatnonzero((ts >= s) & (end <= e))
            parts["rank"].append(np.full(len(inside), rank, dtype=np.int64))
            parts["step"].append(np.full(len(inside), step, dtype=np.int64))
            for c, values in labels.items():
                parts[c].append(values[inside])
            parts["start_us"].append(ts[inside] - origin)
            parts["end_us"].append(end[inside] - origin)
            parts["dur_us"].append(end[inside] - ts[inside])
    if not sum(len(x) for x in parts["rank"]):
        return pd.DataFrame(columns=MB_COLUMNS)
    return pd.DataFrame({c: np.concatenate(v) for c, v in parts.items()})


def phase_table(mb: pd.DataFrame, windows: dict[int, dict[int, object]]) -> pd.DataFrame:
    cols = PHASE_COLUMNS
    rows = []
    if mb.empty:
        return pd.DataFrame(rows, columns=cols)
    forward = mb["phase"] == "forward"
    first_bwd = mb[~forward].groupby(["rank", "step"])["start_us"].min().to_dict()
    last_fwd = mb[forward].groupby(["rank", "step"])["end_us"].max().to_dict()
    for rank, step in mb.groupby(["rank", "step"]).size().index:
        win = windows.get(rank, {}).get(step)
        if win is None or not len(win):
            continue
        total = float(win[0, 1] - win[0, 0])
        warm = float(first_bwd[rank, step]) if (rank, step) in first_bwd else total
        cool = total - float(last_fwd[rank, step]) if (rank, step) in last_fwd else 0.0
        rows.append({"rank": rank, "step": step, "warmup_us": warm,
                     "steady_us": max(total - warm - cool, 0.0), "cooldown_us": cool})
    return pd.DataFrame(rows, columns=cols)


def imbalance_table(mb: pd.DataFrame) -> pd.DataFrame:
    cols = IMBALANCE_COLUMNS
    if mb.empty:
        return pd.DataFrame(columns=cols)
    per = (mb.groupby(["stage", "step", "rank"])["dur_us"].sum()
           / mb.groupby(["stage", "step", "rank"])["mb"].nunique())
    stage = per.groupby("stage").mean().rename("compute_per_mb_us").reset_index()
    stage["ratio_to_mean"] = stage["compute_per_mb_us"] / stage["compute_per_mb_us"].mean()
    return stage[cols]


def imbalance_summary(table: pd.DataFrame) -> dict | None:
    """max/mean of compute per microbatch over stages, and the slowest stage."""
    if len(table) < 2:
        return None
    slowest = table.loc[table["compute_per_mb_us"].idxmax()]
    return {"max_over_mean": float(table["ratio_to_mean"].max()),
            "slowest_stage": int(slowest["stage"]),
            "slowest_compute_per_mb_us": float(slowest["compute_per_mb_us"])}


def _simulate(actions: dict[int, list[tuple]]) -> tuple[float, dict[int, float]]:
    """actions: rank → [(phase, stage, mb, dur_us)] in the order run. Returns the makespan and
    each rank's busy time."""
    done: dict[tuple, float] = {}
    free = {r: 0.0 for r in actions}
    nxt = {r: 0 for r in actions}
    last_stage = max(a[1] for acts in actions.values() for a in acts)

    def deps(phase, stage, mb):
        if phase == "forward":
            return [("forward", stage - 1, mb)] if stage > 0 else []
        if phase == "backward":
            out = [("forward", stage, mb)]
            return out + ([("backward", stage + 1, mb)] if stage < last_stage else [])
        return [("backward", stage, mb)]

    remaining = sum(len(a) for a in actions.values())
    while remaining:
        progressed = False
        for r, acts in actions.items():
            while nxt[r] < len(acts):
                phase, stage, mb, dur = acts[nxt[r]]
                need = deps(phase, stage, mb)
                if any(d not in done for d in need):
                    break
                start = max([free[r]] + [done[d] for d in need])
                free[r] = done[(phase, stage, mb)] = start + dur
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # spans missing from the trace: the replay cannot go on
            break
    busy = {r: sum(a[3] for a in acts) for r, acts in actions.items()}
    return (max(free.values()) if free else 0.0), busy


def replay(mb: pd.DataFrame, groups: list[list[int]]) -> pd.DataFrame:
    """Per rank and step: replayed_window_us and replayed_bubble_fraction (see module doc)."""
    cols = ["rank", "step", "replayed_window_us", "replayed_bubble_fraction"]
    rows = []
    at = mb.groupby("rank").indices if len(mb) else {}
    for group in groups:
        # The group's rows in the table's order (a filter of the whole table per group took
        # time of the square of the rank count).
        mine = [at[r] for r in group if r in at]
        sub = mb.iloc[np.sort(np.concatenate(mine))] if mine else mb.iloc[:0]
        for step, g in sub.groupby("step"):
            fields = [g[c].to_numpy() for c in ("phase", "stage", "mb", "dur_us")]
            start = g["start_us"].to_numpy()
            actions = {}
            for r, at_r in sorted(g.groupby("rank").indices.items()):
                order = at_r[np.argsort(start[at_r], kind="quicksort")]   # sort_values' sort
                actions[r] = list(zip(*(f[order].tolist() for f in fields)))
            makespan, busy = _simulate(actions)
            for r in actions:
                rows.append({"rank": r, "step": step, "replayed_window_us": makespan,
                             "replayed_bubble_fraction": 1 - busy[r] / makespan
                             if makespan > 0 else float("nan")})
    return pd.DataFrame(rows, columns=cols)
