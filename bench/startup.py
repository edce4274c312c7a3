"""Benchmark: how long each ``meshscope`` command takes to start, and what it imports.

    .venv/bin/python bench/startup.py [-n 7] [--write]

For every command of the CLI (read from ``meshscope.cli.main`` itself), ``meshscope CMD
--help`` as a user runs it (``.venv/bin/meshscope``, a fresh process each time), ``-n`` times,
interleaved so that a busy machine slows all alike; the median and the fastest wall time of
each, beside a bare interpreter (``python -c pass``) and ``meshscope --version``. One more run
of each with ``-X importtime`` says which heavy libraries it loaded (torch, dash, pandas,
pyarrow…): the commands that do not train must not load torch, and ``analyze`` not Dash.
The target (../shared/DESIGN.md): ``meshscope --help`` under 0.5 s. ``--write`` puts the
table into docs/benchmarks.md under "Start-up".
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys

if __package__ in (None, ""):   # run as a script: bench/ is not a package then
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.measure import ROOT, load_note, measure, provenance, \
    publish  # noqa: E402

HEADING = "## Start-up"
PYTHON = str(ROOT / ".venv" / "bin" / "python")
SCRIPT = str(ROOT / ".venv" / "bin" / "meshscope")
HEAVY = ("torch", "dash", "plotly", "flask", "pandas", "pyarrow", "numpy", "hta", "msgspec")
TARGET_S = 0.5


def commands() -> list[tuple[str, list[str]]]:
    """(label, argv) of every measurement: the bare interpreter, then each command."""
    from meshscope.cli import main

    out = [("python -c pass", [PYTHON, "-c", "pass"]),
           ("meshscope --version", [SCRIPT, "--version"]),
           ("meshscope --help", [SCRIPT, "--help"])]
    for name in sorted(main.every_command):
        out.append((f"meshscope {name} --help", [SCRIPT, name, "--help"]))
    return out


def heavy_imports(argv: list[str]) -> list[str]:
    """The packages of ``HEAVY`` that the command imported (``-X importtime``)."""
    cmd = [PYTHON, "-X", "importtime", *argv] if argv[0] == SCRIPT else \
        [argv[0], "-X", "importtime", *argv[1:]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    found = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            top = line.rsplit("|", 1)[1].strip().split(".")[0]
            if top in HEAVY:
                found.add(top)
    return sorted(found)


def run(n: int) -> list[dict]:
    cmds = commands()
    times: dict[str, list[float]] = {label: [] for label, _ in cmds}
    for i in range(n):
        for label, argv in cmds:
            times[label].append(measure(argv).wall_s)
        print(f"  round {i + 1}/{n}", file=sys.stderr)
    return [{"label": label, "median_s": statistics.median(times[label]),
             "best_s": min(times[label]), "imports": heavy_imports(argv)}
            for label, argv in cmds]


def table(rows: list[dict]) -> str:
    lines = ["| command | median | fastest | heavy libraries imported |",
             "|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| `{r['label']}` | {r['median_s']:.3f} s | {r['best_s']:.3f} s | "
                     f"{', '.join(r['imports']) or 'none'} |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> str:
    by = {r["label"]: r for r in rows}
    out = []
    for label in ("meshscope --help", "meshscope analyze --help"):
        r = by[label]
        ok = r["median_s"] < TARGET_S
        out.append(f"- `{label}` under {TARGET_S} s: {r['median_s']:.3f} s (median) — "
                   f"{'met' if ok else '**not met**'}")
    trainers = {"meshscope run --help", "meshscope demo --help", "meshscope bench-comm --help"}
    torch = [r["label"] for r in rows if "torch" in r["imports"] and r["label"] not in trainers]
    out.append("- commands that do not train import torch: " +
               (", ".join(f"`{t}`" for t in torch) + " — **not met**" if torch else
                "none — met"))
    dash = "dash" in by.get("meshscope analyze --help", {"imports": []})["imports"]
    out.append(f"- `analyze` imports Dash: {'yes — **not met**' if dash else 'no — met'}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=7, help="runs of each command (median reported)")
    ap.add_argument("--write", action="store_true", help="write the table into "
                                                         "docs/benchmarks.md")
    a = ap.parse_args()
    note = load_note()
    rows = run(a.n)
    section = "\n".join([
        HEADING, "",
        provenance(f".venv/bin/python bench/startup.py -n {a.n}", note), "",
        f"Each command in a fresh process, {a.n} runs, interleaved; wall time from the "
        f"launch of `.venv/bin/meshscope` to its exit. Heavy libraries: which of "
        f"{', '.join(HEAVY)} the command loaded (`-X importtime`).", "",
        table(rows), "", verdict(rows)])
    publish(HEADING, section, a.write)


if __name__ == "__main__":
    main()
