"""The reports of an analysis that found no usable trace: what else it was given says.

- ``records_only``: a run that failed or hung before its profiled steps, or a folder of
  PyTorch's own Flight Recorder dumps alone — the step timers and the Flight Recorder
  verdicts, the device and the world from run.json or else from the dumps;
- ``snapshots_only``: a memory snapshot without traces (``meshscope analyze snapshot.pickle``)
  — its tables, its summary and its out-of-memory record as a finding.

Every other table group is empty with its registered columns (``report/tables.py``), so the
report written has every table a reader expects.
"""
from __future__ import annotations

import pandas as pd

from meshscope.analysis.comm import instances
from meshscope.analysis.pipeline import bubble
from meshscope.analysis.records import steps as step_records
from meshscope.analysis.report import findings as findings_mod
from meshscope.analysis.report import inputs
from meshscope.analysis.report.always_on import records_of
from meshscope.analysis.report.memory_findings import memory_findings
from meshscope.analysis.report.memory_stage import memory_facts, memory_of
from meshscope.analysis.report.options import AnalysisOptions
from meshscope.analysis.report import summary
from meshscope.analysis.report.result import Report
from meshscope.analysis.report.summary import Facts, Groups
from meshscope.analysis.report.tables import (CommTables, GpuTables, GraphTables, MemoryTables,
                                              PipelineTables, RecordTables, StepTimeTables,
                                              empty)


def snapshots_only(inp: inputs.Inputs, options: AnalysisOptions) -> Report:
    """A memory snapshot without traces (``meshscope analyze snapshot.pickle``): its tables
    and summary, its out-of-memory record as a finding; every other table empty with its
    registered columns."""
    mem = memory_of([], inp, options)
    found = memory_findings(mem.tables["memory_devices"], mem.tables["memory_live"],
                            mem.snapshots, mem.stage_of)
    ranks = sorted({int(s["rank"]) for s in mem.snapshots})
    records = step_records.analyse(inp.steps, options.warmup_steps, None)
    throughput = step_records.throughput_summary(empty("throughput"), records.warmup_steps)
    return _without_traces(
        Facts(source=inp.path, run=inp.run, ranks=ranks, missing_ranks=[],
              problems=[*inp.problems, *mem.problems], notes=list(inp.notes), device="gpu",
              step_time=summary.step_time(throughput, None, empty("breakdown")),
              throughput=throughput, step_records=records,
              cross_rank={"matchable": False, "why_not": ["no traces"], "matched_on": None,
                          "noise_us": None},
              straggler=None, imbalance=None, findings=found, memory=memory_facts(mem),
              flight_recorder_ranks=list(inp.flight.ranks)),
        on_gpu=True, records=RecordTables.empty(), memory=MemoryTables(**mem.tables))


def _without_traces(facts: Facts, *, on_gpu: bool, records: RecordTables,
                    memory: MemoryTables | None = None) -> Report:
    """A report of no trace: ``facts``, its ``records``, and ``memory`` when a snapshot was
    read; every other table group empty with its registered columns (``report/tables.py``;
    the instance table with its dtypes, ``instances.empty``)."""
    return Report.of(facts, Groups(
        steps=StepTimeTables.empty(), records=records, pipeline=PipelineTables.empty(),
        comm=CommTables.empty(instances=instances.empty()),
        graph=GraphTables.empty(), gpu=GpuTables.empty(),
        memory=memory if memory is not None else MemoryTables.empty()), on_gpu)


def records_only(inp: inputs.Inputs, warmup_steps: int) -> Report:
    """A run with no usable trace (it failed or hung before its profiled steps, or all there
    is are PyTorch's own Flight Recorder dumps): what the always-on records say — step timers
    and the Flight Recorder verdicts; every other table empty with its registered columns
    (``report/tables.py``). The device and the world come from run.json, else from the dumps
    (``inputs.flight_facts``: an NCCL job's dumps make it a GPU job); the ranks missing are
    those of the world that left no record at all (no dump, no step timer). A finding's cost %
    is of the headline step time (the step timers'), as in a report with traces."""
    run = inp.run
    recs = records_of(inp, warmup_steps)
    records = recs.records
    facts = inputs.flight_facts(inp.flight, run)
    st = summary.step_time(recs.throughput_summary, None, empty("breakdown"))
    found = findings_mod.findings(findings_mod.FindingInputs(
        step_us=st.us if st.us is not None else float("nan"), noise_us=records.noise_us,
        breakdown=empty("breakdown"), bubbles=pd.DataFrame(columns=bubble.COLUMNS),
        schedule=run.schedule if run else None, stages=1,
        microbatches=run.microbatches if run else 1,
        virtual_stages=run.virtual_stages if run else 1, straggler=None,
        savings=empty("rank_waits"), imbalance=None, dim_savings={},
        hangs=recs.tables.flight_recorder, hang_causes=recs.tables.hang_causes,
        slow_steps=records.slow_steps,
        warmup_steps=records.warmup_steps,
        step_times=step_records.slowest_rank_per_step(inp.steps),
        median_step_us=records.median_step_us))
    world = facts["world_size"] or 0
    recorded = set(inp.flight.ranks) | (set(int(r) for r in inp.steps["rank"].unique())
                                        if len(inp.steps) else set())
    notes = list(inp.notes)
    if run is None and inp.flight.ranks:
        notes.append(f"Flight Recorder dumps of {len(inp.flight.ranks)} ranks, backend "
                     f"{', '.join(facts['backends']) or 'unknown'} (device "
                     f"{'gpu' if facts['on_gpu'] else 'cpu'}), world size {world} from "
                     f"{facts['world_size_from']}")
    return _without_traces(
        Facts(source=inp.path, run=run, ranks=[],
              missing_ranks=sorted(set(range(world)) - recorded), problems=list(inp.problems),
              notes=notes, device="gpu" if facts["on_gpu"] else "cpu", step_time=st,
              throughput=recs.throughput_summary, step_records=records,
              cross_rank={"matchable": False, "why_not": ["no traces"], "matched_on": None,
                          "noise_us": records.noise_us},
              straggler=None, imbalance=None, findings=found, memory={},
              flight_recorder_ranks=list(inp.flight.ranks)),
        on_gpu=facts["on_gpu"], records=recs.tables)
