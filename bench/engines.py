"""Benchmark: the Dask engine on a local cluster of 2 workers against the local engine, on the
same synthetic ranks — time, memory, and whether the two reports agree.

    flock /tmp/meshscope-cpu.lock .venv/bin/python bench/engines.py [--ranks 256] \\
        [--events 100000] [--pp 2] [--root /tmp/meshscope-scale] [--keep] [--write]

One run directory of ``bench/synth.py`` (made by ``bench/scale.py``'s ``generate``, so a
directory that one kept is reused), then, side by side on it, ``meshscope analyze --no-cache``
with ``--engine local --workers 2`` and with ``--engine dask --workers 2`` (a
``distributed.LocalCluster`` of two worker processes that the command starts and stops itself),
each as a process: wall time, and peak RSS of the largest process and of the whole process tree
(``bench/measure.py``; the Dask scheduler and workers are children of the command, so they are
counted). The reports are then compared table by table: every parquet file equal, floats
within 1e-9 relative, and summary.json equal but for its time stamp and source. ``--write``
puts the table into docs/benchmarks.md under "Dask engine vs local engine".
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys

import numpy as np
import pandas as pd

if __package__ in (None, ""):   # run as a script: bench/ is not a package then
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.measure import MESHSCOPE, load_note, measure, provenance, \
    publish  # noqa: E402
from bench.scale import generate, parse_synthetic_args  # noqa: E402

HEADING = "## Dask engine vs local engine"
ENGINES = ("local", "dask")


def analyse(run: pathlib.Path, engine: str, workers: int) -> tuple[dict, pathlib.Path]:
    # Beside the run, not in it: a report may not be written inside the analysed folder.
    out = run.parent / f"{run.name}-report-{engine}"
    shutil.rmtree(out, ignore_errors=True)
    m = measure([*MESHSCOPE, "analyze", "--no-cache", str(run), "--out", str(out),
                 "--engine", engine, "--workers", str(workers)], timeout_s=4 * 3600)
    return {"engine": engine, "wall_s": m.wall_s, "rss_mb": m.peak_rss_mb,
            "tree_mb": m.peak_tree_rss_mb}, out


def differences(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    """What differs between two report directories (empty when they agree)."""
    diffs = []
    names = sorted(p.name for p in a.glob("*.parquet"))
    if names != sorted(p.name for p in b.glob("*.parquet")):
        diffs.append("different sets of tables")
    for name in names:
        x, y = pd.read_parquet(a / name), pd.read_parquet(b / name)
        if list(x.columns) != list(y.columns) or len(x) != len(y):
            diffs.append(f"{name}: shape")
            continue
        for col in x.columns:
            u, v = x[col], y[col]
            if pd.api.types.is_float_dtype(u) and pd.api.types.is_float_dtype(v):
                same = np.allclose(u.to_numpy(float), v.to_numpy(float), rtol=1e-9, atol=0,
                                   equal_nan=True)
            else:
                same = u.astype(str).tolist() == v.astype(str).tolist()
            if not same:
                diffs.append(f"{name}: {col}")
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for s in (sa, sb):
        s.pop("generated", None), s.pop("source", None)
    if sa != sb:
        diffs.append("summary.json")
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    a = parse_synthetic_args(ap)
    note = load_note()
    run, info = generate(a.root, a.ranks, a.events, a.pp)
    rows, outs = [], []
    for engine in ENGINES:
        print(f"  {a.ranks} ranks, --engine {engine} …", file=sys.stderr, flush=True)
        row, out = analyse(run, engine, a.workers)
        rows.append(row), outs.append(out)
        print(f"  {engine}: {row['wall_s']:.1f} s, peak {row['tree_mb']:.0f} MB",
              file=sys.stderr, flush=True)
    diffs = differences(*outs)
    base = rows[0]["wall_s"]
    lines = ["| engine | `analyze --no-cache` | × the local engine's time | "
             "peak RSS, largest process | peak RSS, all processes |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| `--engine {r['engine']} --workers {a.workers}` | {r['wall_s']:.1f} s | "
                     f"{r['wall_s'] / base:.2f} | {r['rss_mb']:.0f} MB | {r['tree_mb']:.0f} MB |")
    agree = ("the two reports agree: every table equal (floats within 1e-9 relative) and "
             "summary.json equal but for its time stamp" if not diffs
             else "the reports differ: " + "; ".join(diffs))
    section = "\n".join([
        HEADING, "",
        provenance(f"flock /tmp/meshscope-cpu.lock .venv/bin/python bench/engines.py "
                   f"--ranks {a.ranks} --events {a.events} --pp {a.pp} --workers {a.workers}",
                   note),
        "",
        f"{a.ranks} synthetic ranks of {info['events_per_rank']:,} trace events "
        f"({info['trace_mb']:,.0f} MB of traces), dp = {a.ranks // a.pp} × pp = {a.pp}; each "
        f"engine once, as a process, one after the other. The Dask engine starts a "
        f"`LocalCluster` of {a.workers} worker processes itself (its start-up is in its time).",
        "", "\n".join(lines), "", f"Result: {agree}."])
    publish(HEADING, section, a.write)
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
    if not a.keep:
        shutil.rmtree(run, ignore_errors=True)
    if diffs:
        raise SystemExit(2)


if __name__ == "__main__":
    main()
