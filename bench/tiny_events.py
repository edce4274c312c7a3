"""Benchmark: peak memory of one rank's ingest for a trace of N tiny events (issue 24: "10
million tiny events fit in 2 GB").

Usage (from the repository root):

    .venv/bin/python bench/tiny_events.py [--events 10000000]

The trace is written by this script, a block at a time through gzip (level 1), never held
whole: N complete CPU events ``{"ph":"X","name":"op<k>","cat":"cpu_op","ts":…,"dur":1,
"pid":1,"tid":<t>}`` with 16 distinct names on 4 threads — the smallest events a profiler
writes, so the table's cost per event is all the ingest adds. A fresh process then runs
ingest on it without cache (parse, then the pandas frame, as ``load_trace`` does) and reports
its peak RSS (``VmHWM``), its RSS after the imports, the events in the table, the Arrow table's
bytes as built and the pandas frame's own bytes; printed as one markdown row.
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
from meshscope.analysis.ingest import event_table, events as ingest, trace_file
before = status_mb("VmRSS")
path = pathlib.Path(sys.argv[1])
table, _, meta = ingest._parse(path, trace_file.read_bytes(path), None)  # as load_trace does
arrow = table.nbytes
owned = [table]                 # to_frame holds the only reference, as in load_trace
del table
frame = event_table.to_frame(owned, release=True)
print(json.dumps({"events": len(frame), "before_mb": before, "peak_mb": status_mb("VmHWM"),
                  "arrow_bytes": arrow, "frame_bytes": int(frame.memory_usage(deep=True).sum())}))
"""
BLOCK = 100_000


def write_trace(path: pathlib.Path, n: int) -> int:
    """Write ``n`` tiny events to ``path`` (gzip); the bytes of JSON written."""
    written = 0
    with gzip.open(path, "wb", compresslevel=1) as f:
        head = b'{"distributedInfo":{"rank":0,"world_size":1},"traceEvents":['
        f.write(head)
        written += len(head)
        for start in range(0, n, BLOCK):
            text = ",".join(
                f'{{"ph":"X","name":"op{i % 16}","cat":"cpu_op","ts":{i},"dur":1,'
                f'"pid":1,"tid":{i % 4}}}' for i in range(start, min(n, start + BLOCK)))
            data = (("," if start else "") + text).encode()
            f.write(data)
            written += len(data)
        f.write(b"]}")
    return written + 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshscope-tiny-") as tmp:
        trace = pathlib.Path(tmp) / "rank0.json.gz"
        n_bytes = write_trace(trace, args.events)
        gz_mb = trace.stat().st_size / 1e6
        got = json.loads(measure([MESHSCOPE[0], "-c", LOAD_SCRIPT, str(trace)],
                                 env={"PYTHONPATH": str(ROOT)}).stdout.strip().splitlines()[-1])
    n = got["events"]
    print("| events | JSON, MB | gzip, MB | peak RSS, MB | peak − RSS after imports, bytes/event "
          "| Arrow table, bytes/event | pandas frame, bytes/event |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {n:,} | {n_bytes / 1e6:,.0f} | {gz_mb:,.0f} | {got['peak_mb']:,.0f} | "
          f"{(got['peak_mb'] - got['before_mb']) * 2**20 / n:,.0f} | "
          f"{got['arrow_bytes'] / n:,.0f} | {got['frame_bytes'] / n:,.0f} |")


if __name__ == "__main__":
    main()
