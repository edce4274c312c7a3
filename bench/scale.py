"""Benchmark: the whole report at 64, 256 and 1,024 synthetic ranks — time and memory.

    flock /tmp/meshscope-cpu.lock .venv/bin/python bench/scale.py [--ranks 64,256,1024] \\
        [--events 100000] [--pp 2] [--root /tmp/meshscope-scale] [--keep] [--write]

For each rank count N, ``bench/synth.py`` writes a run directory under ``--root`` (never in the
repository): N ranks of ``--events`` trace events each (over 3 profiled steps), laid out as
dp = N / pp × ``--pp`` with 1F1B, the runner's CPU/gloo trace structure, one slow rank. Then
``meshscope analyze --no-cache RUN`` runs once as a process, as a user would run it: its wall
time, the peak RSS of its largest process and of the whole process tree (the ingest workers
included; ``bench/measure.py``), and that peak per rank. The generation is timed too (and
the traces' size on disk). A directory is deleted after its measurement unless ``--keep``;
one that already exists with the same parameters is reused (its generation not re-timed).

Targets (../shared/DESIGN.md, issue 13): 64 ranks of realistic traces in under a minute on
2 cores, 1,024 in under 10 minutes; peak memory flat in the rank count. ``--write`` puts the
table into docs/benchmarks.md under "Scale: synthetic ranks".
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import time

if __package__ in (None, ""):   # run as a script: bench/ is not a package then
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.measure import MESHSCOPE, load_note, measure, provenance, \
    publish  # noqa: E402

HEADING = "## Scale: synthetic ranks"
STEPS = 3
SLOW_MS = 20.0


def generate(root: pathlib.Path, ranks: int, events: int, pp: int) -> tuple[pathlib.Path, dict]:
    """The run directory for ``ranks`` (made, or reused when its parameters match) and how
    long making it took."""
    from bench.synth import make_run

    run = root / f"ranks{ranks}-events{events}-pp{pp}"
    params = {"ranks": ranks, "events_per_step": events // STEPS, "layout":
              f"dp={ranks // pp},pp={pp}" if pp > 1 else f"dp={ranks}"}
    info = {"generate_s": None}
    desc = json.loads((run / "run.json").read_text()) if (run / "run.json").exists() else {}
    same = desc.get("layout_str") == params["layout"] and \
        desc.get("synthetic", {}).get("events_per_step") == params["events_per_step"]
    if not same:
        shutil.rmtree(run, ignore_errors=True)
        t0 = time.perf_counter()
        make_run(run, steps=STEPS, slow_rank=ranks // 3, slow_ms=SLOW_MS, **params)
        info["generate_s"] = time.perf_counter() - t0
        desc = json.loads((run / "run.json").read_text())
    info["trace_mb"] = sum(f.stat().st_size for f in (run / "traces").iterdir()) / 2**20
    info["events_per_rank"] = desc["synthetic"]["trace_events_per_step"] * STEPS
    return run, info


def analyse(run: pathlib.Path) -> dict:
    # Beside the run, not in it: a report may not be written inside the analysed folder.
    out = run.parent / f"{run.name}-report"
    shutil.rmtree(out, ignore_errors=True)
    m = measure([*MESHSCOPE, "analyze", "--no-cache", str(run), "--out", str(out)],
                timeout_s=4 * 3600)
    summary = json.loads((out / "summary.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": m.wall_s, "rss_mb": m.peak_rss_mb, "tree_mb": m.peak_tree_rss_mb,
            "ranks_analysed": len(summary["ranks"]), "problems": len(summary["problems"])}


def parse_synthetic_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """The options of a benchmark on ``generate``'s run directories (this script's and
    ``bench/engines.py``'s), parsed; ``--root`` made."""
    ap.add_argument("--events", type=int, default=100_000, help="trace events per rank")
    ap.add_argument("--pp", type=int, default=2, help="pipeline stages (dp = ranks / pp)")
    ap.add_argument("--root", type=pathlib.Path, default=pathlib.Path("/tmp/meshscope-scale"))
    ap.add_argument("--keep", action="store_true", help="keep the generated directories")
    ap.add_argument("--write", action="store_true",
                    help="write the table into docs/benchmarks.md")
    a = ap.parse_args()
    a.root.mkdir(parents=True, exist_ok=True)
    return a


def table(rows: list[dict]) -> str:
    lines = ["| ranks | events per rank | traces on disk | generation | `analyze --no-cache` | "
             "peak RSS, largest process | peak RSS, all processes | per rank | "
             "ranks analysed |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gen = f"{r['generate_s']:.0f} s" if r["generate_s"] is not None else "(reused)"
        lines.append(f"| {r['ranks']} | {r['events_per_rank']:,} | {r['trace_mb']:,.0f} MB | "
                     f"{gen} | {r['wall_s']:.1f} s | {r['rss_mb']:.0f} MB | "
                     f"{r['tree_mb']:.0f} MB | {r['tree_mb'] / r['ranks']:.2f} MB | "
                     f"{r['ranks_analysed']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,256,1024")
    a = parse_synthetic_args(ap)
    note = load_note()
    rows = []
    for n in (int(x) for x in a.ranks.split(",")):
        run, info = generate(a.root, n, a.events, a.pp)
        print(f"  {n} ranks: generated in {info['generate_s'] or 0:.0f} s "
              f"({info['trace_mb']:.0f} MB); analysing …", file=sys.stderr, flush=True)
        row = {"ranks": n, **info, **analyse(run)}
        rows.append(row)
        print(f"  {n} ranks: analyze {row['wall_s']:.1f} s, peak {row['tree_mb']:.0f} MB",
              file=sys.stderr, flush=True)
        if not a.keep:
            shutil.rmtree(run, ignore_errors=True)
    section = "\n".join([
        HEADING, "",
        provenance(f"flock /tmp/meshscope-cpu.lock .venv/bin/python bench/scale.py "
                   f"--ranks {a.ranks} --events {a.events} --pp {a.pp}", note,
                   f"{os.cpu_count()} ingest workers"), "",
        f"Synthetic runs of `bench/synth.py`: dp = ranks / {a.pp} × pp = {a.pp}, 1F1B with "
        f"4 microbatches, DDP's bucketed all-reduce, {STEPS} profiled steps, one rank "
        f"{SLOW_MS:.0f} ms slower per step; the runner's CPU/gloo trace structure. One "
        f"`meshscope analyze --no-cache` per size, as a process; peak RSS of its largest "
        f"process and of all its processes together (the ingest workers included), and the "
        f"latter per rank.", "",
        table(rows)])
    publish(HEADING, section, a.write)


if __name__ == "__main__":
    main()
