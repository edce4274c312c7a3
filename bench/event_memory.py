"""Benchmark: memory per event of one rank's trace, meshscope against HTA in the same run.

Usage (from the repository root):

    .venv/bin/python bench/event_memory.py [--trace FILE] [--copies 8] [--write]

The reference trace (``df_index_resolver``, one rank) is repeated ``--copies`` times in time
(each copy shifted by the trace's span, correlation ids offset so that each copy's kernels
match their own launches) into one ``.json.gz``: with 8 copies about 1.7M real events and
380 MB of JSON, the size of a long GPU rank. Three fresh processes measured, one after the
other:

- **meshscope ingest**: ``load_trace`` of the file, no cache (the per-rank event table the
  analysis reads): peak RSS of the process, RSS before the load, and the table's own size
  (Arrow bytes, and the pandas frame the analysis receives, ``memory_usage(deep=True)``);
- **meshscope per-rank stage**: ``rank_work`` of the file, no cache
  (``analysis/report/rank_work.py``: ingest, the rank's timeline, its operations and GPU
  tables — what one ingest worker does for one rank): peak RSS and RSS after imports;
- **meshscope analyze**: ``meshscope analyze --no-cache FILE`` as a process (the whole report);
- **HTA**: load + ``get_comm_comp_overlap`` + ``get_temporal_breakdown`` (the same numbers).

Bytes per event are (peak − RSS after imports) / events for the ingest, peak / events for the
whole processes. Target (../shared/DESIGN.md): about 150 bytes an event in a rank's table, the
whole command ≤ ¼ of HTA's peak. ``--write`` puts the section into docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import shutil
import sys
import tempfile

if __package__ in (None, ""):   # run as a script: bench/ is not a package then
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.measure import MESHSCOPE, ROOT, load_note, measure, provenance, publish, \
    versions  # noqa: E402
from bench.report_vs_hta import DEFAULT_TRACE, HTA_SCRIPT  # noqa: E402

HEADING = "## Memory per event vs HTA"
INGEST_SCRIPT = """
import json, pathlib, sys
from bench.measure import status_mb
from meshscope.analysis.ingest import event_table, events as ingest
before = status_mb("VmRSS")
table, _, meta = ingest._parse(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[1]).read_bytes(),
                            None)
arrow, events = table.nbytes, table.num_rows
owned = [table]                 # as load_trace does: to_frame holds the only reference
del table
frame = event_table.to_frame(owned, release=True)
print(json.dumps({"events": events, "arrow_bytes": arrow,
                  "pandas_bytes": int(frame.memory_usage(deep=True).sum()),
                  "before_mb": before, "peak_mb": status_mb("VmHWM")}))
"""

STAGE_SCRIPT = """
import json, pathlib, sys
from bench.measure import status_mb
from meshscope.analysis.report import rank_work as rw
before = status_mb("VmRSS")
result = rw.rank_work(pathlib.Path(sys.argv[1]), rw.RankOptions())
print(json.dumps({"before_mb": before, "peak_mb": status_mb("VmHWM"),
                  "on_gpu": bool(result.on_gpu)}))
"""


def replicate(trace: pathlib.Path, copies: int, dest: pathlib.Path) -> tuple[int, int]:
    """(events, bytes of JSON) of ``dest``: ``trace``'s events ``copies`` times in time."""
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    events = doc["traceEvents"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur", 0), (int, float))]
    span = max(ends) - min(ts) + 1000.0
    corr = max((e.get("args", {}).get("correlation", 0) for e in events
                if isinstance(e.get("args", {}).get("correlation", 0), int)), default=0) + 1
    out = []
    for k in range(copies):
        for e in events:
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] = e2["ts"] + k * span
            a = e2.get("args")
            if isinstance(a, dict) and isinstance(a.get("correlation"), int):
                e2["args"] = {**a, "correlation": a["correlation"] + k * corr}
            out.append(e2)
    doc["traceEvents"] = out
    text = json.dumps(doc).encode()
    dest.write_bytes(gzip.compress(text, 1))
    return len(out), len(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=pathlib.Path, default=DEFAULT_TRACE)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = ap.parse_args()
    note = load_note()
    with tempfile.TemporaryDirectory(prefix="meshscope-memory-") as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "hta").mkdir()
        trace = tmp / "hta" / "rank0.json.gz"
        n_json, n_bytes = replicate(args.trace, args.copies, trace)
        python = MESHSCOPE[0]
        env = {"PYTHONPATH": str(ROOT)}
        ingest = measure([python, "-c", INGEST_SCRIPT, str(trace)], env=env)
        got = json.loads(ingest.stdout.strip().splitlines()[-1])
        stage = json.loads(measure([python, "-c", STAGE_SCRIPT, str(trace)],
                                   env=env).stdout.strip().splitlines()[-1])
        whole = measure([*MESHSCOPE, "analyze", "--no-cache", str(trace), "--out",
                         str(tmp / "report")])
        hta = measure([python, "-c", HTA_SCRIPT, str(tmp / "hta")], env=env)
        shutil.rmtree(tmp / "report", ignore_errors=True)
    n = n_json                  # per event of the file (the "bytes an event")
    mb = 2 ** 20
    per = lambda b: f"{b / n:,.0f}"  # noqa: E731
    rows = [
        ("meshscope ingest: Arrow event table", "", per(got["arrow_bytes"])),
        ("meshscope ingest: pandas frame the analysis reads", "", per(got["pandas_bytes"])),
        ("meshscope ingest: peak − RSS after imports", f"{got['peak_mb']:,.0f}",
         per((got["peak_mb"] - got["before_mb"]) * mb)),
        ("meshscope per-rank stage (`rank_work`, whole process)", f"{stage['peak_mb']:,.0f}",
         per(stage["peak_mb"] * mb)),
        ("meshscope per-rank stage: peak − RSS after imports", "",
         per((stage["peak_mb"] - stage["before_mb"]) * mb)),
        ("`meshscope analyze --no-cache` (whole process)", f"{whole.peak_tree_rss_mb:,.0f}",
         per(whole.peak_tree_rss_mb * mb)),
        ("HTA: load + overlap + temporal breakdown (whole process)", f"{hta.peak_tree_rss_mb:,.0f}",
         per(hta.peak_tree_rss_mb * mb)),
    ]
    table = "\n".join(["| what | peak RSS, MB | bytes per event |", "|---|---:|---:|"] +
                      [f"| {a} | {b} | {c} |" for a, b, c in rows])
    section = (f"{HEADING}\n\n"
               + provenance(f"bench/event_memory.py --copies {args.copies}", note, versions())
               + f"\n\nThe reference trace repeated {args.copies}× in time: {n_json:,} events "
               f"in the file ({n_bytes / 1e6:,.0f} MB of JSON), {got['events']:,} complete "
               f"events in the table; bytes per event of the file.\n\n"
               + table
               + f"\n\nAgainst HTA's peak in the same run: the per-rank stage "
               f"{stage['peak_mb'] / hta.peak_tree_rss_mb:.2f} (target < 0.25), the ingest "
               f"{got['peak_mb'] / hta.peak_tree_rss_mb:.2f}, the whole command "
               f"{whole.peak_tree_rss_mb / hta.peak_tree_rss_mb:.2f}; the table: {got['arrow_bytes'] / n:,.0f} bytes an "
               f"event as Arrow, {got['pandas_bytes'] / n:,.0f} as pandas (target ≈ 150).\n")
    publish(HEADING, section, args.write)


if __name__ == "__main__":
    main()
