"""Where ``meshscope analyze`` spends its time: the whole command under pyinstrument.

    .venv/bin/python bench/profile_analyze.py PATH [--serial] [--out FILE] [--min-share 1]

Runs ``meshscope analyze --no-cache PATH`` in this process under pyinstrument's sampling
profiler (``pip install pyinstrument``; the ``bench`` extra), imports included, and prints its
call tree, every frame that took at least ``--min-share`` percent of the wall time, with
``file:function`` and seconds. With several traces the per-rank work runs in worker processes,
which a profiler of this process does not see; ``--serial`` runs it here instead (the
process pool's size is what ``os.cpu_count()`` says, set to 1 for the run), so that the
per-rank stage shows in the tree — a profile of the work, not of the wall time of the parallel
run. ``--out`` also writes the tree to a file (``.html``: pyinstrument's interactive page).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import runpy
import sys
import tempfile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=pathlib.Path, help="a run directory or a trace")
    ap.add_argument("--serial", action="store_true",
                    help="run the per-rank stage in this process (one worker)")
    ap.add_argument("--out", type=pathlib.Path, help="also write the profile here")
    ap.add_argument("--min-share", type=float, default=1.0,
                    help="leave out frames under this percent of the time")
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
