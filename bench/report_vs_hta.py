"""Benchmark: the whole ``meshscope analyze`` of a trace, as a process, against what an HTA user
runs for the same numbers.

    .venv/bin/python bench/report_vs_hta.py [--trace FILE] [-n 5] [--write]

Five commands, each a fresh process started the way a user starts it, run interleaved (A B C
A B C …) so that a busy machine slows all five alike, ``-n`` times each:

- **HTA**: a Python process that imports Holistic Trace Analysis, loads the trace
  (``TraceAnalysis(trace_dir=DIR)``) and computes ``get_comm_comp_overlap()`` and
  ``get_temporal_breakdown()`` (the overlap and idle/compute/communication split that
  ``meshscope analyze`` also reports), without drawing;
- **meshscope, cold**: ``meshscope analyze --no-cache TRACE --out DIR`` — the whole report,
  every table and summary.json written, no parquet cache read or written;
- **meshscope, cached**: ``meshscope analyze TRACE --out DIR`` with the cache already filled
  by an earlier run (the re-run after a first analysis);
- **imports**: the modules the cold command imports before it reads the trace, alone;
- **floor**: a process that imports what a pandas-free ingest would need (numpy, pyarrow and
  its compute kernels, msgspec, ISA-L), inflates the trace and decodes its events into structs
  of the seven fields a timeline reads, with the project's own stream cutter, and builds no
  table: the least any report on this stack could take, time and memory.

For each: wall time from launch to exit, and peak resident memory (the largest process, and
the whole process tree sampled every 20 ms; ``bench/measure.py``). The ratios are of medians,
and of the fastest runs beside them (on a shared machine the fastest run is the least
disturbed); a target counts as met only when both meet it. Targets (../shared/DESIGN.md):
≥ 10× faster than HTA, ≤ ¼ of its peak memory, cached ≥ 50× faster. ``--write`` puts the
section into docs/benchmarks.md under "Whole report vs HTA".
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile

if __package__ in (None, ""):   # run as a script: bench/ is not a package then
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.measure import MESHSCOPE, ROOT, load_note, measure, met, provenance, \
    publish, versions  # noqa: E402

HEADING = "## Whole report vs HTA"
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "gpu" / "hta" / "df_index_resolver" / \
    "df_index_resolver.json.gz"
TARGETS = {"speed": 10.0, "rss": 0.25, "cached": 50.0}
HTA_SCRIPT = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
overlap = analyzer.get_comm_comp_overlap(visualize=False)
breakdown = analyzer.get_temporal_breakdown(visualize=False)
assert len(overlap) and len(breakdown)
"""
# The floor and the imports: see the module docstring.
FLOOR_SCRIPT = """
import sys
import msgspec, numpy, pyarrow, pyarrow.compute
from meshscope.analysis.ingest.json_stream import EventStream

class Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0

decoder = msgspec.json.Decoder(list[Event])
with open(sys.argv[1], "rb") as f:
    raw = f.read()
n = sum(len(batch) for batch in EventStream(raw, decoder.decode).batches())
assert n > 0
"""
# What the cold command imports before it reads a byte of the trace.
IMPORTS_SCRIPT = "import meshscope.cli.analyze_cmd, meshscope.analysis.report.analyze"
KINDS = (("hta", "HTA: load + `get_comm_comp_overlap` + `get_temporal_breakdown`"),
         ("cold", "`meshscope analyze --no-cache` (the whole report)"),
         ("cached", "`meshscope analyze`, cache filled (a re-run)"),
         ("imports", "the cold command's imports alone (pandas, pyarrow, numpy, the analysis)"),
         ("floor", "floor: imports without pandas + inflate + decode of the events, no table"))


def _commands(trace: pathlib.Path, tmp: pathlib.Path) -> dict[str, list[str]]:
    hta_dir = tmp / "hta"
    hta_dir.mkdir()
    shutil.copy(trace, hta_dir / trace.name)   # HTA reads every trace of a folder
    python = MESHSCOPE[0]
    return {"hta": [python, "-c", HTA_SCRIPT, str(hta_dir)],
            "cold": [*MESHSCOPE, "analyze", "--no-cache", str(trace), "--out",
                     str(tmp / "cold")],
            "cached": [*MESHSCOPE, "analyze", str(trace), "--out", str(tmp / "cached")],
            "imports": [python, "-c", IMPORTS_SCRIPT],
            "floor": [python, "-c", FLOOR_SCRIPT, str(trace)]}


def run(trace: pathlib.Path, n: int) -> dict[str, list]:
    with tempfile.TemporaryDirectory(prefix="meshscope-bench-") as tmp:
        cmds = _commands(trace, pathlib.Path(tmp))
        measure(cmds["cached"])        # fill the cache the cached runs read
        runs = {k: [] for k, _ in KINDS}
        for i in range(n):
            for kind, _ in KINDS:
                runs[kind].append(measure(cmds[kind]))
            print(f"  round {i + 1}/{n}: " + ", ".join(
                f"{k} {v[-1].wall_s:.2f} s" for k, v in runs.items()), file=sys.stderr)
        return runs


def summarise(runs: dict[str, list]) -> tuple[str, dict]:
    med = {k: {"wall": statistics.median(m.wall_s for m in v),
               "rss": statistics.median(m.peak_rss_mb for m in v),
               "tree": statistics.median(m.peak_tree_rss_mb for m in v),
               "best": min(m.wall_s for m in v)} for k, v in runs.items()}
    hta = med["hta"]
    lines = ["| process | wall time (median) | × faster than HTA | fastest run | "
             "× (fastest) | peak RSS, largest process | of HTA's | peak RSS, all processes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, label in KINDS:
        m = med[kind]
        lines.append(f"| {label} | {m['wall']:.2f} s | {hta['wall'] / m['wall']:.1f}× | "
                     f"{m['best']:.2f} s | {hta['best'] / m['best']:.1f}× | "
                     f"{m['rss']:.0f} MB | {m['rss'] / hta['rss']:.2f} | {m['tree']:.0f} MB |")
    ratios = {"speed": hta["wall"] / med["cold"]["wall"],
              "speed_best": hta["best"] / med["cold"]["best"],
              "rss": med["cold"]["rss"] / hta["rss"],
              "cached": hta["wall"] / med["cached"]["wall"],
              "cached_best": hta["best"] / med["cached"]["best"],
              "floor": hta["wall"] / med["floor"]["wall"],
              "floor_best": hta["best"] / med["floor"]["best"],
              "floor_rss": med["floor"]["rss"] / hta["rss"],
              "imports_share": med["imports"]["wall"] / med["cold"]["wall"],
              "budget_s": hta["wall"] / TARGETS["speed"],
              "floor_s": med["floor"]["wall"]}
    return "\n".join(lines), ratios


def verdict(r: dict) -> str:
    return "\n".join([
        f"- the whole report ≥ {TARGETS['speed']:.0f}× faster than HTA: {r['speed']:.1f}× "
        f"(medians), {r['speed_best']:.1f}× (fastest runs) — "
        f"{met(min(r['speed'], r['speed_best']) >= TARGETS['speed'])}",
        f"- peak RSS ≤ ¼ of HTA's: {r['rss']:.2f} of HTA's — {met(r['rss'] <= TARGETS['rss'])}",
        f"- cached re-run ≥ {TARGETS['cached']:.0f}× faster than HTA: {r['cached']:.1f}× "
        f"(medians), {r['cached_best']:.1f}× (fastest runs) — "
        f"{met(min(r['cached'], r['cached_best']) >= TARGETS['cached'])}",
        f"- the floor (no pandas, decode only, no table): {r['floor']:.1f}× faster than HTA "
        f"(medians), {r['floor_best']:.1f}× (fastest runs), {r['floor_rss']:.2f} of its peak "
        f"RSS. 10× HTA leaves {r['budget_s']:.2f} s for the whole command, of which that floor "
        f"takes {r['floor_s']:.2f} s; the cold command's imports alone are "
        f"{100 * r['imports_share']:.0f}% of its time."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=pathlib.Path, default=DEFAULT_TRACE)
    ap.add_argument("-n", type=int, default=5, help="runs of each (median reported)")
    ap.add_argument("--write", action="store_true",
                    help="write the result into docs/benchmarks.md")
    a = ap.parse_args()
    if not a.trace.exists():
        raise SystemExit(f"{a.trace}: no such file (the shared trace corpus is missing?)")
    note = load_note()
    print(f"whole report vs HTA on {a.trace.name}, {a.n} runs each …", file=sys.stderr)
    md, ratios = summarise(run(a.trace, a.n))
    command = "bench/report_vs_hta.py" + (f" -n {a.n}" if a.n != 5 else "") + \
        (f" --trace {a.trace}" if a.trace != DEFAULT_TRACE else "")
    section = "\n".join([
        HEADING, "",
        provenance(f".venv/bin/python {command}", note, versions()), "",
        f"Trace: `{a.trace.name}` ({a.trace.stat().st_size / 2**20:.1f} MB gzipped, 54 MB of "
        f"JSON). {a.n} runs of each process, interleaved; wall time from launch to exit "
        f"(interpreter start and imports included, as a user waits for them); peak RSS: each "
        f"process's own high-water mark (`VmHWM`), sampled, for the largest process, and the "
        f"summed RSS of the process tree.", "",
        md, "", "Against the targets (../shared/DESIGN.md, performance targets):", "",
        verdict(ratios)])
    publish(HEADING, section, a.write)


if __name__ == "__main__":
    main()
