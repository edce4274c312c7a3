"""A series of small synthetic runs with known changes, analysed (issue 50's history tests
and bench/history_index.py).

``make_series(out, n)`` writes runs ``run01`` … ``runNN`` with ``bench/synth.py`` (2 ranks,
dp=2, 3 profiled steps, a few hundred events a step; each run its own seed, so the runs
differ as repeated runs do: the step-to-step noise of synth's seeded compute), each started
a day after the one before (run.json's ``start_time``), and analyses each (``RUN/report``).
Changes are injected from a run on (1-based, ``None``: never):

- ``slow_from``: rank 1 computes ``SLOW_MS`` longer a step (synth's ``slow_rank``);
- ``compute_from``: every op takes ``COMPUTE_FACTOR`` times longer (synth's ``US_PER_EVENT``);
- ``memory_from``: the step timers' peak memory is ``MEMORY_GROWTH_BYTES`` higher;
- ``other_device``: one more run, last, whose run.json names another device.

    python -m bench.history_synth OUT [N]
"""
from __future__ import annotations

import datetime as dt
import json
import pathlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from bench import synth
from meshscope.collectors import run_dir as rd

SLOW_MS = 0.6
COMPUTE_FACTOR = 1.10
MEMORY_GROWTH_BYTES = 200_000_000
OTHER_DEVICE = "aarch64"


def _grow_memory(run: pathlib.Path, extra_bytes: int) -> None:
    for f in sorted((run / rd.STEPS).glob("*.parquet")):
        t = pq.read_table(f)
        cols = t.to_pydict()
        cols["peak_memory_bytes"] = [x + extra_bytes for x in cols["peak_memory_bytes"]]
        pq.write_table(pa.Table.from_pydict(cols, schema=t.schema), f)


def _restate(run: pathlib.Path, day: int, device: str | None) -> None:
    doc = json.loads((run / rd.RUN_JSON).read_text())
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=day - 1)
    doc["start_time"] = start.isoformat(timespec="seconds")
    if device:
        doc["device"]["name"] = device
    rd.write_json_atomic(run / rd.RUN_JSON, doc)


def make_run(out: pathlib.Path, i: int, *, slow: bool, compute: bool, memory: bool,
             device: str | None = None, events_per_step: int = 300) -> pathlib.Path:
    """One run of the series (module docstring), not analysed."""
    base = synth.US_PER_EVENT
    synth.US_PER_EVENT = base * (COMPUTE_FACTOR if compute else 1.0)
    try:
        run = synth.make_run(out, ranks=2, steps=3, events_per_step=events_per_step, seed=i,
                             workers=1, slow_rank=1 if slow else None,
                             slow_ms=SLOW_MS if slow else 0.0)
    finally:
        synth.US_PER_EVENT = base
    if memory:
        _grow_memory(run, MEMORY_GROWTH_BYTES)
    _restate(run, i, device)
    return run


def analyse(run: pathlib.Path) -> pathlib.Path:
    """``run``'s report (``RUN/report``), as ``meshscope analyze`` writes it (no trace cache)."""
    from meshscope.analysis.report.ensure import analysed
    from meshscope.analysis.report.options import AnalysisOptions

    report = rd.ReportDir.of_run(run).path
    analysed(run, report, AnalysisOptions())
    return report


def make_series(out: pathlib.Path, n: int = 30, *, slow_from: int | None = 12,
                compute_from: int | None = 20, memory_from: int | None = 25,
                other_device: bool = True, events_per_step: int = 300) -> list[pathlib.Path]:
    """The runs of the series (module docstring), analysed; the other-device run last."""
    out = pathlib.Path(out)

    def on(since: int | None, i: int) -> bool:
        return since is not None and i >= since

    runs = [make_run(out / f"run{i:02d}", i, slow=on(slow_from, i),
                     compute=on(compute_from, i), memory=on(memory_from, i),
                     events_per_step=events_per_step)
            for i in range(1, n + 1)]
    if other_device:
        runs.append(make_run(out / f"run{n + 1:02d}", n + 1, slow=on(slow_from, n + 1),
                             compute=on(compute_from, n + 1), memory=on(memory_from, n + 1),
                             device=OTHER_DEVICE, events_per_step=events_per_step))
    for run in runs:
        analyse(run)
    return runs


if __name__ == "__main__":
    made = make_series(pathlib.Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 30)
    print(f"{len(made)} runs in {sys.argv[1]}")
