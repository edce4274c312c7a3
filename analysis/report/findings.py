"""Findings: what is wrong with a run, ranked by the step time it costs, with the evidence and
the usual remedy.

Each finding is a dict: ``id``, ``severity`` (``high`` when it costs ≥ 10% of the step,
``medium`` ≥ 3%, else ``low``), ``dimension``, ``cost_us`` (estimated step time it costs,
mean per profiled step), ``cost_pct`` (of the mean step window), ``title``, ``evidence``
(the numbers behind it), ``remedy``, and ``what_if`` (the projected step time were it fixed,
with the assumption spelled out). Findings are sorted by cost, largest first.

- ``exposed-comm-<dim>``: communication of one dimension that nothing overlaps. Cost: its
  exposed time (per rank mean, the worst rank). What-if: hidden entirely behind compute.
- ``pipeline-bubble``: measured bubble above the schedule's theory. Cost: (measured − theory)
  × pipeline window, on the worst stage. What-if: the bubble at theory.
- ``stage-imbalance``: the slowest stage's compute per microbatch above the mean (max/mean >
  1.1). Cost: the excess × microbatches. What-if: every stage at the mean.
- ``straggler``: one rank arrives last to most collectives. Cost: the wait it caused per step.
  What-if: the straggler at the median rank's pace (its wait caused removed).
- ``hang``: ranks missing from a collective in the Flight Recorder dumps (always high and
  listed first; its cost is not a step time, so ``cost_us`` is null).
- ``slow-steps``: steps flagged slow by the step timers. Cost: their excess over the median.
"""
from __future__ import annotations

import pandas as pd

REMEDIES = {
    "pp": "more microbatches, or an interleaved / zero-bubble schedule",
    "tp": "sequence parallelism or asynchronous tensor parallelism, or a smaller tp degree",
    "dp": "a larger DDP bucket or a different ZeRO stage, and more compute to overlap with",
    "cp": "larger chunks per rank, or overlap the K/V exchange with more attention work",
    "ep": "capacity/load balancing of the router, or fewer expert-parallel ranks",
    "unknown": "find which process group it belongs to (record_param_comms / run.json)",
}


def _severity(pct: float) -> str:
    return "high" if pct >= 10 else "medium" if pct >= 3 else "low"


def _finding(fid, dimension, cost_us, window_us, title, evidence, remedy, what_if):
    pct = 100 * cost_us / window_us if window_us else 0.0
    return {"id": fid, "severity": _severity(pct), "dimension": dimension,
            "cost_us": float(cost_us), "cost_pct": float(pct), "title": title,
            "evidence": evidence, "remedy": remedy,
            "what_if": {"step_time_us": float(window_us - cost_us), "assumption": what_if}}


def findings(breakdown: pd.DataFrame, bubbles: pd.DataFrame, imbalance: dict | None,
             microbatches: int, straggler: dict | None, n_steps: int, hangs: pd.DataFrame,
             heatmap: pd.DataFrame) -> list[dict]:
    out = []
    if hangs is not None and not hangs.empty:
        miss = hangs[hangs["verdict"] == "missing"]
        first = (miss if not miss.empty else hangs).iloc[0]
        out.append({"id": "hang", "severity": "high", "dimension": "all", "cost_us": None,
                    "cost_pct": None, "title": str(first["detail"]),
                    "evidence": {k: (v if not hasattr(v, "tolist") else v.tolist())
                                 for k, v in first.items()},
                    "remedy": "see why those ranks never issued the collective (a code path "
                              "that skips it, an exception, a desynchronised schedule)",
                    "what_if": {"step_time_us": None, "assumption": "no hang"}})
    if breakdown.empty:
        return out
    per_rank = breakdown.groupby("rank").mean(numeric_only=True)
    window = float(per_rank["window_us"].mean())
    for col in [c for c in breakdown.columns if c.startswith("exposed_comm_") and c != "exposed_comm_us"]:
        dim = col[len("exposed_comm_"):-len("_us")]
        worst = per_rank[col].idxmax()
        cost = float(per_rank[col].max())
        if cost <= 0.01 * window:
            continue
        out.append(_finding(
            f"exposed-comm-{dim}", dim, cost, window,
            f"Exposed {dim} communication: {cost / 1000:.2f} ms per step on rank {worst}",
            {"exposed_us": cost, "rank": int(worst),
             "overlap_pct": float(per_rank.loc[worst, "overlap_pct"])},
            REMEDIES.get(dim, REMEDIES["unknown"]),
            f"all {dim} communication hidden behind compute"))
    if not bubbles.empty:
        stage = bubbles.groupby("stage").mean(numeric_only=True)
        excess = (stage["bubble_fraction"] - stage["theory_fraction"]) * stage["pipeline_window_us"]
        worst = excess.idxmax()
        if excess.max() > 0.01 * window:
            row = stage.loc[worst]
            out.append(_finding(
                "pipeline-bubble", "pp", float(excess.max()), window,
                f"Pipeline bubble {row['bubble_fraction']:.1%} on stage {worst}, theory "
                f"{row['theory_fraction']:.1%}",
                {"stage": int(worst), "bubble_fraction": float(row["bubble_fraction"]),
                 "theory_fraction": float(row["theory_fraction"]),
                 "replayed_fraction": float(row.get("replayed_bubble_fraction", float("nan")))},
                REMEDIES["pp"], "the bubble at the schedule's theoretical fraction"))
    if imbalance and imbalance["max_over_mean"] > 1.1:
        mean = imbalance["slowest_compute_per_mb_us"] / imbalance["max_over_mean"]
        cost = (imbalance["slowest_compute_per_mb_us"] - mean) * microbatches
        out.append(_finding(
            "stage-imbalance", "pp", cost, window,
            f"Stage {imbalance['slowest_stage']} is the slowest: "
            f"{imbalance['max_over_mean']:.2f}× the mean compute per microbatch",
            imbalance, "rebalance layers across stages (--stage-layers)",
            "every stage at the mean compute per microbatch"))
    if straggler and n_steps:
        cost = straggler["wait_caused_us"] / n_steps
        out.append(_finding(
            "straggler", "all", cost, window,
            f"Rank {straggler['rank']} is the straggler: last to {straggler['last_share']:.0%} "
            f"of collectives",
            straggler, "find what slows that rank (host, data loading, thermal, placement)",
            "the straggler at the other ranks' pace"))
    if heatmap is not None and not heatmap.empty and heatmap["slow"].any():
        worst = heatmap.groupby("step")["wall_time_us"].max()
        med = worst.median()
        slow = worst[heatmap.groupby("step")["slow"].any()]
        cost = float((slow - med).sum() / len(worst))
        out.append(_finding(
            "slow-steps", "all", cost, window,
            f"{len(slow)} slow step(s): {', '.join(map(str, slow.index.tolist()[:8]))}",
            {"steps": slow.index.tolist(), "median_step_us": float(med)},
            "look at what else ran then (checkpointing, evaluation, GC, another job)",
            "slow steps at the median step time"))
    # A hang first (it stops the job), then by cost.
    return sorted(out, key=lambda f: (f["id"] != "hang", -(f["cost_us"] or 0.0)))
