"""Benchmark: one rank's ingest and memory analysis for a trace of N allocator ``[memory]``
events (issue 33: "a trace with millions of memory events stays within the reading budgets").

Usage (from the repository root):

    .venv/bin/python bench/memory_events.py [--events 2000000]

The trace is written by this script a block at a time through gzip (level 1), never held
whole: 4 ``ProfilerStep#N`` ranges over equal quarters of the time, an operator in each, and N
``[memory]`` events on one CUDA device (``write_trace``): in runs of 1,000 events, blocks of
1 KiB allocated one after another, then freed in the same order — so the allocated total rises
and falls in a saw whose peak is known (``expected_peak``), with the allocator's totals
(``Total Allocated``, ``Total Reserved`` a fixed 2 GiB) as PyTorch writes them. A fresh process
then reads it as ``load_trace`` does (``LOAD_SCRIPT``: parse, the event and memory frames) and
runs the rank's memory analysis (``analysis/memory/rank_memory.rank_tables``), and reports
its peak RSS (``VmHWM``), its RSS after the imports, the rows and Arrow bytes of both tables,
and the peak the analysis found. Printed as one markdown row.
"""
from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import sys
import tempfile

if __package__ in (None, ""):   # run as a script: bench/ is not a package then
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.measure import MESHSCOPE, ROOT, measure  # noqa: E402

LOAD_SCRIPT = """
import json, pathlib, sys
from bench.measure import status_mb
from meshscope.analysis.ingest import event_table, events as ingest, memory_events, trace_file
from meshscope.analysis.memory import rank_memory
from meshscope.analysis.timeline import rank_timeline
before = status_mb("VmRSS")
path = pathlib.Path(sys.argv[1])
table, memory, meta = ingest._parse(path, trace_file.read_bytes(path), None)  # as load_trace does
arrow, memory_arrow = table.nbytes, memory.nbytes
owned = [table]
del table
trace = ingest.RankTrace(path=path, rank=0, events=event_table.to_frame(owned, release=True),
                         meta=meta, memory=memory_events.to_frame(memory))
del memory
tl = rank_timeline.build(trace)
out = rank_memory.rank_tables(0, trace.memory, trace.events, meta, tl.host_steps)
print(json.dumps({"events": len(trace.events), "memory_events": len(trace.memory),
                  "before_mb": before, "peak_mb": status_mb("VmHWM"), "arrow_bytes": arrow,
                  "memory_arrow_bytes": memory_arrow,
                  "peak_allocated_bytes": int(out["memory_devices"]["peak_allocated_bytes"].max()),
                  "curve_points": len(out["memory_curve"])}))
"""
BLOCK = 100_000
RUN = 1000
SIZE = 1024
BASE = 1 << 30          # allocated before the trace began
STEP_US = 1.0           # µs between memory events


def expected_peak(n: int) -> int:
    """The largest allocated total of ``write_trace``'s saw: BASE plus a full run of
    allocations (or the partial first run when n < RUN)."""
    return BASE + SIZE * min(n, RUN)


def write_trace(path: pathlib.Path, n: int) -> int:
    """Write the trace of the module docstring with ``n`` memory events; its JSON bytes."""
    span = n * STEP_US
    written = 0
    with gzip.open(path, "wb", compresslevel=1) as f:
        head = ['{"distributedInfo":{"rank":0,"world_size":1},"traceEvents":[']
        for k in range(4):
            a, d = k * span / 4, span / 4
            head.append(f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{k}",'
                        f'"ts":{a},"dur":{d},"pid":1,"tid":1}},')
            head.append(f'{{"ph":"X","cat":"cpu_op","name":"aten::empty","ts":{a},'
                        f'"dur":{d},"pid":1,"tid":1}},')
        data = "".join(head).encode()
        f.write(data)
        written += len(data)
        allocated = BASE
        for start in range(0, n, BLOCK):
            parts = []
            for i in range(start, min(n, start + BLOCK)):
                freeing = (i // RUN) % 2 == 1
                addr = 4096 * (i - RUN if freeing else i)
                size = -SIZE if freeing else SIZE
                allocated += size
                parts.append(f'{{"ph":"i","cat":"cpu_instant_event","s":"t","name":"[memory]",'
                             f'"pid":1,"tid":1,"ts":{i * STEP_US},"args":{{"Total Reserved":'
                             f'{1 << 30 << 1},"Total Allocated":{allocated},"Bytes":{size},'
                             f'"Addr":{addr},"Device Id":0,"Device Type":1}}}}')
            data = (("," if start else "") + ",".join(parts)).encode()
            f.write(data)
            written += len(data)
        f.write(b"]}")
    return written + 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshscope-memory-") as tmp:
        trace = pathlib.Path(tmp) / "rank0.json.gz"
        n_bytes = write_trace(trace, args.events)
        gz_mb = trace.stat().st_size / 1e6
        got = json.loads(measure([MESHSCOPE[0], "-c", LOAD_SCRIPT, str(trace)],
                                 env={"PYTHONPATH": str(ROOT)}).stdout.strip().splitlines()[-1])
    n = got["memory_events"]
    print("| [memory] events | JSON, MB | gzip, MB | peak RSS, MB | peak − RSS after imports, "
          "bytes/event | memory table (Arrow), bytes/event | peak found = expected |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    print(f"| {n:,} | {n_bytes / 1e6:,.0f} | {gz_mb:,.0f} | {got['peak_mb']:,.0f} | "
          f"{(got['peak_mb'] - got['before_mb']) * 2**20 / n:,.0f} | "
          f"{got['memory_arrow_bytes'] / n:,.0f} | "
          f"{got['peak_allocated_bytes'] == expected_peak(n)} |")


if __name__ == "__main__":
    main()
