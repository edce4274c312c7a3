"""The memory stage of an analysis: every rank's memory tables joined and the memory snapshots
read (``analysis/memory/gather.py``), with or without a trace.

``memory_of(results, inp, options)`` is the stage's value (``gather.Memory``: the memory
tables, the snapshots' summaries, the problems met, each rank's pipeline stage, the device
memory given); ``memory_facts`` is what summary.json's ``memory`` holds beside the tables.

Each rank's memory tables are read in turn (a spilled result's are a file read on access), and
with a ``table_parts.PartStore`` the memory curve — the largest of them, ~5,000 rows a
device — goes to disk in parts as each rank's is read, not joined whole (issue 51).
"""
from __future__ import annotations

import dataclasses
import pathlib

from meshscope.analysis.ingest import budgets
from meshscope.analysis.memory import gather as memory_gather
from meshscope.analysis.report import inputs, rank_work, table_parts
from meshscope.analysis.report import tables as report_tables
from meshscope.analysis.report.options import AnalysisOptions


def memory_of(results: list[rank_work.RankResult], inp: inputs.Inputs,
              options: AnalysisOptions, kept: table_parts.PartStore | None = None,
              rows_per_part: int = 65_536) -> memory_gather.Memory:
    """Every rank's memory tables joined, the stages and the device memory given, and the
    memory snapshots read: those of ``--snapshot`` and the analysed path when it is a snapshot
    itself (a file that is not a usable snapshot stops the analysis, naming it) and those
    found under the analysed folder (one that is not is a problem line). With ``kept``, the
    memory curve is kept there in parts of ``rows_per_part`` rows (module docstring): the
    parts the whole curve cut every ``rows_per_part`` rows would be."""
    files = [(pathlib.Path(p), True) for p in options.snapshots]
    given = {f.resolve() for f, _ in files}
    alone = inp.path.is_file()      # `meshscope analyze snapshot.pickle`: given by name
    files += [(f, alone) for f in inputs.find_snapshots(inp.path) if f.resolve() not in given]
    if kept is None:
        return memory_gather.gather({r.rank: r.memory for r in results}, inp.run, files,
                                    options.device_memory, budgets.current().trace_bytes)
    name = "memory_curve"
    columns = memory_gather.TABLES[name]
    cut = kept.cut(name, columns, rows_per_part, memory_gather.empty(name))
    per_rank = {}
    last = {r.rank: r for r in results}     # a rank's last result, as the mapping above
    for r in (last[k] for k in sorted(last)):       # each rank's tables read once, in turn
        tables = dict(r.memory)
        cut.add(tables.pop(name, None))
        per_rank[r.rank] = tables
    mem = memory_gather.gather(per_rank, inp.run, files, options.device_memory,
                               budgets.current().trace_bytes)
    return dataclasses.replace(mem, tables={
        **mem.tables, name: report_tables.on_disk(cut.close())})


def memory_facts(mem: memory_gather.Memory) -> dict:
    """summary.json's ``memory`` beside the tables (docs/report-format.md): the stages' peaks,
    the snapshots' summaries, the device memory given."""
    return {"stages": memory_gather.stages(mem.tables["memory_devices"], mem.stage_of),
            "snapshots": mem.snapshots, "device_memory_bytes": mem.device_memory_bytes}
