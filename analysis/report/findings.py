"""Findings: what is wrong with a run, ranked by what fixing it would save, each with the
numbers behind it and the remedy that fits its cause.

A finding (``Finding``) has ``id``, ``severity`` (``high`` when it costs ≥ 10% of the step,
``medium`` ≥ 3%, else ``low``; never above ``low`` when its cost does not stand three times
above the run's own step-to-step noise), ``dimension``, ``cost_us`` / ``cost_pct`` (the what-if
saving per profiled step, and its share of the step; null for hangs and desyncs, which stop a
job rather than slow it), ``title``, ``evidence`` (the numbers, ranks, group and steps behind
it), ``remedy``, ``what_if`` (the step time were it fixed, and the assumption) and ``symptoms``
(other observations it explains). A cost that does not beat the noise (nor 1% of the step) is
no finding at all: a healthy run has none of the timing findings. Each finding's ``cites``
name the rows of the report's tables its numbers come from (``finding_rules.cite``): the
first names the rank and step the finding is about, where it names one.

The findings, from ``FindingInputs``, in the order they are judged — each later one on the
run *with the earlier causes fixed*, so that a symptom of one is not reported as another:

- ``hang`` — ranks missing from a collective (Flight Recorder); first, always high. Its title
  names every hung rank and the earliest collective some ranks never reached, per process
  group (``records.flight_recorder.hang``: a rank missing only because it waits in an earlier
  collective is not hung, it is a symptom).
- ``desync`` — ranks whose entries of one collective disagree in a way its op does not allow.
- ``straggler`` — the rank whose work at its reference pace saves the most
  (``analysis/crossrank/whatif.py``); cost: that saving. Its peers' waits, the pipeline bubble
  it causes and its share of the critical path are its evidence and symptoms, not findings.
  On GPU traces a straggler whose device mostly *idles* more than its peers' (it is not
  computing more, it is not given work) is ``host-bound`` instead: the host does not launch
  work fast enough (data loading, Python overhead, CPU contention).
- ``stage-imbalance`` — with the straggler at its peers' pace, the pipeline stages' work still
  unequal (max/mean > 1.1); cost: the replay with every stage's work at the mean.
- ``pipeline-bubble`` — the schedule's own bubble: the closed form's fraction of the pipeline
  window ((p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1) interleaved, (p−1)/(3·v·m+p−1)
  for the zero-bubble schedules); its cost is all of it (no schedule saves all: a zero-bubble
  one leaves a third of interleaving's); the remedy gives the closed form at twice the
  microbatches and, for the other schedules, ZB1P's at these microbatches. What the
  measured bubble has beyond it is the straggler's or the stage imbalance's when those exist
  (their evidence), transfer time and contention otherwise (this finding's evidence).
- ``exposed-comm-<dim>`` — communication of one dimension that nothing hides; cost: the
  replay with that dimension's operations finishing as soon as their last rank arrives
  (``transfer_factor`` 0). Waiting for a straggler is not transfer: it is not counted here.
- ``slow-steps`` — steps the step timers flag (warm-up excluded, ``analysis/records/steps.py``);
  cost: their excess over the median, per step.
- the memory findings (``analysis/report/memory_findings.py``): ``near-oom`` ranked right after
  a hang or desync, ``memory-imbalance``, ``memory-growth``, ``memory-fragmentation`` and
  ``largest-allocator`` after the time findings, largest peak saving first; they cost bytes of
  the peak (``peak_saving_bytes``), not time.
- the findings of one rank's own time, for one rank as for many
  (``analysis/report/device_findings.py``): ``data-loading-stall``, ``sync-stall``,
  ``launch-bound``, ``memcpy-on-critical-path``, ``exposed-comm-<dim>`` without a cross-rank
  what-if (its exposed time), ``arrival-jitter``, ``low-gemm-efficiency`` and ``gpu-idle``
  (always, for a GPU idle over a third of the step).
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from meshscope.analysis.pipeline.bubble import theory_fraction
from meshscope.analysis.records import flight_recorder as fr_records
from meshscope.analysis.report.device_findings import device_findings
from meshscope.analysis.report.finding_rules import (MIN_COST_PCT, NOISE_FACTOR, REMEDIES,  # noqa: F401
                                                     FindingInputs)
from meshscope.analysis.report.finding_rules import beats_noise as _beats_noise
from meshscope.analysis.report.finding_rules import cite
from meshscope.analysis.report.finding_rules import ms as _ms
from meshscope.analysis.report.finding_rules import timed as _timed
from meshscope.analysis.report.model import Finding
from meshscope.theory.schedules import INTERLEAVED, ZERO_BUBBLE
from meshscope.analysis.timeline.breakdown import rank_means
from meshscope.vocabulary import exposed_comm_id

HOST_BOUND_REMEDY = ("the host does not launch work fast enough: look at data loading, "
                     "Python overhead and CPU contention on that rank's host")
STRAGGLER_REMEDY = ("find what slows that rank: its host (other processes, CPU frequency, "
                    "thermal limits), its data loading, or its placement")

def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
            for r in df.to_dict("records")]


HANG_REMEDY = ("see why those ranks never issued the collective (a code path that skips it, an "
               "exception, a desynchronised schedule, a rank stuck in its own work)")
DESYNC_REMEDY = ("make every rank issue the same collective with compatible sizes: the "
                 "program's ranks disagree (split sizes, shapes, dtypes or the op itself)")


def _ranks_text(ranks: list[int]) -> str:
    """``Rank 2`` / ``Ranks 5 and 13`` / ``Ranks 1, 4 and 9``."""
    if len(ranks) == 1:
        return f"Rank {ranks[0]}"
    return "Ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _hang(hangs: pd.DataFrame) -> Finding | None:
    """The hang finding: every hung rank, the earliest collective some ranks never reached and,
    per process group, the first one its hung ranks never reached
    (``records.flight_recorder.hang``)."""
    h = fr_records.hang(hangs)
    if h is None:
        return None
    earliest = h.first[0]
    op = earliest.op
    same = [f for f in h.first if f.op == op]
    where = "; ".join(f"group {f.process_group} ({f.group_desc}) #{f.seq} without "
                      f"{'rank' if len(f.ranks_missing) == 1 else 'ranks'} "
                      f"{', '.join(map(str, f.ranks_missing))}" for f in same[:4])
    if len(same) > 4:
        where += f"; and {len(same) - 4} more groups"
    title = (f"{_ranks_text(h.hung_ranks)} never reached {op} ({where}) — the earliest "
             f"collective some ranks never reached, by the creation times of the ranks that "
             f"issued it")
    later: dict[str, list[str]] = {}
    for f in h.first:
        if f.op != op:
            later.setdefault(f.op, []).append(f"{f.process_group} ({f.group_desc})")
    if later:
        title += "; later also " + ", ".join(
            f"{o} in group{'s' if len(g) > 1 else ''} {', '.join(g[:3])}"
            + (f" and {len(g) - 3} more" if len(g) > 3 else "") for o, g in later.items())
    first = hangs[hangs["verdict"] == "missing"].iloc[0]
    evidence = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in first.items()}
    evidence.update(hung_ranks=h.hung_ranks, waiting_ranks=h.waiting_ranks, count=h.count,
                    first_missed=[dataclasses.asdict(f) for f in h.first])
    symptoms = []
    if h.waiting_ranks:
        symptoms.append(f"{_ranks_text(h.waiting_ranks)} also never reached a later "
                        f"collective: they wait in one issued earlier")
    # The verdict rows: per group, the first collective its hung ranks never reached.
    cites = [cite("flight_recorder", process_group=f.process_group, seq=f.seq)
             for f in h.first]
    return Finding("hang", "high", "all", None, None, title, evidence, HANG_REMEDY,
                   {"step_time_us": None, "assumption": "no hang"}, symptoms, cites=cites)


def _with_causes(f: Finding, causes: pd.DataFrame, kinds: tuple[str, ...],
                 ranks: set[int] | None = None) -> Finding:
    """``f`` told by its causes (``records/hang_causes.py``): the causes of ``kinds`` (those
    of ``ranks`` where given) in its title and evidence, their remedies as its remedy, their
    rows cited."""
    if causes is None or causes.empty:
        return f
    mine = causes[causes["cause"].isin(kinds)]
    if ranks is not None:
        mine = mine[[c == "no-dump" or bool(set(int(r) for r in rs) & ranks)
                     for c, rs in zip(mine["cause"], mine["ranks"])]]
    if mine.empty:
        return f
    said = []
    for c in mine.itertuples(index=False):
        rs = [int(r) for r in c.ranks]
        said.append(f"{c.cause.replace('-', ' ')} "
                    f"(rank{'s' * (len(rs) != 1)} {', '.join(map(str, rs))})")
    f.title += " — cause: " + "; ".join(dict.fromkeys(said))
    f.remedy = "; then ".join(dict.fromkeys(str(c) for c in mine["remedy"]))
    f.evidence["causes"] = [{"cause": str(c.cause), "ranks": [int(r) for r in c.ranks],
                             "collective": str(c.collective), "evidence": str(c.evidence)}
                            for c in mine.itertuples(index=False)]
    f.cites = [*f.cites, *(cite("hang_causes", cause=str(c), page="health")
                           for c in dict.fromkeys(mine["cause"]))]
    return f


#: The causes that explain ranks missing from a collective, and those that explain ranks
#: disagreeing on one (``records/hang_causes.CAUSES``).
_HANG_CAUSES = ("host-stopped", "divergence", "mismatch", "exited", "no-dump")
_DESYNC_CAUSES = ("mismatch", "divergence")
_STALL_CAUSES = ("device-stopped", "transport-stalled")


def _stall(causes: pd.DataFrame | None) -> Finding | None:
    """A hang no rank is missing from: a collective every rank issued and none completes,
    because a device stopped before it or the transport stalls (``hang_causes``)."""
    if causes is None or causes.empty:
        return None
    rows = causes[causes["cause"].isin(_STALL_CAUSES)]
    if rows.empty:
        return None
    first = rows.iloc[0]
    ranks = [int(r) for r in first["ranks"]]
    title = (f"{_ranks_text(ranks)} never get through {first['collective']}: "
             + ("their device stopped before it" if first["cause"] == "device-stopped" else
                "it started on every member and completes on none"))
    f = Finding("hang", "high", "all", None, None, title,
                {"process_group": str(first["process_group"]), "seq": int(first["seq"]),
                 "hung_ranks": ranks}, str(first["remedy"]),
                {"step_time_us": None, "assumption": "no hang"}, [],
                cites=[cite("hang_causes", cause=str(first["cause"]), page="health")])
    return _with_causes(f, causes, _STALL_CAUSES)


def _flight_recorder(hangs: pd.DataFrame | None,
                     causes: pd.DataFrame | None = None) -> list[Finding]:
    out = []
    if hangs is None or hangs.empty:
        stalled = _stall(causes)
        return [stalled] if stalled is not None else []
    found = _hang(hangs)
    if found is not None:
        hung = set(found.evidence.get("hung_ranks", []))
        out.append(_with_causes(found, causes, _HANG_CAUSES, hung))
    else:
        stalled = _stall(causes)
        if stalled is not None:
            out.append(stalled)
    rows = hangs[hangs["verdict"] == "mismatch"]
    if not rows.empty:          # the earliest issued (the verdicts' order)
        first = rows.iloc[0]
        evidence = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in first.items()}
        evidence["count"] = int(len(rows))
        desync = Finding("desync", "high", "all", None, None, str(first["detail"]),
                         evidence, DESYNC_REMEDY, {"step_time_us": None,
                                                   "assumption": "no desync"},
                         cites=[cite("flight_recorder", process_group=first["process_group"],
                                     seq=first["seq"], verdict="mismatch")])
        out.append(_with_causes(desync, causes, _DESYNC_CAUSES))
    return out


def _per_rank(inp: FindingInputs) -> pd.DataFrame:
    return rank_means(inp.breakdown)


def _straggler(inp: FindingInputs) -> Finding | None:
    st = inp.straggler
    if not st:
        return None
    r = st["rank"]
    per_rank = _per_rank(inp)
    sav = inp.savings.set_index("rank") if len(inp.savings) else pd.DataFrame()
    peers = [int(x) for x in st.get("peers", [])]
    evidence = {"rank": r, "stage": st.get("stage"), "saving_us": st["saving_us"],
                "reference": st["reference"], "noise_us": st["noise_us"],
                "critical_path_share": st["critical_path_share"],
                "wait_caused_us": st["wait_caused_us"]}
    symptoms = []
    if r in per_rank.index:
        evidence["compute_us"] = float(per_rank.loc[r, "compute_us"])
        if peers:
            ref = per_rank.loc[[p for p in peers if p in per_rank.index], "compute_us"]
            if len(ref):
                evidence["peer_compute_us"] = float(ref.median())
    waited = sav[(sav.index != r) & (sav["wait_us"] > 0)] if len(sav) else sav
    if len(waited):
        symptoms.append("ranks " + ", ".join(str(int(q)) for q in waited.index) + " wait "
                        + ", ".join(_ms(float(w)) for w in waited["wait_us"])
                        + " per step, charged to rank " + str(r))
    fid, remedy = "straggler", STRAGGLER_REMEDY
    # Its saving, waits caused and critical-path share (rank_waits), its compute (breakdown).
    cites = [cite("rank_waits", rank=r), cite("breakdown", rank=r)]
    title = (f"Rank {r} is the straggler: at its "
             f"{'peers' if peers else 'reference'}' pace the step would be "
             f"{_ms(st['saving_us'])} ({100 * st['saving_us'] / inp.step_us:.0f}% of its "
             f"{_ms(inp.step_us)} step) shorter")
    if "peer_compute_us" in evidence:
        title += (f"; it computes {_ms(evidence['compute_us'])} per step against "
                  f"{_ms(evidence['peer_compute_us'])} for its stage peers")
    if inp.on_gpu and r in per_rank.index and peers:
        idle = per_rank["idle_us"]
        mine, theirs = float(idle.loc[r]), float(idle.loc[[p for p in peers
                                                            if p in idle.index]].median())
        if mine - theirs > 0.5 * st["saving_us"]:
            fid, remedy = "host-bound", HOST_BOUND_REMEDY
            evidence.update(idle_us=mine, peer_idle_us=theirs)
            title = (f"Rank {r}'s GPU idles {_ms(mine - theirs)} per step more than its "
                     f"peers': its host does not launch work fast enough")
            if inp.idle is not None and len(inp.idle) and (inp.idle["rank"] == r).any():
                cites.append(cite("idle", rank=r))
    return _timed(fid, "all", st["saving_us"], inp, title, evidence, remedy,
                  f"rank {r}'s own work at its reference pace ({st['reference']})", symptoms,
                  cites=cites)


def _imbalance(inp: FindingInputs) -> Finding | None:
    imb = inp.imbalance
    if not imb or imb.get("max_over_mean", 1.0) <= 1.1:
        return None
    cost = float(imb["saving_us"])
    if not _beats_noise(cost, inp.step_us, inp.noise_us):
        return None
    slowest = imb["slowest_stage"]
    title = (f"Stage {slowest} is the slowest: {imb['max_over_mean']:.2f}× the mean work per "
             f"stage")
    cites = [cite("summary", page="pipeline", field="stage_imbalance_without_straggler")]
    if len(inp.bubbles) and (inp.bubbles["stage"] == slowest).any():
        cites.append(cite("bubbles", stage=slowest))
    return _timed("stage-imbalance", "pp", cost, inp, title, dict(imb),
                  "rebalance layers across stages (--stage-layers)",
                  "every stage's work at the mean" + (" (with the straggler at its peers' "
                                                      "pace)" if inp.straggler else ""),
                  cites=cites)


def _bubble(inp: FindingInputs, causes: list[str]) -> Finding | None:
    if inp.bubbles.empty or inp.stages < 2:
        return None
    stage = inp.bubbles.groupby("stage").mean(numeric_only=True)
    theory = theory_fraction(inp.schedule, inp.stages, inp.microbatches, inp.virtual_stages)
    if not theory == theory or theory <= 0:
        return None
    window = float(stage["pipeline_window_us"].mean())
    cost = theory * window
    if not _beats_noise(cost, inp.step_us, float("nan")):
        return None
    measured = float(stage["bubble_fraction"].mean())
    replayed = float(stage["replayed_bubble_fraction"].mean()) \
        if "replayed_bubble_fraction" in stage else float("nan")
    twice = theory_fraction(inp.schedule, inp.stages, 2 * inp.microbatches, inp.virtual_stages)
    evidence = {"theory_fraction": theory, "measured_fraction": measured,
                "replayed_fraction": replayed, "pipeline_window_us": window,
                "stages": inp.stages, "microbatches": inp.microbatches,
                "theory_at_twice_the_microbatches": twice,
                "per_stage": _records(stage[["bubble_fraction"]].reset_index())}
    if causes:
        evidence["excess_explained_by"] = " and ".join(causes)
    else:
        evidence["excess_explained_by"] = ("transfer time and contention (measured − replayed)"
                                           if measured > theory else None)
    title = (f"Pipeline bubble: the {inp.schedule} schedule leaves {theory:.0%} of the "
             f"pipeline window idle with {inp.stages} stages and {inp.microbatches} "
             f"microbatches (measured {measured:.0%})")
    remedy = f"{2 * inp.microbatches} microbatches would bring the closed form to {twice:.0%}"
    if inp.schedule in ZERO_BUBBLE:
        pass        # already the schedule that leaves least: only more microbatches help
    else:
        v = inp.virtual_stages if inp.schedule in INTERLEAVED else 1
        zb = theory_fraction("zero-bubble", inp.stages, inp.microbatches, v)
        other = ("more virtual stages per rank, or" if inp.schedule in INTERLEAVED
                 else "an interleaved schedule, or")
        remedy += (f"; or {other} a zero-bubble schedule (ZB1P, with these microbatches: "
                   f"{zb:.0%})")
    return _timed("pipeline-bubble", "pp", cost, inp, title, evidence, remedy,
                  "the pipeline with no idle slot at all, as the closed form counts the bubble "
                  "(no schedule reaches it: the zero-bubble ones leave (p−1)/(3·v·m+p−1))",
                  measured=False, cites=[cite("bubbles")])


def _exposed_on_path(per_rank: pd.Series, bubbles: pd.DataFrame) -> float:
    """The most exposed time one step's path can hold: the largest of any rank's, or on a
    pipeline the sum over its stages of each stage's largest."""
    if bubbles is None or bubbles.empty or "stage" not in bubbles:
        return float(per_rank.max())
    stage = bubbles.drop_duplicates("rank").set_index("rank")["stage"]
    by_stage = per_rank.groupby(per_rank.index.map(stage)).max()
    return float(by_stage.sum()) if len(by_stage) else float(per_rank.max())


def _exposed(inp: FindingInputs) -> list[Finding]:
    out = []
    per_rank = _per_rank(inp)
    for dim, cost in sorted(inp.dim_savings.items()):
        if not _beats_noise(cost, inp.step_us, inp.noise_us):
            continue
        col = f"exposed_comm_{dim}_us"
        evidence = {"saving_us": cost}
        cites = [cite("exposed_comm", dim=dim)]
        if col in per_rank:
            worst = per_rank[col].idxmax()
            exposed = float(per_rank.loc[worst, col])
            evidence.update(rank=int(worst), exposed_us=exposed,
                            overlap_pct=float(per_rank.loc[worst, "overlap_pct"]))
            # The rank whose exposed time it names: its rows of the dimension, its breakdown.
            cites = [cite("exposed_comm", rank=worst, dim=dim), cite("breakdown", rank=worst)]
            # Full overlap cannot save more than the time that is exposed on the step's path:
            # a rank's, or one rank's per pipeline stage (the stages run one after another).
            bound = _exposed_on_path(per_rank[col], inp.bubbles)
            evidence["exposed_on_path_us"] = bound
            cost = min(cost, bound)
            if not _beats_noise(cost, inp.step_us, inp.noise_us):
                continue
        timing = inp.dim_timing.get(dim, {})
        evidence.update(timing)
        colls = inp.collectives
        if timing and colls is not None and len(colls) and (colls["dim"] == dim).any():
            cites.append(cite("collectives", dim=dim, page="communication"))
        title = (f"Exposed {dim} communication: finishing it as soon as its last rank arrives "
                 f"would save {_ms(cost)} per step")
        t, after = timing.get("transfer_us"), timing.get("after_last_us")
        if t is not None and after is not None and after > 2 * t:
            title += (f" (a median {dim} operation takes {_ms(t)} once its last rank is there, "
                      f"but finishes {_ms(after)} after that rank arrived: its backend starts "
                      f"late — CPU contention, or a busy communication thread)")
        out.append(_timed(exposed_comm_id(dim), dim, cost, inp, title, evidence,
                          REMEDIES.get(dim, REMEDIES["unknown"]),
                          f"every {dim} operation completes the moment its last rank arrives",
                          cites=cites))
    return out


def _slow_steps(inp: FindingInputs) -> Finding | None:
    if not inp.slow_steps or inp.step_times.empty:
        return None
    rest = inp.step_times.drop(index=[s for s in inp.warmup_steps if s in inp.step_times.index])
    excess = (rest.loc[inp.slow_steps] - inp.median_step_us).clip(lower=0.0)
    cost = float(excess.sum() / max(len(rest), 1))
    if cost <= 0:
        return None
    title = (f"{len(inp.slow_steps)} slow step(s): "
             f"{', '.join(map(str, inp.slow_steps[:8]))} (warm-up steps "
             f"{inp.warmup_steps or 'none'} left out)")
    return _timed("slow-steps", "all", cost, inp, title,
                  {"steps": inp.slow_steps, "median_step_us": inp.median_step_us,
                   "noise_us": inp.noise_us, "warmup_steps": inp.warmup_steps},
                  "look at what else ran then (checkpointing, evaluation, GC, another job)",
                  "slow steps at the median step time",
                  cites=[cite("step_heatmap", step=s, slow=True) for s in inp.slow_steps[:8]])


def findings(inp: FindingInputs) -> list[Finding]:
    """The ranked findings (module docstring)."""
    out = _flight_recorder(inp.hangs, inp.hang_causes)
    straggler, imbalance = _straggler(inp), _imbalance(inp)
    causes = [what for f, what in ((straggler, "the straggler"),
                                   (imbalance, "the stage imbalance")) if f is not None]
    timed = []
    exposed = _exposed(inp)
    for f in (straggler, imbalance, _bubble(inp, causes), *exposed, _slow_steps(inp)):
        if f is not None:
            timed.append(f)
    for f in device_findings(inp, {f.dimension for f in exposed}):
        # A stall of the straggler's own host is why it is the straggler: its evidence.
        if straggler is not None and f.evidence.get("ranks") == [straggler.evidence["rank"]]:
            straggler.symptoms.append(f.title)
            straggler.evidence.setdefault("causes", []).append(
                {"id": f.id, "cost_us": f.cost_us})
            straggler.cites.extend(c for c in f.cites if c not in straggler.cites)
            continue
        timed.append(f)
    timed.sort(key=lambda f: -(f.cost_us or 0.0))
    urgent = [f for f in inp.memory if f.id == "near-oom"]
    return out + urgent + timed + [f for f in inp.memory if f.id != "near-oom"]
