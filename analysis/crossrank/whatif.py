"""What-if savings: how much shorter each step would be if one rank worked at the pace it
should, and the straggler — the rank whose fix saves the most, when that beats the run's noise.

**The reference pace of a rank** (``reference_scales``):

- *Stage peers*: the other ranks of its pipeline stage (run.json's mesh; every rank when there
  is no run.json) do the same work by construction in dp, tp and cp. Their programs issue the
  same calls, so the rank's step splits into the same segments (``RankStep.segments``: the
  work up to each call); each segment's reference is the median of the peers' durations of that
  segment. In expert parallelism the work after a dispatch all_to_all is proportional to the
  tokens that rank received: that segment's reference is the peers' median time per received
  byte × the rank's received bytes. When the peers' programs differ (other calls), the whole
  step is scaled to the peers' median own work.
- *A stage without peers* (pp alone): the other stages' median own work per unit of work
  content — the stage's training FLOPs per token from run.json's model (its layers, and the
  output head on the last stage; ``meshscope.theory.flops``, which counts grouped-query
  attention and an MoE layer's active experts), else its layer count, else 1 — times this
  stage's.

**The saving** of rank r in a step is the replayed makespan with every rank as measured minus
the replayed makespan with r's own work at its reference pace (``graph.StepGraph.replay``);
it is negative for a rank faster than its reference.

**Noise and the straggler.** Two things a saving must stand above:

- the run's own step-to-step noise — ``noise_us``, 1.4826 × the median absolute deviation of
  the step time over the step timers' non-warm-up steps (every step, not only the profiled
  ones; over the profiled steps' replayed makespans when there are no step timers) — divided
  by √(profiled steps), since a saving is a mean over the profiled steps;
- the what-if's own floor — ``floor_us``, per step the largest saving of any other rank (what
  holding a healthy rank against its peers gives on this machine: its peers' pace differs by
  that much when nothing is wrong), the median over steps. (A healthy rank held against a slow
  peer shows a negative saving: that is the straggler's mirror image, not noise.)

The straggler is the rank with the largest saving (median over steps) when it is at least
``NOISE_FACTOR`` × both and at least ``MIN_SAVING_PCT`` of the step, and the rank's saving is
the largest — and above the resolution — in at least two thirds of the profiled steps (a slow
rank is slow every step; a rank that one step's contention slowed is not a straggler);
otherwise there is none.

``whatif_table`` columns: rank, step, makespan_us (replayed as measured), whatif_us (with the
rank at its reference pace), saving_us, reference.
``rank_savings`` columns: rank, stage, saving_us (the median over profiled steps: one step that
another process disturbed does not decide it), saving_pct (of the mean makespan), reference, critical_path_share (share of the critical path that is this rank's
own work), wait_us (mean per step of the waits it suffered), wait_caused_us (mean per step
of the waits charged to it: ``graph.waits_charged``).
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Mapping

import numpy as np
import pandas as pd

from meshscope.analysis.records.steps import noise as robust_noise

from meshscope.collectors.run_info import ModelInfo, RunInfo
from meshscope.theory.flops import head_training_flops_per_token, layer_training_flops_per_token
from meshscope.theory.params import DecoderShape

from meshscope.analysis.crossrank.graph import (CALL, PATH_COLUMNS, Operation, RankStep,
                                               StepGraph, waits_charged)
from meshscope.analysis.crossrank.program import StepGraphs

NOISE_FACTOR = 2.0
MIN_SAVING_PCT = 5.0
WHATIF_COLUMNS = ["rank", "step", "makespan_us", "whatif_us", "saving_us", "reference"]
SAVINGS_COLUMNS = ["rank", "stage", "saving_us", "saving_pct", "reference",
                   "critical_path_share", "wait_us", "wait_caused_us"]


def _decoder_shape(m: ModelInfo) -> DecoderShape:
    """run.json's model as ``meshscope.theory`` counts it: grouped-query attention when it
    names fewer key/value heads, an MoE layer's router and top-k experts (the runner's default
    top-k, 2, when run.json does not say)."""
    return DecoderShape(dim=m.dim, n_layers=max(m.n_layers or 1, 1), ffn_hidden=m.ffn_hidden,
                        seq_len=m.seq_len, vocab_size=m.vocab_size or 0,
                        n_heads=m.n_heads or 1,
                        n_kv_heads=m.n_kv_heads if m.n_heads else None,
                        moe_experts=m.moe_experts or 0, moe_top_k=m.moe_top_k or 2,
                        moe_every=m.moe_every or 1, moe_hidden=m.moe_hidden)


def stage_work_units(run: RunInfo | None) -> dict[int, float]:
    """stage → its work content (module docstring): training FLOPs per token of its layers and,
    on the last stage, the output head; its layer count when the model is unknown."""
    if run is None or run.pipeline_stages < 2:
        return {}
    p, v = run.pipeline_stages, max(run.virtual_stages, 1)
    layers = run.stage_layers
    m = run.model
    units = {}
    for s in range(p):
        # Rank-stage s holds global stages s, s + p, … (loop placement) or s and 2p−1−s (V).
        if layers is None:
            n_layers = [1] * v
            held = [s]
        else:
            held = [s + i * p for i in range(v)] if run.schedule not in ("zbv", "dualpipev") \
                else [s, 2 * p - 1 - s]
            n_layers = [len(layers[g]) for g in held if g < len(layers)]
        total_stages = p * v
        if m.dim and m.ffn_hidden and m.seq_len:
            shape = _decoder_shape(m)
            if layers is None:   # which layers: unknown; each chunk an average layer
                mean = sum(layer_training_flops_per_token(shape, i)
                           for i in range(shape.n_layers)) / shape.n_layers
                flops = mean * v
            else:
                flops = sum(layer_training_flops_per_token(shape, i)
                            for g in held if g < len(layers) for i in layers[g])
            if m.vocab_size and (total_stages - 1) in held:
                flops += head_training_flops_per_token(shape)
            units[s] = float(flops)
        else:
            units[s] = float(max(sum(n_layers), 1))
    return units


def _peer_finder(present: list[int], run: RunInfo | None):
    """rank → its stage peers among ``present`` (sorted): ``RunInfo.stage_peers`` restricted
    to the ranks in the step, with the stages grouped once instead of scanning every rank of
    the run for each rank and looking each peer up in a list (cubic in the rank count)."""
    if run is None:
        return lambda rank: [r for r in present if r != rank]
    placed = set(run.coordinates)
    by_stage: dict[int | None, list[int]] = defaultdict(list)
    for r in present:
        if r in placed:
            by_stage[run.stage_of(r)].append(r)
    return lambda rank: [r for r in by_stage.get(run.stage_of(rank), []) if r != rank] \
        if rank in placed else []


def reference_scales(graph: StepGraph, run: RunInfo | None, ops: dict[str, str],
                     out_bytes: dict[tuple[int, str], float]
                     ) -> dict[int, tuple[np.ndarray, str, list[int]]]:
    """rank → (per-point scale factors that bring its own work to its reference pace, a few
    words naming the reference, the peers it was held against)."""
    present = sorted(graph.ranks)
    units = stage_work_units(run)
    ep = run is not None and run.size("ep") > 1
    # Each rank's program (its calls' ops), segments and own work per segment, once: every
    # rank is compared with each of its peers. Ranks with one program share a matrix of their
    # segments' own work (a row per rank), from which a rank's reference is its peers' rows'
    # median per segment.
    # Programs are numbered once (a dict lookup per rank), so that comparing two ranks'
    # programs compares two integers, not two tuples of every call of the step.
    numbered: dict[tuple[str, ...], int] = {}
    program = {r: numbered.setdefault(graph.ranks[r].call_ops(ops), len(numbered))
               for r in present}
    segments = {r: graph.ranks[r].segments() for r in present}
    seg_own = {r: [sum(graph.ranks[r].points[i].own_us for i in seg) for seg in segments[r]]
               for r in present}
    table: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r in present:
        table[(program[r], len(segments[r]))].append(r)
    matrix = {k: np.array([seg_own[r] for r in rows], dtype=np.float64).reshape(len(rows), -1)
              for k, rows in table.items()}
    row_of = {r: i for rows in table.values() for i, r in enumerate(rows)}
    peers_of = _peer_finder(present, run)
    out = {}
    for r in present:
        rs = graph.ranks[r]
        scale = np.ones(len(rs.points))
        peers = peers_of(r)
        if peers:
            mine = program[r]
            same = [q for q in peers if program[q] == mine]
            if same:
                segs = segments[r]
                kind = (mine, len(segs))
                rows = [row_of[q] for q in same]
                refs = np.median(matrix[kind][rows], axis=0) if len(segs) else []
                for j, seg in enumerate(segs):
                    own = seg_own[r][j]
                    ref = float(refs[j])
                    opener = _opening_call(rs, segs, j)
                    if ep and opener is not None and ops.get(rs.points[opener].mid) == \
                            "all_to_all":
                        # Expert work: the peers' time per received byte × this rank's bytes.
                        ref_vals = []
                        for q in same:
                            q_own = seg_own[q][j]
                            mine_b = out_bytes.get((r, rs.points[opener].mid))
                            q_open = _opening_call(graph.ranks[q], segments[q], j)
                            q_b = out_bytes.get((q, graph.ranks[q].points[q_open].mid)) \
                                if q_open is not None else None
                            if mine_b and q_b:
                                q_own = q_own / q_b * mine_b
                            ref_vals.append(q_own)
                        ref = float(np.median(ref_vals))
                    if own > 0:
                        scale[seg] = ref / own
                out[r] = (scale, f"stage peers {same}", same)
                continue
            totals = [graph.ranks[q].own_total_us for q in peers]
            if rs.own_total_us > 0:
                scale[:] = float(np.median(totals)) / rs.own_total_us
            out[r] = (scale, f"stage peers {peers} (whole step: their calls differ)", peers)
            continue
        if run is not None and units:
            stage = run.stage_of(r)
            others = [q for q in present if run.stage_of(q) != stage]
            rates = [graph.ranks[q].own_total_us / units[run.stage_of(q)] for q in others
                     if run.stage_of(q) in units and units[run.stage_of(q)] > 0]
            if rates and stage in units and rs.own_total_us > 0:
                scale[:] = float(np.median(rates)) * units[stage] / rs.own_total_us
                out[r] = (scale, "other stages, per unit of work", [])
                continue
        out[r] = (scale, "none", [])
    return out


def _opening_call(rs: RankStep, segs: list[list[int]], j: int) -> int | None:
    """Index of the call that opens segment j (the last point of segment j−1)."""
    if j == 0:
        return None
    i = segs[j - 1][-1]
    return i if rs.points[i].kind == CALL else None


@dataclasses.dataclass
class WhatIf:
    table: pd.DataFrame        # WHATIF_COLUMNS
    savings: pd.DataFrame      # SAVINGS_COLUMNS
    critical_path: pd.DataFrame
    straggler: dict | None
    noise_us: float
    step_time_us: float        # mean replayed makespan over steps
    floor_us: float            # the what-if's own floor (module docstring)
    resolution_us: float       # what a saving must beat: ``resolution``
    dim_savings: dict[str, float]   # dimension → mean saving with its operations instant
    imbalance: dict | None     # stage balance on the straggler-corrected run (below)
    charged: list[tuple[int, int, int, float, float]]  # (step, waiter, cause, µs, end)


def resolution(noise_us: float, n_steps: int, floor_us: float = 0.0) -> float:
    """The smallest saving the run can resolve: the larger of the step noise over
    √(profiled steps) and the what-if floor (module docstring). Findings are judged by it too
    (``analysis/report/findings.py``)."""
    step_noise = noise_us / np.sqrt(max(n_steps, 1)) if np.isfinite(noise_us) else 0.0
    return float(max(step_noise, floor_us))


def _stage_balance(g: StepGraph, run: RunInfo | None, base_scale: dict[int, np.ndarray]
                   ) -> tuple[dict[int, float], dict[int, float]] | None:
    """Per stage its mean own work (with ``base_scale`` applied) and, per rank, the factor that
    brings its stage to the mean of the stages; None without a pipeline."""
    if run is None or run.pipeline_stages < 2:
        return None
    work: dict[int, list[float]] = {}
    for r, rs in g.ranks.items():
        st = run.stage_of(r)
        if st is None:
            continue
        f = base_scale.get(r)
        own = np.array([p.own_us for p in rs.points])
        work.setdefault(st, []).append(float((own * f).sum()) if f is not None
                                       else float(own.sum()))
    if len(work) < 2:
        return None
    per_stage = {s: float(np.mean(v)) for s, v in work.items()}
    mean = float(np.mean(list(per_stage.values())))
    factors = {r: mean / per_stage[run.stage_of(r)] for r in g.ranks
               if run.stage_of(r) in per_stage and per_stage[run.stage_of(r)] > 0}
    return per_stage, factors


def analyse(graphs: Mapping[int, StepGraph], run: RunInfo | None, ops: dict[str, str],
            out_bytes: dict[tuple[int, str], float], noise_us: float | None) -> WhatIf:
    """Savings, the straggler, per-dimension savings and the stage balance over every step's
    graph (module docstring). ``graphs`` is read a step at a time (``program.StepGraphs``
    builds each on access): one step's graph is held at once, never every step's."""
    rows, paths, charged = [], [], []
    charged_us: dict[int, float] = {}
    suffered: dict[int, float] = {}
    share: dict[int, list[float]] = {}
    refs: dict[int, tuple[str, list[int]]] = {}
    scales_by_step: dict[int, dict[int, np.ndarray]] = {}
    dims = sorted({op.dim for step in graphs for op in _operations(graphs, step).values()})
    dim_saved: dict[str, list[float]] = {d: [] for d in dims}
    for step in sorted(graphs):
        g = graphs[step]
        measured = g.replay()       # one replay of the measured step, read three ways
        base = measured[0]
        if not np.isfinite(base) or base <= 0:
            continue
        path = g.critical_path(measured)
        paths.append(path)
        work = path[path["kind"] == "work"]
        total = float(path["dur_us"].sum()) or 1.0
        for r in g.ranks:
            share.setdefault(r, []).append(float(work.loc[work["rank"] == r, "dur_us"].sum())
                                           / total)
        for waiter, cause, us, end in waits_charged(g, measured):
            suffered[waiter] = suffered.get(waiter, 0.0) + us
            charged_us[cause] = charged_us.get(cause, 0.0) + us
            charged.append((step, waiter, cause, us, end))
        del measured
        scales = reference_scales(g, run, ops, out_bytes)
        scales_by_step[step] = {r: scale for r, (scale, _, _) in scales.items()}
        whatifs = g.replay_each(scales_by_step[step])
        for r, (scale, ref, peers) in scales.items():
            refs[r] = (ref, peers)
            what = whatifs[r]
            rows.append({"rank": r, "step": step, "makespan_us": base, "whatif_us": what,
                         "saving_us": base - what, "reference": ref})
        for d in dims:
            what, _, _ = g.replay(transfer_factor={d: 0.0})
            if np.isfinite(what):
                dim_saved[d].append(base - what)
    g = None        # the last step's graph let go before the stage balance builds them again
    table = pd.DataFrame(rows, columns=WHATIF_COLUMNS)
    n_steps = max(table["step"].nunique(), 1) if len(table) else 1
    step_time = float(table.groupby("step")["makespan_us"].first().mean()) if len(table) else \
        float("nan")
    if noise_us is None or not np.isfinite(noise_us):
        spans = table.groupby("step")["makespan_us"].first() if len(table) else pd.Series([])
        noise_us = robust_noise(spans)
    sav_rows = []
    for r, grp in table.groupby("rank") if len(table) else []:
        saving = float(grp["saving_us"].median())
        sav_rows.append({"rank": int(r), "stage": run.stage_of(r) if run else None,
                         "saving_us": saving,
                         "saving_pct": 100 * saving / step_time if step_time > 0 else np.nan,
                         "reference": refs.get(r, ("none", []))[0],
                         "critical_path_share": float(np.mean(share.get(r, [0.0]))),
                         "wait_us": suffered.get(r, 0.0) / n_steps,
                         "wait_caused_us": charged_us.get(r, 0.0) / n_steps})
    savings = pd.DataFrame(sav_rows, columns=SAVINGS_COLUMNS)
    straggler, floor_us = _straggler(table, savings, refs, noise_us, n_steps)
    imbalance = _imbalance(graphs, run, scales_by_step, straggler)
    path = pd.concat(paths, ignore_index=True) if paths else \
        pd.DataFrame(columns=PATH_COLUMNS)
    return WhatIf(table, savings, path, straggler,
                  float(noise_us) if np.isfinite(noise_us) else float("nan"), step_time,
                  floor_us, resolution(noise_us, n_steps, floor_us),
                  {d: float(np.mean(v)) for d, v in dim_saved.items() if v}, imbalance,
                  charged)


def _straggler(table: pd.DataFrame, savings: pd.DataFrame,
               refs: dict[int, tuple[str, list[int]]], noise_us: float, n_steps: int
               ) -> tuple[dict | None, float]:
    """The straggler (None without one) and the what-if's floor: the rank of the largest
    median saving is the straggler when its saving stands above the gate (``NOISE_FACTOR`` ×
    the resolution, ``resolution``), is at least ``MIN_SAVING_PCT`` of the step, and is the
    largest in at least two steps of three; the floor is the median over steps of the largest
    saving any other rank has."""
    if not len(savings):
        return None, 0.0
    floor_us = 0.0
    top = savings.loc[savings["saving_us"].idxmax()]
    others = table[table["rank"] != top["rank"]]
    if len(others):
        floor_us = float(others.assign(a=others["saving_us"].clip(lower=0.0))
                         .groupby("step")["a"].max().median())
    res = resolution(noise_us, n_steps, floor_us)
    gate = NOISE_FACTOR * res
    tops = table.loc[table.groupby("step")["saving_us"].idxmax()]
    mine = tops[(tops["rank"] == top["rank"]) & (tops["saving_us"] >= res)]
    steady = len(mine) >= np.ceil(2 * n_steps / 3)
    if not (top["saving_us"] >= gate and top["saving_pct"] >= MIN_SAVING_PCT and steady):
        return None, floor_us
    r = int(top["rank"])
    return {"rank": r, "saving_us": float(top["saving_us"]),
            "saving_pct": float(top["saving_pct"]), "reference": top["reference"],
            "peers": refs.get(r, ("none", []))[1],
            "noise_us": float(noise_us) if np.isfinite(noise_us) else None,
            "floor_us": floor_us, "gate_us": float(gate),
            "stage": top["stage"],
            "critical_path_share": float(top["critical_path_share"]),
            "wait_caused_us": float(top["wait_caused_us"])}, floor_us


def _operations(graphs: Mapping[int, StepGraph], step: int) -> dict[str, Operation]:
    """A step's matched operations, without building its graph where ``graphs`` can."""
    if isinstance(graphs, StepGraphs):
        return graphs.operations(step)
    return graphs[step].ops


def _imbalance(graphs, run, scales_by_step, straggler) -> dict | None:
    """The stage balance what-if on the run with the straggler (if any) at its peers' pace:
    ``saving_us`` (mean per step), ``max_over_mean`` and ``slowest_stage`` of the stages' mean
    own work, ``stage_work_us`` per stage."""
    if run is None or run.pipeline_stages < 2:
        return None         # no stages to balance (``_stage_balance``): no graph built
    savings, ratios, per_stage_all = [], [], {}
    for step in sorted(graphs):
        g = graphs[step]
        base_scale = {}
        if straggler is not None and straggler["rank"] in scales_by_step.get(step, {}):
            base_scale = {straggler["rank"]: scales_by_step[step][straggler["rank"]]}
        bal = _stage_balance(g, run, base_scale)
        if bal is None:
            return None
        per_stage, factors = bal
        fixed, _, _ = g.replay(base_scale)
        combined = {r: (base_scale[r] if r in base_scale else 1.0) * f for r, f in factors.items()}
        balanced, _, _ = g.replay(combined)
        if np.isfinite(fixed) and np.isfinite(balanced):
            savings.append(fixed - balanced)
        mean = float(np.mean(list(per_stage.values())))
        ratios.append(max(per_stage.values()) / mean if mean > 0 else 1.0)
        for st, w in per_stage.items():
            per_stage_all.setdefault(st, []).append(w)
    if not savings:
        return None
    stage_work = {int(st): float(np.mean(v)) for st, v in per_stage_all.items()}
    mean = float(np.mean(list(stage_work.values())))
    slowest = max(stage_work, key=stage_work.get)
    return {"saving_us": float(np.mean(savings)),
            "max_over_mean": stage_work[slowest] / mean if mean > 0 else 1.0,
            "slowest_stage": slowest, "stage_work_us": stage_work}
