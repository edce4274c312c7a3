"""Health: did every rank reach every collective, did they agree on what it was, and which
inputs the analysis could not use.

- ``fr-table``: the Flight Recorder verdicts (``flight_recorder.parquet``, or summary.json's
  ``hangs`` in schema 1): group, sequence number, op, verdict (missing ranks, op/size/dtype
  mismatch, state), the ranks present and missing, and the detail the analysis joined to them
  (the step the missing ranks last finished, their last operation); ``fr-healthy`` when there
  is none.
- ``problems-table``: every damaged, missing or refused input, one line each as the analysis
  named it (file, field, problem); ``missing-ranks``; ``notes`` (what the analysis did that a
  reader should know).
"""
from __future__ import annotations

import pandas as pd

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
    rep = ctx.report
    fr = rep.table("flight_recorder")
    if fr is None:
        rows = rep.typed.hangs
        fr = pd.DataFrame(rows) if rows else None
    if fr is None:
        if rep.schema_version < 2 and "hangs" in rep.summary:
            fr = pd.DataFrame()
        else:
            return [Note("fr-none", "No Flight Recorder dumps in this run (comms/): nothing "
                                    "to say about hangs or desyncs.")]
    if fr.empty:
        return [Note("fr-healthy", "No hang and no desync: every rank of every group reached "
                                   "the same operations and agreed on them.")]
    cols = [c for c in FR_COLUMNS if c in fr.columns] + \
        [c for c in fr.columns if c not in FR_COLUMNS][:6]  # columns of a newer report
    counts = fr["verdict"].value_counts().to_dict() if "verdict" in fr else {}
    head = ", ".join(f"{n} {v}" for v, n in counts.items())
    rows = [[_cell(r[c]) for c in cols] for _, r in fr.head(MAX_ROWS).iterrows()]
    more = f" The first {MAX_ROWS} of {len(fr)} are shown." if len(fr) > MAX_ROWS else ""
    return [Note("fr-summary", f"Flight Recorder: {len(fr)} problem(s): {head}.{more}",
                 warn=True),
            Table("fr-table", [c.replace("_", " ") for c in cols], rows, left=len(cols))]


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
    return [Section("Flight Recorder", verdicts(ctx)), Section("Inputs", inputs(ctx))]
