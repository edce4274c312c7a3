"""The memory stage of an analysis: every rank's memory tables joined and the memory snapshots
read (``analysis/memory/gather.py``), with or without a trace.

``memory_of(results, inp, options)`` is the stage's value (``gather.Memory``: the memory
tables, the snapshots' summaries, the problems met, each rank's pipeline stage, the device
memory given); ``memory_facts`` is what summary.json's ``memory`` holds beside the tables.
"""
from __future__ import annotations

import pathlib

from meshscope.analysis.ingest import budgets
from meshscope.analysis.memory import gather as memory_gather
from meshscope.analysis.report import inputs, rank_work
from meshscope.analysis.report.options import AnalysisOptions


def memory_of(results: list[rank_work.RankResult], inp: inputs.Inputs,
              options: AnalysisOptions) -> memory_gather.Memory:
    """Every rank's memory tables joined, the stages and the device memory given, and the
    memory snapshots read: those of ``--snapshot`` and the analysed path when it is a snapshot
    itself (a file that is not a usable snapshot stops the analysis, naming it) and those
    found under the analysed folder (one that is not is a problem line)."""
    files = [(pathlib.Path(p), True) for p in options.snapshots]
    given = {f.resolve() for f, _ in files}
    alone = inp.path.is_file()      # `meshscope analyze snapshot.pickle`: given by name
    files += [(f, alone) for f in inputs.find_snapshots(inp.path) if f.resolve() not in given]
    return memory_gather.gather({r.rank: r.memory for r in results}, inp.run, files,
                                options.device_memory, budgets.current().trace_bytes)


def memory_facts(mem: memory_gather.Memory) -> dict:
    """summary.json's ``memory`` beside the tables (docs/report-format.md): the stages' peaks,
    the snapshots' summaries, the device memory given."""
    return {"stages": memory_gather.stages(mem.tables["memory_devices"], mem.stage_of),
            "snapshots": mem.snapshots, "device_memory_bytes": mem.device_memory_bytes}
