"""Where ``meshscope analyze`` spends its time: the whole command under pyinstrument.

    .venv/bin/python bench/profile_analyze.py PATH [--serial] [--out FILE] [--min-share 1]
    .venv/bin/python bench/profile_analyze.py PATH --parts     # wall time of each part, no profiler

Runs ``meshscope analyze --no-cache PATH`` in this process under pyinstrument's sampling
profiler (``pip install pyinstrument``; the ``bench`` extra), imports included, and prints its
call tree, every frame that took at least ``--min-share`` percent of the wall time, with
``file:function`` and seconds. With several traces the per-rank work runs in worker processes,
which a profiler of this process does not see; ``--serial`` runs it here instead (the
process pool's size is what ``os.cpu_count()`` says, set to 1 for the run), so that the
per-rank stage shows in the tree — a profile of the work, not of the wall time of the parallel
run. ``--out`` also writes the tree to a file (``.html``: pyinstrument's interactive page).

``--parts`` runs the same command without a profiler and prints the wall time of its parts as
this process sees them (``PARTS``): the imports, reading the trace (``load_trace``: its events
decoded, in parts on every core for one large trace), the steps, the timeline, the GPU tables
made with the timeline, the trust checks where this process makes them, the wait for the
tables made beside the timeline in a forked copy (``pool.Beside``: one large trace), the
cross-rank stage and the write. The parts are found by name, so the script times the tree
that ``PYTHONPATH`` names as well (another revision's, for a before and after side by side);
a part that tree does not have is left out.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import runpy
import sys
import tempfile
import time

# (module, attribute, label) of each part ``--parts`` times; an attribute ``Class.method`` is
# a method.
PARTS = [("meshscope.analysis.ingest.events", "load_trace", "read the trace (load_trace)"),
         ("meshscope.analysis.timeline.step_windows", "step_windows", "steps (step_windows)"),
         ("meshscope.analysis.timeline.rank_timeline", "build", "timeline (rank_timeline.build)"),
         ("meshscope.analysis.report.rank_work", "_timeline_gpu_tables",
          "GPU tables on the timeline"),
         ("meshscope.analysis.trust.rank_checks", "rank_checks", "trust checks, in this process"),
         ("meshscope.analysis.ingest.pool", "Beside.result",
          "wait for the tables made beside the timeline"),
         ("meshscope.analysis.report.analyze", "_cross_rank", "cross-rank stage"),
         ("meshscope.analysis.report.result", "Report.write", "write the report")]


def _timed_parts() -> dict[str, float]:
    """Wrap each of ``PARTS`` so that its calls' wall time adds up under its label."""
    spent: dict[str, float] = {}

    def timed(fn, label):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0
        return run

    for module, attr, label in PARTS:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        *cls, name = attr.split(".")
        if cls:
            owner = getattr(owner, cls[0], None)
        if owner is not None and hasattr(owner, name):
            setattr(owner, name, timed(getattr(owner, name), label))
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=pathlib.Path, help="a run directory or a trace")
    ap.add_argument("--serial", action="store_true",
                    help="run the per-rank stage in this process (one worker)")
    ap.add_argument("--out", type=pathlib.Path, help="also write the profile here")
    ap.add_argument("--min-share", type=float, default=1.0,
                    help="leave out frames under this percent of the time")
    ap.add_argument("--parts", action="store_true",
                    help="no profiler: the wall time of each part (module docstring)")
    a = ap.parse_args()
    if a.parts:
        _parts(a.path)
        return
    try:
        from pyinstrument import Profiler
    except ImportError:
        raise SystemExit("needs pyinstrument: .venv/bin/pip install pyinstrument") from None
    if a.serial:
        os.cpu_count = lambda: 1
    with tempfile.TemporaryDirectory(prefix="meshscope-profile-") as tmp:
        sys.argv = ["meshscope", "analyze", "--no-cache", str(a.path), "--out", tmp]
        profiler = Profiler(interval=0.001)
        profiler.start()
        try:
            runpy.run_module("meshscope", run_name="__main__")
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        finally:
            profiler.stop()
    text = profiler.output_text(unicode=True, color=False, show_all=False,
                                processor_options={"filter_threshold": a.min_share / 100})
    print(text, file=sys.stderr)
    if a.out:
        a.out.write_text(profiler.output_html() if a.out.suffix == ".html" else text)


def _parts(path: pathlib.Path) -> None:
    t0 = time.perf_counter()
    spent = _timed_parts()
    imports = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="meshscope-parts-") as tmp:
        sys.argv = ["meshscope", "analyze", "--no-cache", str(path), "--out", tmp]
        try:
            runpy.run_module("meshscope", run_name="__main__")
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    total = time.perf_counter() - t0
    print(f"{'imports (the analysis modules)':48s} {imports:7.2f} s")
    for _, _, label in PARTS:
        if label in spent:
            print(f"{label:48s} {spent[label]:7.2f} s")
    print(f"{'the whole command':48s} {total:7.2f} s  (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
