"""Numbers with where they were read (docs/agents.md, "Citations").

Every number an agent tool returns is a ``cited(value, unit, cite)`` — ``{"value", "unit",
"cite"}`` — whose ``cite`` names the report folder and either a field of its summary.json or
rows of one of its tables:

- ``{"report": R, "table": "summary", "field": F}``: summary.json's field ``F`` (a dotted path,
  ``throughput.tokens_per_s``); with ``keys`` and ``column``: the element of the list ``F``
  whose fields equal ``keys``, its field ``column`` (``per_rank_mean`` ``{"rank": 1}``
  ``compute_us``);
- ``{"report": R, "table": T, "keys": K, "column": C, "reduce": H}``: table ``T``'s rows whose
  columns equal ``K`` (all rows when empty), column ``C``, taken as ``H``: ``value`` (one
  row), ``max``, or ``mean_of_step_means`` (the mean over steps of each step's mean — the
  breakdown's per-step mean over ranks, as compare's quantities take it);
- ``{"query": SQL, "row": i, "column": C}``: row ``i`` of the answer to ``SQL`` (``query``).

A quantity a tool cannot cite this way is not returned.
"""
from __future__ import annotations

import pathlib
from typing import Any

from meshscope.analysis.compare import quantities as Q
from meshscope.analysis.compare.sides import Side

#: The breakdown column of each quantity cited as the mean of its per-step means.
BREAKDOWN_COLUMNS = {"window": "window_us", "compute": "compute_us", "comm": "comm_us",
                     "overlapped_comm": "overlapped_comm_us",
                     "exposed_comm": "exposed_comm_us", "bubble": "bubble_us",
                     "other": "other_us", "idle": "idle_us"}
#: The quantities the tools return (each with a citation, ``quantity``).
CITED_QUANTITIES = ("step_time", *BREAKDOWN_COLUMNS, "peak_memory", "tokens_per_s")


def cited(value: Any, unit: str | None, cite: dict) -> dict:
    return {"value": value, "unit": unit, "cite": cite}


def summary_field(report: pathlib.Path, field: str, value: Any, unit: str | None,
                  keys: dict | None = None, column: str | None = None) -> dict:
    cite: dict = {"report": str(report), "table": "summary", "field": field}
    if keys is not None:
        cite |= {"keys": keys, "column": column}
    return cited(value, unit, cite)


def table_rows(report: pathlib.Path, table: str, keys: dict, column: str, reduce: str,
               value: Any, unit: str | None) -> dict:
    return cited(value, unit, {"report": str(report), "table": table, "keys": keys,
                               "column": column, "reduce": reduce})


def quantity(side: Side, name: str) -> dict | None:
    """Compare's quantity ``name`` of ``side`` with its citation; None where the run does not
    measure it, or it cannot be cited as rows it was read from."""
    m = Q.measure(side, name)
    if m is None:
        return None
    report = side.report_dir
    if name == "step_time":
        out = summary_field(report, "step_time_us", m.value, m.unit)
    elif name in BREAKDOWN_COLUMNS:
        out = table_rows(report, "breakdown", {}, BREAKDOWN_COLUMNS[name],
                         "mean_of_step_means", m.value, m.unit)
    elif name.startswith("exposed_comm.") and name.count(".") == 1:
        out = table_rows(report, "breakdown", {}, f"exposed_comm_{name.split('.')[1]}_us",
                         "mean_of_step_means", m.value, m.unit)
    elif name == "peak_memory" and len(side.table("throughput")):
        out = table_rows(report, "throughput", {}, "peak_memory_bytes", "max", m.value,
                         m.unit)
    elif name == "tokens_per_s":
        out = summary_field(report, "throughput.tokens_per_s", m.value, m.unit)
    else:
        return None
    out["noise"] = m.noise
    return out
