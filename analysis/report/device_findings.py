"""Findings about one rank's own time, for any number of ranks (one included): where its GPU idles,
what its communication leaves exposed, how well its matrix multiplications run.

Each reads the report's tables (``idle``, ``breakdown``, ``sync_calls``, ``kernels``, ``gemms``,
``collectives``) through ``findings.FindingInputs`` and costs what fixing it would save per
step. A job's ranks meet at their collectives, so a stall on any rank holds up every rank: the
cost of a per-rank stall is, per step, its largest value over the ranks, averaged over the
profiled steps (``_worst_per_step``); for one rank, its own mean.

- ``data-loading-stall`` — device idle while the host is in the data loader
  (``idle_dataloader_us``); remedy: more loader workers, pinned memory, prefetching.
- ``sync-stall`` — device idle while the host is in a blocking synchronisation or because one
  emptied its queue (``idle_sync_us``); evidence: the synchronisation that left the device idle
  longest, the operator it was called from (``aten::item`` …) and its Python frame; a wait for
  another stream's event and a copy from pageable memory are named as such, with their own
  remedies (``SYNC_REMEDY``).
- ``launch-bound`` — device idle while the host launches (``idle_launch_us``) and work queued
  behind launch latency (``idle_queued_us``), less the slow first launches
  (``slow_launch_us``), when the kernels are short (a mean under ``SHORT_KERNEL_US``): CUDA
  graphs, ``torch.compile``, fused kernels — never "capture the step in a CUDA graph" to a job
  that replays graphs already (``_graph_remedy``), and no finding at all on a trace that
  captures graphs and replays none.
- ``memcpy-on-critical-path`` — memcpy/memset with neither compute nor communication beside it
  (the breakdown's ``other_us``): pinned memory, ``non_blocking=True``, copies on a side stream.
- ``exposed-comm-<dim>`` without a cross-rank what-if (one rank, or ranks whose collectives do
  not match: not in ``F.FindingInputs.whatif_dims``): what full overlap would save, which is the
  exposed time itself; with the what-if, never more than the exposed time
  (``findings._exposed``).
- ``arrival-jitter`` — the ranks wait for each other at their collectives, but no rank is the
  straggler (its what-if saving does not stand above the noise, or the last to arrive
  changes); cost: the mean wait per rank and step. Where one rank causes most of the waiting
  (``CAUSED_MOST`` of the waits charged, ``wait_caused_us``) and arrives last more often than
  chance would make one of the ranks (``last_by_chance`` below ``CHANCE_AT_MOST``), the
  finding names it — the waits are that rank's, not noise — and says why it is not a
  straggler; where one rank causes most of it but is last no more often than chance would
  make it, the finding gives its share and that chance; otherwise the waits are noise in arrival times and the finding says no
  straggler is behind them.
- ``gpu-idle`` — a GPU idle for more than a third of the step always gets this finding, which
  says where the idle time went and which finding claims each cause (``CLAIMS``); its cost is
  the part no other finding explains, its remedy that of the largest cause no other claims.
- ``low-gemm-efficiency`` — large matrix multiplications (at least ``LARGE_GEMM_FLOPS`` a call)
  below ``LOW_EFFICIENCY`` of the device's peak for their type; cost: their time beyond what
  they would take at ``TARGET_EFFICIENCY``. It sees only GEMMs with recorded shapes: below
  ``GEMM_COVERAGE_FULL`` of the GEMM kernel time its title says how much it covers
  (``gemm_coverage``; ``gemm_coverage_notes`` says it in the report's notes whatever the
  verdict).

Each cites its rows (``F.cite``): the idle findings the ``idle`` rows of the rank they name
(the sync stall also the ``sync_calls`` of its synchronisation), the copies and the exposed
communication the ``breakdown`` (and ``kernels``, ``exposed_comm``) rows of their worst rank,
arrival jitter the ``rank_waits`` and ``collectives`` its numbers come from, the GEMM verdict
its ``gemms`` row and ``gpu-idle`` its rank's ``breakdown`` and ``idle`` rows.
"""
from __future__ import annotations

import math

import pandas as pd

from meshscope.analysis.gpu import host_activity
from meshscope.analysis.report import finding_rules as F
from meshscope.analysis.timeline.breakdown import rank_means
from meshscope.analysis.report.model import Finding
from meshscope.analysis.report.tables import GpuTables
from meshscope.vocabulary import exposed_comm_id

SHORT_KERNEL_US = 20.0
IDLE_SHARE = 1 / 3
LARGE_GEMM_FLOPS = 1e9
LOW_EFFICIENCY = 0.3
TARGET_EFFICIENCY = 0.6
CAUSE_TEXT = {
    "dataloader": "the data loader", "sync": "blocking synchronisation",
    "wait_rank": "waiting for another rank (host)",
    "startup": "start-up and set-up calls (CUDA initialisation, streams, modules, allocation)",
    "launch": "launching kernels", "cpu": "other host work (operators, Python)",
    "queued": "work queued but not running", "other": "nothing traced on the host",
}
# The remedy of the ``gpu-idle`` finding by the cause it names.
CAUSE_REMEDY = {
    "dataloader": "more DataLoader workers (num_workers), pin_memory=True, prefetching",
    "sync": "remove the synchronisation from the loop (.item(), .cpu(), printing a "
            "tensor) or defer it, so the host runs ahead of the GPU",
    "startup": "start-up is not steady state: CUDA initialisation, stream and event creation, "
               "module loading and first allocations happen once — profile later steps "
               "(torch.profiler.schedule(wait=…, warmup=…)) or run a warm-up step first",
    "launch": "fewer, larger kernels: CUDA graphs or torch.compile",
    "queued": "look at cross-stream dependencies (events) and launch latency",
    "cpu": "move host work off the critical path (optimizer on the GPU, fused optimizers, "
           "less Python per step) or overlap it with the GPU",
    "wait_rank": "see why the host waits for other ranks (CPU-side collectives, barriers)",
    "other": "profile the host with Python stacks (with_stack=True) to see what it does",
}
SLOW_LAUNCH_REMEDY = ("launch calls of over 1 ms are first launches: loading the kernel's "
                      "module (CUDA lazy loading) or initialising a library (cuDNN, cuBLAS) — "
                      "start-up, which CUDA graphs do not remove: profile after a warm-up "
                      "step, or load modules eagerly (CUDA_MODULE_LOADING=EAGER)")
# The GEMM verdict states its coverage when shapes cover less of the GEMM time than this.
GEMM_COVERAGE_FULL = 0.9


def _worst_per_step(df: pd.DataFrame, col: str) -> tuple[float, int | None]:
    """(mean over steps of the largest value over ranks, the rank most often largest)."""
    if df is None or df.empty or col not in df:
        return 0.0, None
    per_step = df.groupby("step")[col].max()
    worst = df.loc[df.groupby("step")[col].idxmax(), "rank"]
    return float(per_step.mean()), int(worst.mode().iloc[0]) if len(worst) else None


def _ranks_over(df: pd.DataFrame, col: str, floor_us: float) -> list[int]:
    per_rank = df.groupby("rank")[col].mean()
    return [int(r) for r in per_rank.index[per_rank > floor_us]]


def _idle_finding(inp: F.FindingInputs, fid: str, cols: list[str], title_fmt: str, remedy: str,
                  extra: dict | None = None, minus: str | None = None) -> Finding | None:
    """A finding costing the idle time of ``cols`` (less the column ``minus``)."""
    idle = inp.idle
    if idle is None or idle.empty:
        return None
    x = idle[cols].sum(axis=1)
    if minus is not None and minus in idle:
        x = (x - idle[minus].fillna(0.0)).clip(lower=0.0)
    df = idle.assign(_x=x)
    cost, worst = _worst_per_step(df, "_x")
    if not F.beats_noise(cost, inp.step_us, inp.noise_us):
        return None
    ranks = _ranks_over(df, "_x", 0.01 * inp.step_us)
    evidence = {"idle_us": cost, "share_of_step_pct": 100 * cost / inp.step_us,
                "worst_rank": worst, "ranks": ranks,
                "steps": sorted(int(s) for s in df["step"].unique())}
    evidence.update(extra or {})
    title = title_fmt.format(ms=F.ms(cost), pct=100 * cost / inp.step_us, rank=worst,
                             ranks=_ranks_text(ranks))
    cites = [F.cite("idle", rank=worst)]
    if "sync_op" in evidence:
        cites.append(F.cite("sync_calls", name=evidence["sync_op"]))
    return F.timed(fid, "all", cost, inp, title, evidence, remedy,
                   f"no device idle from {', '.join(CAUSE_TEXT[c[5:-3]] for c in cols)}",
                   cites=cites)


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"{len(ranks)} ranks"


def _sync_kind(op: str) -> str:
    """What kind of blocking call ``op`` is: ``event`` (a wait for another stream's event),
    ``copy`` (a copy that blocks: pageable memory), else ``sync``."""
    if op in host_activity.EVENT_SYNC_NAMES:
        return "event"
    if op in host_activity.COPY_NAMES:
        return "copy"
    return "sync"


SYNC_REMEDY = {
    "sync": "remove the synchronisation from the training loop or defer it (a .item() or "
            ".cpu() each step, printing a tensor, a blocking copy): read values every N "
            "steps, or copy them asynchronously to pinned memory",
    "event": "the host (or a stream) waits for an event recorded on another stream — or "
             "another device or process: find which work that event waits for and start it "
             "earlier, or make the dependency finer so the waiting stream can run meanwhile",
    "copy": "copy from pinned host memory (pin_memory=True, tensor.pin_memory()) with "
            "non_blocking=True: a copy from pageable memory holds the host until the driver "
            "has staged the data",
}
SYNC_WHAT = {"sync": "", "event": " (a wait for an event recorded on another stream)",
             "copy": " (a copy from pageable host memory, which blocks the host)"}


def _sync_site(inp: F.FindingInputs) -> dict:
    calls = inp.sync_calls
    if calls is not None and "step" in calls:
        calls = calls[calls["step"] >= 0]
    if calls is None or calls.empty:
        return {}
    c = calls.assign(dur_us=calls["end_us"] - calls["ts_us"])
    c = c.fillna({"parent_op": c["name"], "call_site": ""})
    g = c.groupby(["name", "parent_op", "call_site"], sort=False).agg(
        count=("dur_us", "size"), total_us=("dur_us", "sum"),
        idle_after_us=("idle_after_us", "sum")).reset_index()
    top = g.sort_values(["idle_after_us", "total_us"], ascending=False).iloc[0]
    return {"sync_op": str(top["name"]), "called_from": str(top["parent_op"]),
            "call_site": str(top["call_site"]) or None, "calls": int(top["count"]),
            "sync_total_us": float(top["total_us"]), "sync_idle_us": float(top["idle_after_us"])}


def _mean_kernel_us(inp: F.FindingInputs) -> tuple[float, float]:
    """(mean duration of a compute kernel, compute kernels per step) from the kernel table."""
    k = inp.kernels
    if k is None or k.empty:
        return math.nan, math.nan
    comp = k[~k["category"].isin(["communication", "memcpy/memset"])]
    n = float(comp["count"].sum())
    steps = max(inp.idle["step"].nunique() if inp.idle is not None and len(inp.idle) else 1, 1)
    ranks = max(comp["rank"].nunique(), 1)
    return (float(comp["total_us"].sum()) / n if n else math.nan), n / steps / ranks


def _memcpy(inp: F.FindingInputs) -> Finding | None:
    bd = inp.breakdown
    if not inp.on_gpu or bd.empty or "other_us" not in bd:
        return None
    cost, worst = _worst_per_step(bd, "other_us")
    if not F.beats_noise(cost, inp.step_us, inp.noise_us):
        return None
    evidence = {"exposed_copy_us": cost, "worst_rank": worst}
    cites = [F.cite("breakdown", rank=worst)]
    k = inp.kernels
    if k is not None and len(k):
        copies = k[k["category"] == "memcpy/memset"].sort_values("total_us", ascending=False)
        evidence["copies"] = [{"name": str(n), "count": int(c), "total_us": float(t)}
                              for n, c, t in zip(copies["name"], copies["count"],
                                                 copies["total_us"])][:3]
        if len(copies):
            cites.append(F.cite("kernels", category="memcpy/memset"))
    pageable = any("Pageable" in c["name"] for c in evidence.get("copies", []))
    title = (f"Memory copies on the critical path: {F.ms(cost)} per step of memcpy/memset "
             f"with no compute or communication beside it"
             + (" (from pageable host memory)" if pageable else ""))
    return F.timed("memcpy-on-critical-path", "all", cost, inp, title, evidence,
                    "copy from pinned host memory (DataLoader(pin_memory=True)) with "
                    "non_blocking=True, and overlap the copies with compute on a side stream "
                    "or prefetch the next batch to the GPU",
                   "the copies overlapped with compute", cites=cites)


def _exposed_single(inp: F.FindingInputs, have: set[str]) -> list[Finding]:
    """Exposed communication of dimensions without a what-if saving: its exposed time."""
    bd = inp.breakdown
    out = []
    if bd.empty or inp.whatif_dims is None:
        return out
    for col in [c for c in bd.columns if c.startswith("exposed_comm_") and c.endswith("_us")
                and c != "exposed_comm_us"]:
        dim = col[len("exposed_comm_"):-3]
        if dim in have or dim in inp.dim_savings or dim in inp.whatif_dims:
            continue
        cost, worst = _worst_per_step(bd, col)
        if not F.beats_noise(cost, inp.step_us, inp.noise_us):
            continue
        per_rank = rank_means(bd)
        mine = per_rank.loc[worst] if worst in per_rank.index else pd.Series(dtype=float)
        evidence = {"exposed_us": cost, "worst_rank": worst,
                    "overlap_pct": float(mine.get("overlap_pct", math.nan)),
                    "comm_us": float(mine.get("comm_us", math.nan))}
        title = (f"Exposed {dim} communication: {F.ms(cost)} per step "
                 f"({100 * cost / inp.step_us:.0f}% of the step) runs with no compute beside it"
                 f"{' on rank ' + str(worst) if worst is not None else ''}")
        out.append(F.timed(exposed_comm_id(dim), dim, cost, inp, title, evidence,
                            F.REMEDIES.get(dim, F.REMEDIES["unknown"]) if dim != "unknown"
                            else "overlap it with compute (bucketed, asynchronous "
                                 "collectives issued earlier) or find its process group "
                                 "(record_param_comms, `meshscope analyze --layout`) for a "
                                 "remedy that fits its dimension",
                           f"every {dim} operation hidden behind compute",
                           cites=[F.cite("exposed_comm", rank=worst, dim=dim),
                                  F.cite("breakdown", rank=worst)]))
    return out


#: The share of the waiting one rank causes above which an arrival-jitter finding names it
#: (the waits then have one cause, whatever the last arriver of each collective) ...
CAUSED_MOST = 0.5
#: ... when it arrived last more often than chance would make one of the ranks: the chance
#: that any of R ranks is last at n or more of N collectives, were the last arriver drawn at
#: random, stays below this (``last_by_chance``).
CHANCE_AT_MOST = 0.05


def last_by_chance(n_last: int, collectives: int, ranks: int) -> float:
    """The chance that one of ``ranks`` ranks arrives last at ``n_last`` or more of
    ``collectives`` collectives when the last arriver of each is drawn at random: ``ranks``
    times the binomial tail P(X ≥ n_last), X ~ B(collectives, 1/ranks) (a union bound over the
    ranks, at most 1)."""
    if ranks < 2 or collectives < 1:
        return 1.0
    p = 1.0 / ranks
    tail = sum(math.comb(collectives, k) * p ** k * (1 - p) ** (collectives - k)
               for k in range(max(n_last, 0), collectives + 1))
    return min(1.0, ranks * tail)


def _jitter(inp: F.FindingInputs) -> Finding | None:
    """Waits at collectives with no straggler behind them (module docstring)."""
    if inp.straggler is not None or inp.savings is None or inp.savings.empty or inp.stages > 1:
        return None     # a pipeline's waits at its receives are bubble, not jitter
    colls = inp.collectives
    if colls is None or colls.empty or "wait_us" not in inp.savings:
        return None
    cost = float(inp.savings["wait_us"].mean())
    bd = inp.breakdown
    if len(bd):
        cost = min(cost, float(rank_means(bd)["exposed_comm_us"].max()))
    if not F.beats_noise(cost, inp.step_us, inp.noise_us):
        return None
    last = colls["last_rank"].dropna().astype(int)
    counts = last.value_counts()
    dims = sorted(str(d) for d in colls["dim"].dropna().unique())
    evidence = {"mean_wait_us": cost, "median_skew_us": float(colls["skew_us"].median()),
                "last_arrivers": {int(r): int(n) for r, n in counts.items()},
                "collectives": int(len(colls)), "noise_us": inp.noise_us,
                "waits_per_rank_us": {int(r): float(w) for r, w in
                                      zip(inp.savings["rank"], inp.savings["wait_us"])},
                "dimensions": dims}
    caused = {int(r): float(w) for r, w in zip(inp.savings["rank"],
                                                inp.savings.get("wait_caused_us", []))
              if w == w and w > 0}
    evidence["waits_caused_us"] = caused
    top_share = counts.iloc[0] / counts.sum() if len(counts) else 0.0
    causer = max(caused, key=caused.get) if caused else None
    cause_share = caused[causer] / sum(caused.values()) if causer is not None else 0.0
    n_ranks = int(inp.savings["rank"].nunique())
    chance = last_by_chance(int(counts.get(causer, 0)), int(counts.sum()), n_ranks) \
        if causer is not None else 1.0
    evidence["last_by_chance"] = chance
    if causer is not None and cause_share >= CAUSED_MOST and chance < CHANCE_AT_MOST:
        # The waits have one cause: say so, and that the what-if does not make it a straggler.
        n_last = int(counts.get(causer, 0))
        title = (f"Arrival jitter: ranks wait {F.ms(cost)} per step for each other at their "
                 f"collectives, {cause_share:.0%} of it for rank {causer} (last to arrive at "
                 f"{n_last} of {int(counts.sum())} collectives); making it as fast as its peers "
                 f"saves no more than the step-to-step noise, so it is not named a straggler")
        evidence["causing_rank"] = causer
        cites = [F.cite("rank_waits", rank=causer)]
    elif causer is not None and cause_share >= CAUSED_MOST:
        # One rank caused most of the waiting, over too few collectives to tell its delay from
        # noise: the finding says so — never that no rank is behind the waits.
        n_last = int(counts.get(causer, 0))
        title = (f"Arrival jitter: ranks wait {F.ms(cost)} per step for each other at their "
                 f"collectives, {cause_share:.0%} of it for rank {causer} (last to arrive at "
                 f"{n_last} of {int(counts.sum())} collectives, as chance alone would make "
                 f"one of {n_ranks} ranks {chance:.0%} of the time: too few to tell its delay "
                 f"from noise"
                 + (f"; rank {int(counts.index[0])} arrives last most often"
                    if top_share >= 0.75 and int(counts.index[0]) != causer else "")
                 + "); making it as fast as its peers saves no more than the step-to-step "
                   "noise")
        cites = [F.cite("rank_waits", rank=causer)]
    else:
        cites = [F.cite("rank_waits")]
        why = ("the last to arrive changes from collective to collective"
               if top_share < 0.75 else
               f"rank {int(counts.index[0])} arrives last most often, but making it as fast "
               f"as its peers saves no more than the step-to-step noise")
        title = (f"Arrival jitter: ranks wait {F.ms(cost)} per step for each other at their "
                 f"collectives with no straggler behind it ({why})")
    return F.timed("arrival-jitter", dims[0] if len(dims) == 1 else "all", cost, inp, title,
                    evidence, "make the ranks' step times steadier: pin each rank to its own "
                    "cores, keep other work off the hosts, prefetch data so loading time does "
                    "not vary; and issue the collectives earlier so the waits overlap compute",
                   "every rank arrives at each collective together",
                   cites=[*cites, F.cite("collectives")])


def _gemm(inp: F.FindingInputs) -> Finding | None:
    g = inp.gemms
    if g is None or g.empty:
        return None
    big = g[(g["flops"] / g["calls"] >= LARGE_GEMM_FLOPS) & (g["efficiency"] < LOW_EFFICIENCY)]
    if big.empty:
        return None
    target_us = big["flops"] / (TARGET_EFFICIENCY * big["peak_tflops"] * 1e6)
    steps = max(inp.breakdown["step"].nunique() if len(inp.breakdown) else 1, 1)
    ranks = max(big["rank"].nunique(), 1)
    cost = float((big["kernel_us"] - target_us).clip(lower=0).sum()) / steps / ranks
    if not F.beats_noise(cost, inp.step_us, inp.noise_us):
        return None
    top = big.sort_values("kernel_us", ascending=False).iloc[0]
    cover = gemm_coverage(g, inp.kernel_categories)
    covered = sum(c for c, _ in cover.values())
    total = sum(t for _, t in cover.values())
    evidence = {"gemms": int(big["calls"].sum()), "op": str(top["op"]),
                "shapes": str(top["shapes"]), "dtype": str(top["dtype"]),
                "tflops": float(top["tflops"]), "peak_tflops": float(top["peak_tflops"]),
                "efficiency": float(top["efficiency"]),
                "gemm_time_covered_pct": 100 * covered / total if total > 0 else None}
    title = (f"Large matrix multiplications run at {top['efficiency']:.0%} of the device's "
             f"peak ({top['tflops']:.1f} of {top['peak_tflops']:.0f} TFLOP/s for "
             f"{top['op']} {top['shapes']} in {top['dtype']})")
    if total > 0 and covered < GEMM_COVERAGE_FULL * total:
        title += (f" — judged on {_pct(covered, total)} of the GEMM kernel time: the rest "
                  f"has no recorded shapes")
    return F.timed("low-gemm-efficiency", "all", cost, inp, title, evidence,
                   "run them in bf16/fp16 on the tensor cores (autocast), with dimensions "
                   "that are multiples of 8 (16 for fp8), larger batches, or fused kernels "
                   "(torch.compile)",
                   f"those multiplications at {TARGET_EFFICIENCY:.0%} of peak",
                   cites=[F.cite("gemms", rank=top["rank"], op=top["op"],
                                 shapes=top["shapes"], dtype=top["dtype"]),
                          F.cite("gemms")])


# Which finding claims which idle cause (the ``gpu-idle`` finding names them, and neither its
# cost nor its remedy counts that time again).
CLAIMS = {"data-loading-stall": ("dataloader",), "sync-stall": ("sync",),
          "launch-bound": ("launch", "queued")}


def _gpu_idle(inp: F.FindingInputs, explained_us: float,
              claimed_by: dict[str, str] | None = None) -> Finding | None:
    """``claimed_by``: cause → the id of the finding that claims its time (``CLAIMS``); the
    launch-bound finding does not claim the time inside slow launch calls
    (``slow_launch_us``)."""
    idle = inp.idle
    bd = inp.breakdown
    if idle is None or idle.empty or bd.empty:
        return None
    per_rank = rank_means(bd)
    share = per_rank["idle_us"] / per_rank["window_us"]
    if not (share > IDLE_SHARE).any():
        return None
    claimed_by = claimed_by or {}
    rank = int(share.idxmax())
    idle_means = rank_means(idle)
    mine = idle_means.loc[rank] if rank in idle_means.index else pd.Series(dtype=float)
    parts = {c: float(mine.get(f"idle_{c}_us", 0.0)) for c in CAUSE_TEXT}
    slow = float(mine.get("slow_launch_us", 0.0) or 0.0)
    total = float(per_rank.loc[rank, "idle_us"])    # the breakdown's: the one idle total
    ordered = sorted(parts.items(), key=lambda kv: -kv[1])

    def text(c: str, v: float) -> str:
        bits = [f"{100 * v / total:.0f}%"]
        slow_here = c == "launch" and slow > 0.01 * total
        if slow_here:
            bits.append(f"{F.ms(slow)} of it in launch calls of over 1 ms: first launches, "
                        f"start-up")
        if c in claimed_by and not (slow_here and v - slow <= 0.01 * total):
            bits.append(("the rest: " if slow_here else "") + f"the {claimed_by[c]} finding")
        return f"{CAUSE_TEXT[c]} {F.ms(v)} ({'; '.join(bits)})"
    where = "; ".join(text(c, v) for c, v in ordered if v > 0.01 * total)
    # What no other finding claims, by cause: the remedy is the largest one's.
    free = {c: (0.0 if c in claimed_by else v) for c, v in parts.items()}
    if "launch" in claimed_by:
        free["launch"] = slow          # launch-bound leaves the slow launches to this one
    cost = max(total - explained_us, 0.0)
    evidence = {"rank": rank, "idle_us": total, "share_of_step_pct": 100 * float(share[rank]),
                "by_cause_us": parts, "slow_launch_us": slow,
                "claimed_by": dict(claimed_by), "explained_by_other_findings_us": explained_us}
    title = (f"Rank {rank}'s GPU idles {100 * float(share[rank]):.0f}% of the step "
             f"({F.ms(total)}): {where}")
    top = max(free, key=lambda c: free[c]) if any(v > 0 for v in free.values()) \
        else ordered[0][0]
    remedy = CAUSE_REMEDY[top]
    if top == "launch" and slow >= 0.5 * parts["launch"]:
        remedy = SLOW_LAUNCH_REMEDY
    elif top == "launch" and (inp.graph_captures or inp.graph_replays):
        remedy = _graph_remedy(inp)
    cites = [F.cite("idle", rank=rank)] if rank in idle_means.index else []
    cites.append(F.cite("breakdown", rank=rank))
    return F.timed("gpu-idle", "all", cost, inp, title, evidence, remedy,
                   "the idle time no other finding explains removed", cites=cites)


def _graph_remedy(inp: F.FindingInputs) -> str:
    """The launch remedy of a job that already uses CUDA graphs: never "capture the step in a
    CUDA graph"."""
    if inp.graph_captures and not inp.graph_replays:
        return ("the trace captures CUDA graphs: the launches of a capture run nothing until "
                "the graph is replayed, so its launch time is set-up — profile the replays "
                "(steady state), not the capture")
    return (f"the job already replays CUDA graphs ({inp.graph_replays:,} graph launches): the "
            f"launches left are outside them — capture more of the step in one graph (a "
            f"full graph rather than pieces), fuse the operators between them "
            f"(torch.compile), or give each kernel more work (larger batches)")


def gemm_coverage(gemms: pd.DataFrame | None, categories: pd.DataFrame | None
                  ) -> dict[int, tuple[float, float]]:
    """rank → (GEMM kernel time the GEMM table covers with recorded shapes, all GEMM kernel
    time), over the step windows (``kernel_categories``' ``gemm`` row)."""
    if categories is None or categories.empty:
        return {}
    g = categories[categories["category"] == "gemm"].groupby("rank")["total_us"].sum()
    covered = gemms.groupby("rank")["kernel_us"].sum() if gemms is not None and len(gemms) \
        else pd.Series(dtype=float)
    return {int(r): (min(float(covered.get(r, 0.0)), float(t)), float(t))
            for r, t in g.items() if t > 0}


def gemm_coverage_notes(gpu: GpuTables) -> list[str]:
    """One note per rank whose GEMM kernels mostly ran without recorded shapes: the GEMM
    efficiency verdict covers only the rest (CUDA graph replays carry no operator with
    shapes; ``record_shapes=True`` records them for eager launches)."""
    out = []
    kernels, gemms = gpu.kernels, gpu.gemms
    for rank, (covered, total) in sorted(gemm_coverage(gemms, gpu.kernel_categories).items()):
        if covered >= 0.5 * total:
            continue
        mine = gemms[gemms["rank"] == rank] if gemms is not None and len(gemms) else None
        if mine is not None and len(mine) and mine["peak_tflops"].isna().all():
            continue            # no device peak: no verdict whatever the shapes
        graphs = kernels is not None and len(kernels) and bool(
            kernels.loc[(kernels["rank"] == rank) & (kernels["category"] == "gemm"),
                        "graph"].astype(bool).any())
        why = ("CUDA graph replays carry none" if graphs else
               "a convolution's GEMM kernels, or a trace without record_shapes=True, have none")
        if covered <= 0:
            out.append(f"rank {rank}: no GEMM efficiency verdict: none of its "
                       f"{total / 1e3:,.1f} ms of GEMM kernel time was launched by a matrix "
                       f"multiplication with recorded shapes ({why})")
            continue
        out.append(f"rank {rank}: the GEMM efficiency verdict covers "
                   f"{_pct(covered, total)} of its GEMM kernel time ({covered / 1e3:,.1f} of "
                   f"{total / 1e3:,.1f} ms): the rest was launched by no matrix "
                   f"multiplication with recorded shapes ({why})")
    return out


def _pct(part: float, whole: float) -> str:
    """A share as the report prints it: ``~1%`` below 1.5%, else to the percent."""
    p = 100 * part / whole if whole > 0 else 0.0
    if p <= 0:
        return "none"
    return f"~{max(p, 0.1):.1g}%" if p < 1.5 else f"{p:.0f}%"


def device_findings(inp: F.FindingInputs, have: set[str]) -> list[Finding]:
    """The findings of this module (module docstring) in no particular order; ``have``: the
    dimensions whose exposed communication already has a (what-if) finding."""
    out: list[Finding] = []
    site = _sync_site(inp)
    idle_found = [
        _idle_finding(inp, "data-loading-stall", ["idle_dataloader_us"],
                      "Data-loading stall: the GPU waits {ms} per step ({pct:.0f}%) while the "
                      "host is in the data loader ({ranks})",
                      "more DataLoader workers (num_workers), pin_memory=True and prefetching "
                      "(prefetch_factor, persistent_workers), so the next batch is ready "
                      "before the step needs it"),
        _idle_finding(inp, "sync-stall", ["idle_sync_us"],
                      "Synchronisation stall: the GPU idles {ms} per step ({pct:.0f}%) after "
                      "the host blocks on it ({ranks})",
                      SYNC_REMEDY[_sync_kind(site.get("sync_op", ""))], site),
    ]
    mean_us, per_step = _mean_kernel_us(inp)
    # A trace that captures graphs and replays none is set-up: its launches run nothing.
    capture_only = inp.graph_captures > 0 and inp.graph_replays == 0
    if mean_us == mean_us and mean_us <= SHORT_KERNEL_US and not capture_only:
        idle_found.append(_idle_finding(
            inp, "launch-bound", ["idle_launch_us", "idle_queued_us"],
            "Launch-bound: the GPU idles {ms} per step ({pct:.0f}%) between short kernels "
            f"({mean_us:.1f} µs on average, {per_step:,.0f} per step) while the host launches "
            "them",
            _graph_remedy(inp) if inp.graph_replays else
            "fewer, larger kernels: capture the step in a CUDA graph (torch.cuda.graphs, "
            "torch.compile(mode='reduce-overhead')), fuse operators (torch.compile), or "
            "larger batches per kernel",
            {"mean_kernel_us": mean_us, "kernels_per_step": per_step,
             "graph_replays": inp.graph_replays}, minus="slow_launch_us"))
    for f in idle_found:
        if f is not None:
            if f.id == "sync-stall" and f.evidence.get("called_from"):
                site, op = f.evidence.get("call_site"), f.evidence["sync_op"]
                parent = f.evidence["called_from"]
                f.title += (f"; mostly {op}{SYNC_WHAT[_sync_kind(op)]}"
                            + (f" called from {parent}" if parent != op
                               else " outside any operator")
                            + (f" at {site}" if site else ""))
            out.append(f)
    for f in (_memcpy(inp), _jitter(inp), _gemm(inp)):
        if f is not None:
            out.append(f)
    out += _exposed_single(inp, have)
    explained = sum(f.cost_us or 0.0 for f in out if f.id in CLAIMS)
    claimed_by = {c: f.id for f in out if f.id in CLAIMS for c in CLAIMS[f.id]}
    idle_f = _gpu_idle(inp, explained, claimed_by)
    if idle_f is not None:
        out.append(idle_f)
    return out

