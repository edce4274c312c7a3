"""Compare: two runs before and after — what changed and why — and any number of runs side by
side.

The runs come from the URL (``?run=A&run=B…``, the first is the baseline) or a whole sweep
folder (``?sweep=ID``). Every number is the analysis' own: the before/after is
``meshscope.analysis.compare.diff`` (what ``meshscope compare A B`` prints), the side by side
is ``meshscope.analysis.compare.rank`` (its ranking table, the planner's numbers beside it:
``meshscope.layouts.ranked``); nothing is computed again here.
Any two analysed runs compare, folders of anyone's traces too.

Two runs (``?run=A&run=B``):

- ``compare-unlike``: first, when the runs are not like for like, what differs (device,
  world, versions, profiler settings, step definition, layout: ``analysis/compare/alike.py``);
- ``compare-sentence-N``: the comparison in sentences, as a reviewer would write them;
- ``compare-steps``: both step times, the change, its noise and the parts' residual;
- ``compare-waterfall``: the step window from A to B, one bar per part that moved (compute,
  exposed communication per dimension, bubble, other device work, idle per cause) — the parts
  add up to B's window;
- ``compare-parts``: the same parts as a table with their noise;
- ``compare-kernels``: every kernel (GPU runs; host operators whose launch count changed on CPU
  runs: ``compare-operators``) before and after, per step — sortable and filterable;
- ``compare-collectives``: operations per (dimension, op), count and bytes per step;
- ``compare-memory``: each matched rank's allocator peaks, before and after;
- ``compare-findings``: findings gained, lost and changed in cost;
- ``compare-ranks``: each matched rank's change per part as a heatmap.

Then, for two runs or more:

- ``compare-table``: one row per figure, one column per run; ``compare-winner`` and
  ``compare-reason``: which run is fastest and why, in words; each run's world size is a row
  (and a warning when they differ); the step time is the one every page shows, with its source;
- ``compare-graph``: the table's step time, compute, exposed communication and bubble as
  grouped bars (the same numbers as the table).
"""
from __future__ import annotations

from meshscope.vocabulary import TRUST_VERDICTS

import logging

import plotly.graph_objects as go
from dash import html

from meshscope.analysis.compare import RunDiff, diff, open_side, rank
from meshscope.analysis.compare.ranking import TIE_REL, Comparison, worse_end
from meshscope.analysis.report import reader
from meshscope.layouts import ranked
from meshscope.vocabulary import COMM_DIMS, STEP_TIME_SOURCES

from .. import sections as S
from ..runs import RunIndex
from ..state import ViewState
from .common import COLOURS, LAYOUT

log = logging.getLogger("meshscope.dashboard")


def _entries(index: RunIndex, state: ViewState):
    entries = [index.get(r) for r in state.runs]
    entries = [e for e in entries if e is not None]
    if state.sweep:
        entries += [e for e in index.sweep_runs(state.sweep) if e not in entries]
    return entries


def _analysis_compare(index: RunIndex, state: ViewState, entries) -> Comparison:
    """The analysis' comparison, the one comparison of meshscope. A sweep folder with its
    sweep.json is compared as a sweep."""
    folder = index.root / state.sweep if state.sweep in index.sweeps else None
    # A whole sweep (its failed runs, its plan) only when every run of it is analysed: the
    # analysis would otherwise analyse the others inside this request.
    if folder is not None and not state.runs and (folder / "sweep.json").is_file() \
            and index.inside(folder) and all(e.analysed for e in index.sweep_runs(state.sweep)):
        return ranked.compare([folder])
    # Each run's report as it is (the page never analyses): the analysis' ranking of them,
    # with the planner's memory and traffic beside each.
    return rank([open_side(e.report_dir, name=e.run_id) for e in entries],
                predict=ranked.predictor(ranked.default_planner()))


def _ms(us):
    return None if us is None else us / 1e3


def _pct(fraction):
    return None if fraction is None else 100 * fraction


def comparison_rows(c: Comparison) -> tuple[list[str], list[tuple[str, list, str]]]:
    """Run names and (figure, value per run, which end is better) of a ``Comparison`` (its
    rows come ranked, fastest first): every value is a ``RunRow`` field as compare holds it."""
    rows = c.rows
    names = [r.name for r in rows]
    out = [("ranks (world size)", [r.ranks for r in rows], "info"),
           ("step time (ms)", [_ms(r.step_time_us) for r in rows], "low"),
           ("  step time from", [reader.SHORT.get(r.step_time_source or "", "-")
                                 for r in rows], "text"),
           # The report's own window (summary window_us), the number the overview and
           # analyze show: the per-rank means below fit within it.
           ("profiled window (ms, the longest rank's step; the parts below fit within it)",
            [_ms(r.window_us) for r in rows], "low"),
           ("tokens/s", [r.tokens_per_s for r in rows], "high"),
           ("MFU %", [r.mfu_pct for r in rows], "high"),
           ("compute (ms, mean over ranks)", [_ms(r.compute_us) for r in rows], "low")]
    dims = [d for d in COMM_DIMS if any(d in r.exposed_comm_us for r in rows)]
    out.append(("exposed comm (ms)", [_ms(r.exposed_total_us) for r in rows], "low"))
    for dim in dims:
        out.append((f"  exposed {dim} (ms)", [_ms(r.exposed_comm_us.get(dim, 0.0))
                                              for r in rows], "low"))
    out += [("bubble (ms)", [_ms(r.bubble_us) for r in rows], "low"),
            ("bubble %", [_pct(r.bubble_fraction) for r in rows], "low"),
            ("  theory %", [_pct(r.theory_bubble_fraction) for r in rows], "low"),
            ("busbw efficiency %", [_pct(r.bandwidth_efficiency) for r in rows], "high"),
            ("peak memory (MB)", [None if r.peak_memory_bytes is None
                                  else r.peak_memory_bytes / 1e6 for r in rows], "low")]
    predicted = [r.predicted.step_time_us if r.predicted else None for r in rows]
    if any(p is not None for p in predicted):
        out.append(("predicted step time (ms)", [_ms(p) for p in predicted], "low"))
    out.append(("top finding", [r.findings[0].title if r.findings else "none"
                                for r in rows], "text"))
    return names, out


# Rows shown with other than two decimals (a count, a rate in the thousands).
DIGITS = {"tokens/s": 0}


def _table(names, rows) -> S.Table:
    """The compare table: the worse end of each row marked — every run tied with it —,
    nothing marked where the best and the worst tie (``layouts.compare.worse_end``: within
    0.5%, ``TIE_REL``)."""
    body, hi = [], set()
    for i, (label, vals, better) in enumerate(rows):
        hi.update((i, j + 1) for j in worse_end(vals, better))
        digits = DIGITS.get(label, 2)
        body.append([label] + [S.fmt(v, digits) if not isinstance(v, str) else
                               S.Cell(S.clip(v, 80), v) for v in vals])
    return S.Table("compare-table", ["figure"] + names, body, highlight=frozenset(hi),
                   caption=f"Marked: the worse end of each row. Values within {TIE_REL:.1%} "
                           "of each other are a tie: a row whose best and worst tie is not "
                           "marked.")


def compare_figure(names, rows) -> go.Figure:
    """The table's own figures as bars, side by side per run (grouped, not stacked: compute,
    exposed communication and bubble overlap in time and do not add up to the step)."""
    fig = go.Figure()
    by_label = {label.strip(): vals for label, vals, _ in rows}
    for key, label, colour in (("step time (ms)", "step time", "#333333"),
                               ("compute (ms, mean over ranks)", "compute", COLOURS["compute"]),
                               ("exposed comm (ms)", "exposed comm", COLOURS["comm"]),
                               ("bubble (ms)", "bubble", COLOURS["bubble"])):
        if key in by_label:
            fig.add_bar(name=label, x=names, y=[None if v is None else round(v, 2)
                                                for v in by_label[key]],
                        marker_color=colour,
                        hovertemplate=f"%{{x}}<br>{label}: %{{y:.2f}} ms<extra></extra>")
    fig.update_layout(**LAYOUT, barmode="group", height=380, yaxis_title="ms per step",
                      title="The table's times per run", xaxis={"type": "category"})
    return fig


# -- two runs: before and after --------------------------------------------------------------

def _pair(entries) -> RunDiff:
    """``analysis.compare.diff`` of the two runs' reports (read as they are: the page never
    analyses)."""
    a, b = (open_side(e.report_dir, name=e.run_id) for e in entries)
    return diff(a, b)


def waterfall(d: RunDiff) -> go.Figure:
    """A's step window, each part's change, B's window (the parts add up to it)."""
    moved = [p for p in sorted(d.parts, key=lambda p: -abs(p.delta_us)) if p.delta_us]
    x = [f"{d.before.name}"] + [p.label for p in moved] + [f"{d.after.name}"]
    y = [_ms(d.window.before)] + [_ms(p.delta_us) for p in moved] + [None]
    fig = go.Figure(go.Waterfall(
        x=x, y=y, measure=["absolute"] + ["relative"] * len(moved) + ["total"],
        connector={"line": {"color": "#999"}}, increasing={"marker": {"color": "#D6604D"}},
        decreasing={"marker": {"color": "#4575B4"}}, totals={"marker": {"color": "#555"}},
        hovertemplate="%{x}: %{y:.2f} ms<extra></extra>"))
    fig.update_layout(**LAYOUT, height=420, yaxis_title="ms per step (profiled window)",
                      title="The step window from the first run to the second, part by part",
                      xaxis={"type": "category"}, showlegend=False)
    return fig


def rank_heatmap(d: RunDiff) -> go.Figure:
    from meshscope.analysis.compare.diff import RANK_PARTS

    labels = [str(r.rank_after) if r.rank_before == r.rank_after
              else f"{r.rank_before}→{r.rank_after}" for r in d.ranks]
    z = [[round(r.delta(p) / 1e3, 3) for p in RANK_PARTS] for r in d.ranks]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(RANK_PARTS), y=[f"rank {lab}" for lab in labels], colorscale="RdBu",
        reversescale=True, zmid=0, colorbar={"title": "Δ ms"},
        hovertemplate="%{y}, %{x}: %{z:+.2f} ms per step<extra></extra>"))
    fig.update_layout(**LAYOUT, height=160 + 28 * len(labels),
                      title=f"Change per rank and part (ranks matched by {d.rank_match})",
                      yaxis={"autorange": "reversed", "type": "category"})
    return fig


def pair_sections(d: RunDiff) -> list[S.Section]:
    """The before/after view of ``d`` (module docstring): the step time and its parts, then
    kernels (or operators), communication, memory, findings and ranks where there are any;
    the notes under the first."""
    sections = [_steps_section(d)] + [section for section in (
        _kernels_section(d), _collectives_section(d), _memory_section(d),
        _findings_section(d), _ranks_section(d)) if section is not None]
    for i, n in enumerate(d.notes):
        sections[0].items.append(S.Note(f"compare-note-{i}", n))
    return sections


def _steps_section(d: RunDiff) -> S.Section:
    """The sentences, the step time, its change and noise, the waterfall and the parts."""
    said = d.sentences[1:] if d.unlike else d.sentences
    items: list = [S.Note("compare-unlike", d.sentences[0], warn=True)] if d.unlike else []
    items += [S.Note(f"compare-evidence-{k}", f"Evidence of {s.name}: {s.evidence}",
                     warn=s.trust_verdict != TRUST_VERDICTS[0])
              for k, s in (("before", d.before), ("after", d.after))]
    items += [S.Note(f"compare-sentence-{i}", text) for i, text in enumerate(said)]
    c = d.step_time
    facts = [("step time", f"{S.ms(c.before)} → {S.ms(c.after)}"),
             ("change", "—" if c.delta is None else f"{c.delta / 1e3:+.2f} ms"
              + (f" ({c.rel:+.1%})" if c.rel is not None else "")),
             ("noise", "unknown" if c.noise is None else f"±{c.noise / 1e3:.2f} ms"
              + (" (within)" if c.within_noise else ""))]
    if d.residual_us is not None:
        facts.append(("residual (Δ step time − Σ parts)", f"{d.residual_us / 1e3:+.2f} ms"))
    items.append(S.Facts("compare-steps", facts))
    items.append(S.Figure("compare-waterfall", waterfall(d),
                          caption="The parts are the profiled steps' windows, mean over ranks; "
                                  "they add up to the second run's window."))
    rows = []
    for p in sorted(d.parts, key=lambda p: -abs(p.delta_us)):
        for sub in (p, *sorted(p.sub, key=lambda x: -abs(x.delta_us))):
            n = sub.change.noise
            rows.append([("    " if sub is not p else "") + sub.label, S.fmt(_ms(sub.change.before)),
                         S.fmt(_ms(sub.change.after)), S.fmt(_ms(sub.delta_us)),
                         "" if sub.share is None or sub is not p else f"{sub.share:.0%}",
                         "?" if n is None else f"±{n / 1e3:.2f}"
                         + (" (within)" if sub.change.within_noise else "")])
    items.append(S.Table("compare-parts", ["part", "before ms", "after ms", "Δ ms", "share",
                                           "noise ms"], rows))
    return S.Section(None, items)


def _kernels_section(d: RunDiff) -> S.Section | None:
    """The kernels matched by folded name; without kernels, the operators whose launch
    count changed; None without either."""
    if d.kernels:
        return S.Section("Kernels, per step", [S.Grid(
            "compare-kernels",
            [("kernel", "key", "text"), ("category", "category", "text"),
             ("status", "status", "text"), ("count before", "count_before", "number"),
             ("count after", "count_after", "number"),
             ("before ms", "before_ms", "number"), ("after ms", "after_ms", "number"),
             ("Δ ms", "delta_ms", "number"), ("mean before µs", "mean_before", "number"),
             ("mean after µs", "mean_after", "number")],
            [{"key": k.key, "category": k.category, "status": k.status,
              "count_before": k.count_before, "count_after": k.count_after,
              "before_ms": k.total_before_us / 1e3, "after_ms": k.total_after_us / 1e3,
              "delta_ms": k.delta_us / 1e3, "mean_before": k.mean_before_us,
              "mean_after": k.mean_after_us} for k in d.kernels],
            caption="Kernels matched by name with templates and arguments folded (NCCL's "
                    "kernels of every version by their collective); per profiled step, mean "
                    "over ranks. Sort by a column; filter with the row under the headings "
                    "(e.g. new, >1).")])
    if d.operators:
        return S.Section("Operators whose launch count changed, per step", [S.Grid(
            "compare-operators",
            [("operator", "name", "text"), ("status", "status", "text"),
             ("count before", "count_before", "number"), ("count after", "count_after",
                                                          "number"),
             ("before ms", "before_ms", "number"), ("after ms", "after_ms", "number")],
            [{"name": o.name, "status": o.status, "count_before": o.count_before,
              "count_after": o.count_after, "before_ms": o.total_before_us / 1e3,
              "after_ms": o.total_after_us / 1e3} for o in d.operators],
            caption="Host operators per profiled step, mean over ranks; time inclusive of "
                    "the operators each calls.")])
    return None


def _collectives_section(d: RunDiff) -> S.Section | None:
    """The communication operations per step and rank, before and after."""
    if not d.collectives:
        return None
    return S.Section("Communication operations, per step and rank", [S.Table(
        "compare-collectives", ["dimension", "op", "count before", "count after",
                                "MB before", "MB after", ""],
        [[c.dim, c.op, S.fmt(c.count_before), S.fmt(c.count_after),
          S.fmt(None if c.bytes_before is None else c.bytes_before / 1e6),
          S.fmt(None if c.bytes_after is None else c.bytes_after / 1e6), c.status]
         for c in d.collectives], left=2)])


def _memory_section(d: RunDiff) -> S.Section | None:
    """Each rank's allocator peaks before and after."""
    if not d.memory:
        return None

    def mib(b):
        return "—" if b is None else f"{b / (1 << 20):,.1f}"
    return S.Section("Memory, each rank's peak", [S.Table(
        "compare-memory", ["rank", "device", "allocated before MiB", "allocated after MiB",
                           "reserved before MiB", "reserved after MiB"],
        [[str(m.rank_after) if m.rank_before == m.rank_after else
          f"{m.rank_before}→{m.rank_after}", m.device, mib(m.allocated_before_bytes),
          mib(m.allocated_after_bytes), mib(m.reserved_before_bytes),
          mib(m.reserved_after_bytes)] for m in d.memory], left=2,
        caption="The allocator's largest peak over the profiled steps on each rank's main "
                "device (its GPU, else the CPU), from the traces' [memory] events.")])


def _findings_section(d: RunDiff) -> S.Section | None:
    """The findings gained, lost, or whose cost changed."""
    changed = [f for f in d.findings if f.status != "both" or f.cost_before_us != f.cost_after_us]
    if not changed:
        return None
    return S.Section("Findings gained and lost", [S.Table(
        "compare-findings", ["", "finding", "cost before", "cost after"],
        [[f.status, S.Cell(S.clip(f.title, 90), f.title), S.ms(f.cost_before_us),
          S.ms(f.cost_after_us)] for f in changed], left=2)])


def _ranks_section(d: RunDiff) -> S.Section | None:
    """Each rank's change per part, as a heatmap."""
    return S.Section("Per rank", [S.Figure("compare-ranks", rank_heatmap(d))]) if d.ranks \
        else None


def _left_out(index: RunIndex, state: ViewState, entries) -> list:
    """What the URL named that the page leaves out, said rather than dropped: a name that is
    no run of this folder, a run not analysed yet."""
    unknown = [r for r in state.runs if index.get(r) is None]
    pending = [e.run_id for e in entries if not e.analysed]
    out = []
    if unknown:
        out.append(html.P("Left out — not a run of this folder: " + ", ".join(unknown) + ".",
                          id="compare-unknown", style=S.WARN))
    if pending:
        out.append(html.P("Left out — not analysed yet: " + ", ".join(pending) + ".",
                          id="compare-pending", style=S.NOTE))
    return out


def render(index: RunIndex, state: ViewState) -> list:
    entries = _entries(index, state)
    page = _render(index, state, entries)
    return page[:1] + _left_out(index, state, entries) + page[1:]


def _render(index: RunIndex, state: ViewState, entries) -> list:
    ready = [e for e in entries if e.analysed]
    if len(ready) < 2:
        return [html.H2("Compare"),
                html.P("Pick two or more analysed runs on the Runs page (tick them, then "
                       "\"compare selected runs\"), or open a sweep.", id="run-message",
                       style=S.NOTE)]
    try:
        theirs = _analysis_compare(index, state, ready)
    except (OSError, ValueError, KeyError) as e:   # CompareError is a ValueError
        log.warning("compare failed: %s", e)
        return [html.H2("Compare"), html.P("These runs cannot be compared — run "
                                           "`meshscope compare` on them for the reason.",
                                           id="run-message", style=S.WARN)]
    pair: list = []
    if len(ready) == 2 and not state.sweep:
        try:
            pair = pair_sections(_pair(ready))
        except (OSError, ValueError, KeyError) as e:   # CompareError is a ValueError
            log.warning("compare failed: %s", e)
            pair = [S.Section(None, [S.Note("compare-pair-failed",
                                            "What changed cannot be shown for these runs — run "
                                            "`meshscope compare` on them for the reason.",
                                            warn=True)])]
        pair.append(S.Section("Side by side", [], id="compare-side-by-side"))
    items: list = []
    names, rows = comparison_rows(theirs)
    if theirs.winner is not None:
        tied = [r.name for r in theirs.ties]
        items.append(S.Note("compare-winner", f"Fastest: {theirs.winner.name}"
                            + (f" — tied (within {TIE_REL:.1%}) with " + ", ".join(tied)
                               if tied else "") + "."))
    for i, text in enumerate(theirs.explanations):
        items.append(S.Note("compare-reason" if i == 0 else f"compare-reason-{i}", text))
    for f in theirs.failed:
        items.append(S.Note(f"compare-failed-{f.name}",
                            f"{f.name}: {f.status} — {f.error or ''}", warn=True))
    sizes = sorted({r.ranks for r in theirs.rows})
    if len(sizes) > 1:
        items.append(S.Note("compare-world", "These runs have different world sizes ("
                            + ", ".join(map(str, sizes)) + " ranks): step times compare "
                            "layouts of different machines.", warn=True))
    items.append(S.Note("compare-step-source", "Step time is the "
                        + STEP_TIME_SOURCES["timer"] + ", the figure the runs list, the "
                        "overview and `meshscope analyze` show (unless the row \"step time "
                        "from\" says otherwise)."))
    table = _table(names, rows)
    items.append(table)
    items.append(S.Figure("compare-graph", compare_figure(names, rows)))
    title = " → ".join(e.run_id for e in ready) if pair else " vs ".join(names)
    return [html.H2(["Compare · ", html.Span(title, id="run-title")])] + \
        S.to_dash(pair + [S.Section(None, items)])


def register(app) -> None:
    """The compare page has no callbacks of its own (its runs are in the URL)."""
