"""The index of runs and ``meshscope query`` over 1,000 reports (docs/benchmarks.md,
"History index").

Four synthetic runs are made and analysed (``bench/history_synth.py``), and their reports
copied into N report folders (``runNNNN/report``, with run.json: each as ``meshscope analyze``
leaves it). Then, each phase in a fresh interpreter (its time and peak resident memory):

- ``build``: ``meshscope index add`` of the N reports into an empty index;
- ``again``: the same add once more (nothing changed: every report skipped by its mtime);
- ``one``: one new run's report added to the index of N;
- ``query-runs``: ``SELECT layout, count(*), median(step_time_us) FROM runs GROUP BY 1``;
- ``query-table``: ``SELECT run, avg(compute_us) FROM breakdown GROUP BY run`` — every
  report's breakdown.parquet read in place.

Each phase's time is given whole (the interpreter's start and imports included, as a command
pays them) and for the work alone (opening the index, the add or the query).

    python -m bench.history_index [--reports 1000] [--work DIR]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

_CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from meshscope.history.index import RunIndex
from meshscope.history.query import query
phase, index, arg = sys.argv[1], sys.argv[2], sys.argv[3]
t1 = time.perf_counter()
with RunIndex(index) as idx:
    if phase in ("build", "again", "one"):
        res = idx.add([arg])
        n = len(res.added) + len(res.updated) + len(res.unchanged)
    else:
        n = len(query(arg, idx))
t2 = time.perf_counter()
print(json.dumps({"s": t2 - t0, "op_s": t2 - t1, "n": n,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _phase(phase: str, index: pathlib.Path, arg: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, phase, str(index), arg], cwd=ROOT,
                         capture_output=True, text=True, check=True,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def make_reports(work: pathlib.Path, n: int) -> pathlib.Path:
    """N report folders under ``work/reports`` (module docstring); the spare run for ``one``
    at ``work/spare``."""
    sys.path.insert(0, str(ROOT))
    from bench import history_synth

    seeds = [history_synth.make_run(work / "seeds" / f"s{i}", i, slow=i == 3, compute=i == 4,
                                    memory=False) for i in (1, 2, 3, 4)]
    for run in seeds:
        history_synth.analyse(run)
    reports = work / "reports"
    for i in range(n):
        src = seeds[i % len(seeds)]
        dst = reports / f"run{i:04d}"
        dst.mkdir(parents=True)
        shutil.copy2(src / "run.json", dst / "run.json")
        shutil.copytree(src / "report", dst / "report",
                        ignore=shutil.ignore_patterns(".cache"))
    shutil.copytree(seeds[0], work / "spare" / "run-new",
                    ignore=shutil.ignore_patterns(".cache"))
    return reports


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=1000)
    ap.add_argument("--work", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="meshscope-history-bench-"))
    t0 = time.perf_counter()
    reports = make_reports(work, args.reports)
    made_s = time.perf_counter() - t0
    index = work / "index.sqlite"
    rows = {}
    rows["build"] = _phase("build", index, str(reports))
    rows["again"] = _phase("again", index, str(reports))
    rows["one"] = _phase("one", index, str(work / "spare"))
    rows["query-runs"] = _phase("query-runs", index, "SELECT layout, count(*) AS n, "
                                "median(step_time_us) AS st FROM runs GROUP BY 1")
    rows["query-table"] = _phase("query-table", index, "SELECT run, avg(compute_us) AS c "
                                 "FROM breakdown GROUP BY run")
    print(f"{args.reports} reports made in {made_s:.1f} s under {work}; index "
          f"{index.stat().st_size / 1024:.0f} KiB")
    print(f"{'phase':<12} {'rows':>6} {'command s':>10} {'of it, the work s':>18} "
          f"{'peak RSS MiB':>13}")
    for phase, r in rows.items():
        print(f"{phase:<12} {r['n']:>6} {r['s']:>10.3f} {r['op_s']:>18.3f} "
              f"{r['rss_mib']:>13.0f}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
