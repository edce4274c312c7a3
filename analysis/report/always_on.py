"""The always-on records' stage of an analysis: what the step timers and the Flight Recorder
dumps say, with or without a trace (``records/``).

``records_of(inp, warmup_steps)`` is the stage's value, ``Records``: the step timers' analysis
(``steps.analyse``: warm-up, noise, slow steps, the heatmap), its report tables (the step
heatmap, throughput per step, the Flight Recorder verdicts and the causes of a hang,
``records/hang_causes.py``: ``tables.RecordTables``) and the
throughput summary — the step timers' step time, tokens/s and MFU, computed here once for the
findings' cost base and summary.json alike.
"""
from __future__ import annotations

import dataclasses

from meshscope.analysis.records import flight_recorder, hang_causes, steps as step_records
from meshscope.analysis.report import inputs
from meshscope.analysis.report.tables import RecordTables


@dataclasses.dataclass(frozen=True)
class Records:
    """What the always-on records say: the step timers' analysis, its tables and the
    throughput summary (``steps.throughput_summary``)."""
    records: step_records.StepRecords
    tables: RecordTables
    throughput_summary: dict


def records_of(inp: inputs.Inputs, warmup_steps: int) -> Records:
    """The step timers of ``inp`` analysed with ``warmup_steps`` left out, and the Flight
    Recorder dumps' verdicts (an empty table with its columns without dumps)."""
    run = inp.run
    records = step_records.analyse(inp.steps, warmup_steps,
                                   run.profile_steps if run is not None else None)
    throughput = step_records.throughput(inp.steps, run)
    fr: dict = {}
    if inp.has_dumps:
        fr["flight_recorder"] = flight_recorder.diagnose(inp.flight, run, inp.steps)
        fr["hang_causes"] = hang_causes.causes(inp.flight, fr["flight_recorder"], run,
                                               inp.path if run is not None else None)
    return Records(
        records=records,
        tables=RecordTables.empty(step_heatmap=records.heatmap, throughput=throughput, **fr),
        throughput_summary=step_records.throughput_summary(throughput, records.warmup_steps))

