"""What changed from one run to another, and why: ``diff(before, after) -> RunDiff``.

The step-time difference is split into parts that add up to it: with W the step window, mean
over ranks and profiled steps, ``W = compute + exposed_comm (per dimension) + bubble + other
+ idle`` on each side (``analysis/timeline/breakdown.py``; idle split by cause where both runs
are GPU runs, ``idle.parquet``), so ``ΔW = Σ Δparts`` exactly. The headline step time
(``step_time``: the step timer, else the profiled window, else the replayed makespan —
``quantities``) need not be W: ``residual_us = Δstep_time − Σ Δparts`` says how far the
parts' total is from the headline's change. Under each part, what is behind it: for compute,
the kernels (GPU; by ``names.kernel_key``, so NCCL generations pair up) or host operators
(CPU) whose time changed most; for exposed communication, each operation's share
(``exposed_comm.parquet``) and the collectives of that dimension whose count or bytes changed
(``instances.parquet``); for other device work, the copies.

Beside the parts: every kernel before and after (count, total and mean per step, appeared or
disappeared), operators whose launch count changed, collectives per (dimension, op), bus
bandwidth per size bucket, peak memory (and each matched rank's allocator peaks, from the
traces' ``[memory]`` events), findings that appeared, vanished or changed cost, and each
matched rank's deltas (ranks matched by id; by position when the runs share no rank id,
e.g. two single-rank traces). Every change carries its noise (``quantities.Measure.noise`` of
both sides, added in quadrature): a change within it is called so (``within_noise``).
"""
from __future__ import annotations

from meshscope.analysis.report.model import trust_headline

import dataclasses
import math

import pandas as pd

from meshscope.analysis.ingest.classify import HOST_COMM_RE
from meshscope.analysis.timeline.breakdown import DIM_ORDER, rank_means
from meshscope.vocabulary import IDLE_CAUSES

from . import alike
from . import quantities as Q
from .names import kernel_key
from .records import (ITEMS_PER_PART, BandwidthDiff, Change, CollectiveDiff, FindingChange,
                      Item, KernelDiff, MemoryDiff, OperatorDiff, Part, RankDelta, RunDiff,
                      SideInfo)
from .sides import Side
from .story import sentences

def change(before: Side, after: Side, name: str) -> Change:
    """The quantity ``name`` of both sides as a ``Change`` (None where a side lacks it)."""
    a, b = Q.measure(before, name), Q.measure(after, name)
    unit = Q.unit_of(name) or ""
    return Change(name, unit, a.value if a else None, b.value if b else None,
                  a.noise if a else None, b.noise if b else None)


# -- the parts ------------------------------------------------------------------------------

_LABELS = {"compute": "compute", "bubble": "pipeline bubble",
           "other": "other device work (copies, fills)", "idle": "idle"}
_IDLE_LABELS = {"dataloader": "GPU idle: data loader", "sync": "GPU idle: synchronisation",
                "wait_rank": "GPU idle: waiting for another rank",
                "startup": "GPU idle: start-up and set-up calls",
                "launch": "GPU idle: kernel launches", "cpu": "GPU idle: other host work",
                "queued": "GPU idle: work queued behind a dependency",
                "other": "GPU idle: other"}


def _exposed_dims(before: Side, after: Side) -> list[str]:
    out = []
    for d in DIM_ORDER:
        col = f"exposed_comm_{d}_us"
        if any(s.table("breakdown")[col].fillna(0).gt(0).any() for s in (before, after)
               if col in s.table("breakdown")):
            out.append(d)
    return out


def _ops_of(side: Side, dim: str) -> set[str]:
    ex = side.table("exposed_comm")
    return {str(o) for o in ex.loc[ex["dim"] == dim, "op"].unique()} if len(ex) else set()


def _part(before: Side, after: Side, name: str, label: str, total: float,
          sub=(), items=(), items_are: str = "") -> Part:
    c = change(before, after, name)
    c = dataclasses.replace(c, before=c.before if c.before is not None else 0.0,
                            after=c.after if c.after is not None else 0.0)
    share = (c.delta / total) if total else None
    return Part(c, label, share, tuple(sub), tuple(items), items_are)


def _parts(before: Side, after: Side, total: float, kernels: list[KernelDiff],
           operators_all: list[OperatorDiff], colls: list[CollectiveDiff]) -> list[Part]:
    gpu = before.on_gpu and after.on_gpu
    parts = [_part(before, after, "compute", "compute", total,
                   items=_compute_items(kernels, operators_all, gpu),
                   items_are="kernels" if gpu else "operators")]
    for dim in _exposed_dims(before, after):
        name = f"exposed_comm.{dim}"
        ops = sorted(_ops_of(before, dim) | _ops_of(after, dim))
        sub = [_part(before, after, f"{name}.{op}", f"{op}", total) for op in ops]
        items = [Item(f"{c.op}", 0.0, 0.0, c.count_before, c.count_after)
                 for c in colls if c.dim == dim and c.count_before != c.count_after]
        parts.append(_part(before, after, name, f"exposed {dim} communication", total,
                           sub=sub, items=items[:ITEMS_PER_PART], items_are="collectives"))
    parts.append(_part(before, after, "bubble", _LABELS["bubble"], total))
    copies = [Item(k.key, k.total_before_us, k.total_after_us, k.count_before, k.count_after)
              for k in kernels if k.category == "memcpy/memset"]
    copies.sort(key=lambda i: -abs(i.delta_us))
    parts.append(_part(before, after, "other", _LABELS["other"], total,
                       items=copies[:ITEMS_PER_PART], items_are="copies"))
    if gpu and len(before.table("idle")) and len(after.table("idle")):
        for cause in IDLE_CAUSES:
            parts.append(_part(before, after, f"idle.{cause}", _IDLE_LABELS[cause], total))
    else:
        parts.append(_part(before, after, "idle", _LABELS["idle"], total))
    return parts


def _compute_items(kernels: list[KernelDiff], operators: list[OperatorDiff],
                   gpu: bool) -> list[Item]:
    if gpu:
        items = [Item(k.key, k.total_before_us, k.total_after_us, k.count_before,
                      k.count_after) for k in kernels
                 if k.category not in ("communication", "memcpy/memset")]
    else:
        items = [Item(o.name, o.total_before_us, o.total_after_us, o.count_before,
                      o.count_after) for o in operators if not _is_comm_op(o.name)]
    items.sort(key=lambda i: -abs(i.delta_us))
    return items[:ITEMS_PER_PART]


def _is_comm_op(name: str) -> bool:
    return bool(HOST_COMM_RE.search(name))


# -- kernels, operators, collectives, bandwidth, findings -----------------------------------

def _per_step(df: pd.DataFrame, keys: list[str], units: int) -> pd.DataFrame:
    """Counts and totals per key, per step and rank (``units`` = ranks × steps)."""
    g = df.groupby(keys, observed=True, sort=False).agg(count=("count", "sum"),
                                                        total_us=("total_us", "sum"))
    return g / max(units, 1)


def _kernels(before: Side, after: Side) -> list[KernelDiff]:
    sides = []
    for s in (before, after):
        kt = s.table("kernel_totals")
        if kt.empty:
            sides.append((pd.DataFrame(columns=["count", "total_us"]), {}, {}))
            continue
        kt = kt.assign(key=kt["name"].map(kernel_key))
        units = kt["rank"].nunique() * max(kt["step"].nunique(), 1)
        per = _per_step(kt, ["key"], units)
        names = kt.groupby("key")["name"].agg(lambda x: tuple(sorted(set(map(str, x)))[:3]))
        cats = kt.groupby("key")["category"].first()
        sides.append((per, names.to_dict(), cats.to_dict()))
    (pa, na, ca), (pb, nb, cb) = sides
    out = []
    for key in sorted(set(pa.index) | set(pb.index)):
        a = pa.loc[key] if key in pa.index else None
        b = pb.loc[key] if key in pb.index else None
        out.append(KernelDiff(
            key=str(key), category=str(cb.get(key) or ca.get(key) or "other"),
            count_before=float(a["count"]) if a is not None else 0.0,
            count_after=float(b["count"]) if b is not None else 0.0,
            total_before_us=float(a["total_us"]) if a is not None else 0.0,
            total_after_us=float(b["total_us"]) if b is not None else 0.0,
            names_before=na.get(key, ()), names_after=nb.get(key, ())))
    out.sort(key=lambda k: (-abs(k.delta_us), k.key))
    return out


def _operators(before: Side, after: Side) -> list[OperatorDiff]:
    """Every operator of either run, per step and rank (the caller keeps those whose count
    changed for the list; compute's items on CPU runs read them all)."""
    per = []
    for s in (before, after):
        ops = s.table("operator_totals")
        units = ops["rank"].nunique() * max(ops["step"].nunique(), 1) if len(ops) else 1
        per.append(_per_step(ops, ["name"], units) if len(ops) else
                   pd.DataFrame(columns=["count", "total_us"]))
    pa, pb = per
    out = []
    for name in sorted(set(pa.index) | set(pb.index)):
        a = pa.loc[name] if name in pa.index else None
        b = pb.loc[name] if name in pb.index else None
        out.append(OperatorDiff(str(name), float(a["count"]) if a is not None else 0.0,
                                float(b["count"]) if b is not None else 0.0,
                                float(a["total_us"]) if a is not None else 0.0,
                                float(b["total_us"]) if b is not None else 0.0))
    return out


def _collectives(before: Side, after: Side) -> list[CollectiveDiff]:
    per = []
    for s in (before, after):
        inst = s.table("instances")
        units = max(len(s.ranks), 1) * max(len(s.steps), 1)
        if inst.empty:
            per.append({})
            continue
        inst = inst[inst["step"].isin(s.steps)] if s.steps else inst
        g = inst.groupby(["dim", "op"], observed=True, dropna=False)
        counts = g.size() / units
        known = inst[inst["msg_bytes"].notna()]
        nbytes = known.groupby(["dim", "op"], observed=True)["msg_bytes"].sum() / units \
            if len(known) else pd.Series(dtype=float)
        per.append({(str(d), str(o)): (float(c), float(nbytes[(d, o)])
                                       if (d, o) in nbytes.index else None)
                    for (d, o), c in counts.items()})
    a, b = per
    out = []
    for key in sorted(set(a) | set(b)):
        ca, ba = a.get(key, (0.0, None))
        cb, bb = b.get(key, (0.0, None))
        out.append(CollectiveDiff(key[0], key[1], ca, cb, ba, bb))
    return out


def _bandwidth(before: Side, after: Side) -> list[BandwidthDiff]:
    rows = []
    for s in (before, after):
        bs = s.table("bandwidth_summary")
        rows.append({(str(r.dim), str(r.op), int(r.size_bucket)):
                     (_f(r.busbw_gbps), _f(r.transfer_us)) for r in bs.itertuples()
                     if _f(r.size_bucket) is not None})
    a, b = rows
    none = (None, None)
    return [BandwidthDiff(k[0], k[1], k[2], a.get(k, none)[0], b.get(k, none)[0],
                          a.get(k, none)[1], b.get(k, none)[1])
            for k in sorted(set(a) | set(b))]


def _f(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _findings(before: Side, after: Side) -> list[FindingChange]:
    a = {f.id: f for f in before.summary.findings}
    b = {f.id: f for f in after.summary.findings}
    out = []
    for fid in list(b) + [x for x in a if x not in b]:
        fa, fb = a.get(fid), b.get(fid)
        status = "new" if fa is None else "gone" if fb is None else "both"
        out.append(FindingChange(fid, (fb or fa).title, status,
                                 fa.cost_us if fa else None, fb.cost_us if fb else None,
                                 fa.cost_pct if fa else None, fb.cost_pct if fb else None))
    return out


# -- ranks ----------------------------------------------------------------------------------

RANK_PARTS = ("window", "compute", "exposed_comm", "bubble", "other", "idle")


def _rank_means(side: Side) -> dict[int, dict[str, float]]:
    bd = side.table("breakdown")
    if bd.empty:
        return {}
    cols = {p: f"{p}_us" for p in RANK_PARTS}
    means = rank_means(bd)[list(cols.values())]
    return {int(r): {p: float(row[c]) for p, c in cols.items()} for r, row in means.iterrows()}


def match_ranks(before: list[int], after: list[int]) -> tuple[list[tuple[int, int]], str]:
    """Rank pairs (before, after): by id where the runs share rank ids, else by position
    (two single-rank traces of different rank ids); ``id``, ``position`` or ``none``."""
    shared = sorted(set(before) & set(after))
    if shared:
        return [(r, r) for r in shared], "id"
    if before and after and len(before) == len(after):
        return list(zip(sorted(before), sorted(after))), "position"
    return [], "none"


def _ranks(before: Side, after: Side) -> tuple[list[RankDelta], str]:
    ma, mb = _rank_means(before), _rank_means(after)
    pairs, how = match_ranks(sorted(ma), sorted(mb))
    return [RankDelta(a, b, ma[a], mb[b]) for a, b in pairs], how


def _rank_peaks(side: Side) -> dict[int, tuple[str, float, float]]:
    ms = Q.main_device_steps(side)
    if ms.empty:
        return {}
    g = ms.groupby("rank").agg(device=("device", "first"),
                               allocated=("peak_allocated_bytes", "max"),
                               reserved=("peak_reserved_bytes", "max"))
    return {int(r): (str(row.device), _f(row.allocated), _f(row.reserved))
            for r, row in g.iterrows()}


def _memory(before: Side, after: Side) -> list[MemoryDiff]:
    """Each matched rank's allocator peaks (ranks matched as the breakdown's: by id, else by
    position); empty where neither run's traces recorded memory."""
    a, b = _rank_peaks(before), _rank_peaks(after)
    if not a and not b:
        return []
    pairs, _ = match_ranks(sorted(set(a) | set(before.ranks)), sorted(set(b) | set(after.ranks)))
    out = []
    for ra, rb in pairs:
        da, db = a.get(ra), b.get(rb)
        if da is None and db is None:
            continue
        out.append(MemoryDiff(ra, rb, (db or da)[0], da[1] if da else None,
                              db[1] if db else None, da[2] if da else None,
                              db[2] if db else None))
    return out


# -- the whole ------------------------------------------------------------------------------

def _info(s: Side) -> SideInfo:
    return SideInfo(name=s.name, path=str(s.path), report_dir=str(s.report_dir),
                    device=s.summary.device, ranks=s.ranks, steps=s.steps, layout=s.layout,
                    step_time_source=s.summary.step_time.source,
                    trust_verdict=s.summary.trust.verdict if s.summary.trust else None,
                    evidence=trust_headline(s.summary.trust, s.summary.schema_version))


#: The quantities every diff states (the gate may ask for any other, ``quantities``).
HEADLINE = ("step_time", "window", "compute", "exposed_comm", "bubble", "other", "idle",
            "overlap_pct", "tokens_per_s", "mfu_pct", "peak_memory", "peak_allocated",
            "peak_reserved")


def diff(before: Side, after: Side) -> RunDiff:
    """What changed from ``before`` to ``after`` (module docstring)."""
    step, window = change(before, after, "step_time"), change(before, after, "window")
    total = window.delta or 0.0
    kernels = _kernels(before, after)
    operators_all = _operators(before, after)
    colls = _collectives(before, after)
    parts = _parts(before, after, total, kernels, operators_all, colls)
    ranks, how = _ranks(before, after)
    notes = []
    if how == "position":
        notes.append(f"the runs share no rank id: ranks matched by position "
                     f"({', '.join(f'{r.rank_before}→{r.rank_after}' for r in ranks)})")
    elif how == "none" and before.ranks and after.ranks:
        notes.append("the runs share no rank id and have different rank counts: no per-rank "
                     "deltas")
    if len(before.ranks) != len(after.ranks):
        notes.append(f"the runs have different rank counts ({len(before.ranks)} and "
                     f"{len(after.ranks)}): their parts are means over each run's own ranks")
    if before.summary.device != after.summary.device:
        notes.append(f"one run is on {before.summary.device}, the other on "
                     f"{after.summary.device}")
    if before.summary.step_time.source != after.summary.step_time.source:
        notes.append(f"the step times come from different sources "
                     f"({before.summary.step_time.short} and {after.summary.step_time.short})")
    for s in (before, after) if after.path != before.path else (before,):
        if len(s.steps) < 3:
            notes.append(f"{s.name}: {len(s.steps)} profiled step(s): the noise of its "
                         f"profiled-step figures is unknown (it needs three)")
    quantities = {n: change(before, after, n) for n in HEADLINE}
    d = RunDiff(before=_info(before), after=_info(after), step_time=step, window=window,
                parts=parts, kernels=kernels,
                operators=[o for o in operators_all if o.count_before != o.count_after],
                collectives=colls, bandwidth=_bandwidth(before, after),
                findings=_findings(before, after), ranks=ranks, rank_match=how,
                memory=_memory(before, after),
                quantities=quantities, notes=notes,
                unlike=alike.differences(before, after, how),
                hardware_changed=alike.hardware_changed(before, after))
    d.sentences = sentences(d)
    return d
