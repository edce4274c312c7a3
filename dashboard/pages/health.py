"""Health: did every rank reach every collective, did they agree on what it was, and which
inputs the analysis could not use.

- ``fr-table``: the Flight Recorder verdicts (``flight_recorder.parquet``, or summary.json's
  ``hangs`` in schema 1): group, sequence number, op, verdict (missing ranks, op/size/dtype
  mismatch, state), the ranks present and missing, and the detail the analysis joined to them
  (the step the missing ranks last finished, their last operation); ``fr-healthy`` when the
  records hold none; ``fr-none`` when there are no records: then hangs and desyncs cannot be
  judged, and the page says so rather than that all is well.
- ``hang-causes-table``: why ranks stopped (``hang_causes``): the cause, its ranks, the
  collective as torch's analyser shows it, the evidence and what to do next.
- ``problems-table``: every damaged, missing or refused input, one line each as the analysis
  named it (file, field, problem); ``missing-ranks``; ``notes`` (what the analysis did that a
  reader should know).
"""
from __future__ import annotations

from meshscope.analysis.report import reader

from ..sections import Note, Section, Table, clip
from .common import PageContext

MAX_ROWS = 100
FR_COLUMNS = ("process_group", "group_desc", "seq", "op", "verdict", "ranks_present",
              "ranks_missing", "detail")


def _cell(v) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    if hasattr(v, "tolist"):
        return ", ".join(map(str, v.tolist()))
    return "" if v is None or (isinstance(v, float) and v != v) else clip(v, 300)


def verdicts(ctx: PageContext) -> list:
    """The Flight Recorder verdicts: ``flight_recorder.parquet``, else (schema 1, which wrote
    no such table) summary.json's ``hangs`` — the reader decides which (``hangs_in_summary``)."""
    rep = ctx.report
    if rep.typed.hangs_judged is False:
        return [Note("fr-none", "No Flight Recorder records: hangs and desyncs cannot be "
                                "judged (the run left no dumps in comms/, and none lie under "
                                "the analysed folder).", warn=True)]
    fr = reader.flight_recorder_verdicts(
        rep.table("flight_recorder") if rep.has_table("flight_recorder") else None, rep.typed)
    if fr is None:
        return [Note("fr-none", "No Flight Recorder records: hangs and desyncs cannot be "
                                "judged.", warn=True)]
    causes = rep.typed.hang_causes or []
    if fr.empty and not causes:
        ranks = rep.typed.flight_recorder_ranks
        of = f" in the records of {len(ranks)} rank(s)" if ranks else ""
        return [Note("fr-healthy", f"No hang and no desync{of}: every rank of every group "
                                   f"reached the same operations and agreed on them.")]
    # The columns the verdicts fill (an older report's missing ones are all null), the main
    # ones first.
    cols = [c for c in FR_COLUMNS if fr[c].notna().any()] + \
        [c for c in fr.columns if c not in FR_COLUMNS and fr[c].notna().any()][:6]
    counts = fr["verdict"].value_counts().to_dict()
    head = ", ".join(f"{n} {v}" for v, n in counts.items())
    rows = [[_cell(r[c]) for c in cols] for _, r in fr.head(MAX_ROWS).iterrows()]
    more = f" The first {MAX_ROWS} of {len(fr)} are shown." if len(fr) > MAX_ROWS else ""
    return [Note("fr-summary", f"Flight Recorder: {len(fr)} problem(s): {head}.{more}",
                 warn=True),
            Table("fr-table", [c.replace("_", " ") for c in cols], rows, left=len(cols))]


def causes(ctx: PageContext) -> list:
    """Why ranks stopped (summary.json's ``hang_causes``, ``records/hang_causes.py``): one row
    per cause — its ranks, the collective as torch's analyser shows it, the evidence, what to
    do next. Nothing where the report has none (a healthy job) or predates them."""
    rows = ctx.report.typed.hang_causes or []
    if not rows:
        return []
    return [Table("hang-causes-table", ["cause", "ranks", "collective", "evidence", "next"],
                  [[c.cause, _cell(c.ranks), c.collective or "—", clip(c.evidence, 900),
                    c.remedy] for c in rows],
                  caption="Why ranks stopped, from the Flight Recorder's evidence "
                          "(docs/hangs.md): each cause once, with the rows it rests on.",
                  left=5)]


def inputs(ctx: PageContext) -> list:
    rep = ctx.report
    out = []
    missing = rep.typed.missing_ranks
    if missing:
        out.append(Note("missing-ranks", "Ranks of the job without a usable trace: "
                        + ", ".join(map(str, missing)), warn=True))
    problems = rep.typed.problems
    if problems:
        out.append(Table("problems-table", ["input problem"], [[clip(p, 500)] for p in problems]))
    else:
        out.append(Note("problems-none", "No damaged, missing or refused input."))
    notes = rep.typed.notes
    if notes:
        out.append(Table("notes-table", ["what the analysis did"], [[clip(n, 500)] for n in notes]))
    return out


def sections(ctx: PageContext) -> list[Section]:
    why = causes(ctx)
    return [Section("Flight Recorder", verdicts(ctx)),
            *([Section("Why ranks stopped", why)] if why else []),
            Section("Inputs", inputs(ctx))]
