"""The cases of issue 46's probe of hostile and damaged input, each run as a user (or a hostile
file) would: the command, its exit code, the first line it printed on stderr, its wall time,
its peak RSS, and what it left (a user's file kept or replaced, processes or temporary folders
left behind). docs/security.md holds the table this prints for the code before and after.

    python bench/hostile_probe.py                   # this checkout
    python bench/hostile_probe.py --code /path/old  # another checkout's code, same cases

Every file is built in a temporary folder and removed after; nothing outside it is touched.
The pickle cases of the same issue (colliding keys, many small objects, nesting, huge ints at
1, 10 and 100 MB) are bench/pickle_bounds.py's.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "dp2-pp2-1f1b"
MIB = 1 << 20


def _hand_made_snapshot() -> dict:
    """A small memory snapshot: one segment of 4 MiB with a 1 MiB block (the shape
    torch.cuda.memory._snapshot() writes)."""
    block = {"size": MIB, "requested_size": MIB, "state": "active_allocated",
             "address": 1 << 30, "frames": [{"filename": "train.py", "line": 7, "name": "f"}]}
    free = {"size": 3 * MIB, "state": "inactive", "address": (1 << 30) + MIB, "frames": []}
    return {"segments": [{"device": 0, "address": 1 << 30, "total_size": 4 * MIB,
                          "stream": 0, "segment_type": "large", "allocated_size": MIB,
                          "active_size": MIB, "blocks": [block, free]}],
            "device_traces": [[]]}


class Probe:
    def __init__(self, code: pathlib.Path, tmp: pathlib.Path):
        self.code, self.tmp = code, tmp
        self.rows: list[tuple] = []

    def env(self) -> dict:
        return {**os.environ, "PYTHONPATH": str(self.code), "OMP_NUM_THREADS": "1"}

    def run(self, *args, cwd=None, timeout=600):
        """(exit code, stdout, stderr, wall s, peak RSS MB of the command's largest process)."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "meshscope", *map(str, args)],
                              cwd=cwd or self.tmp, env=self.env(), capture_output=True,
                              text=True, timeout=timeout)
        wall = time.monotonic() - t0
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        # ru_maxrss of the children is the largest so far: a smaller command shows the earlier
        # maximum, so it is given only when this command raised it.
        rss = f"{peak / 1024:.0f}" if peak > before else f"≤{before / 1024:.0f}"
        return proc.returncode, proc.stdout, proc.stderr, wall, rss

    def row(self, case: str, command: str, result, left: str = "") -> None:
        code, _, err, wall, rss = result
        first = next((ln for ln in err.splitlines() if ln.strip()), "")
        if "Traceback" in err:
            first = "TRACEBACK: " + err.strip().splitlines()[-1]
        self.rows.append((case, command, code, first[:150], f"{wall:.1f}", rss, left))

    def run_copy(self, name: str) -> pathlib.Path:
        dest = self.tmp / name
        shutil.copytree(SAMPLE, dest, ignore=shutil.ignore_patterns("report"))
        return dest


def case_1(p: Probe) -> None:
    run = p.run_copy("run1")
    mine = p.tmp / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"my": "precious"}')
    (mine / "notes.txt").write_text("mine")
    r = p.run("analyze", run, "--out", mine)
    kept = (mine / "summary.json").read_text() == '{"my": "precious"}'
    p.row("1 user's summary.json", "analyze RUN --out DIR(their summary.json, notes.txt)", r,
          f"their summary.json {'kept' if kept else 'REPLACED'}; "
          f"{len(list(mine.iterdir()))} entries in DIR")
    home = p.tmp / "home"
    (home / ".cache" / "pip").mkdir(parents=True)
    (home / "Documents").mkdir()
    (home / ".bashrc").write_text("")
    r = p.run("analyze", run, "--out", home)
    p.row("1 home-like folder", "analyze RUN --out HOME(.cache/pip, Documents, .bashrc)", r,
          f"{len(list(home.iterdir()))} entries in HOME")


def case_4_and_8(p: Probe) -> None:
    run = p.run_copy("run4")
    snap = p.tmp / "rank3.pickle"
    snap.write_bytes(pickle.dumps(_hand_made_snapshot()))
    r = p.run("analyze", run, "--snapshot", snap, "--out", p.tmp / "out4")
    p.row("4 --snapshot", "analyze RUN --snapshot rank3.pickle", r)
    r = p.run("compare", run, run, "--snapshot", snap)
    p.row("4 --snapshot", "compare RUN RUN --snapshot rank3.pickle", r)
    r = p.run("analyze", snap)
    p.row("8 snapshot alone", "analyze rank3.pickle", r,
          "report in rank3.pickle.report" if (p.tmp / "rank3.pickle.report").is_dir() else "")


def case_5(p: Probe, timings: list[float]) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.synth import make_run

    run = make_run(p.tmp / "synth5", ranks=4, steps=3, events_per_step=60000)
    import psutil
    left, seen = 0, 0
    t_all = time.monotonic()
    for t in timings:
        out = p.tmp / "out5"
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.Popen([sys.executable, "-m", "meshscope", "analyze", str(run),
                                 "--no-cache", "--out", str(out)], env=p.env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(t)
        try:
            kids = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            kids = []
        seen += len(kids)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(1.0)
        alive = [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
        left += len(alive)
        for k in alive:
            k.kill()
    p.rows.append(("5 kill -9 during ingest", f"analyze (4 ranks), SIGKILL at {len(timings)} "
                   f"timings {timings[0]}–{timings[-1]} s", "-", "", f"{time.monotonic() - t_all:.1f}",
                   "-", f"{seen} workers seen, {left} left alive"))


def case_6(p: Probe) -> None:
    doc = _hand_made_snapshot()
    doc["segments"][0]["blocks"][0]["size"] = 2 ** 70
    snap = p.tmp / "huge.pickle"
    snap.write_bytes(pickle.dumps(doc))
    out = p.tmp / "out6"
    r = p.run("analyze", snap, "--out", out)
    left = sorted(x.name for x in p.tmp.glob(".out6.*"))
    p.row("6 size 2**70", "analyze huge.pickle --out DIR", r,
          f"leftovers: {left or 'none'}; DIR {'written' if out.exists() else 'absent'}")


def case_7(p: Probe, n: int, rounds: int) -> None:
    run = p.run_copy("run7")
    failed, total, t0 = 0, 0, time.monotonic()
    first = ""
    for _ in range(rounds):
        shutil.rmtree(run / "report", ignore_errors=True)
        procs = [subprocess.Popen([sys.executable, "-m", "meshscope", "analyze", str(run)],
                                  env=p.env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for _ in range(n)]
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            total += 1
            if proc.returncode != 0:
                failed += 1
                first = first or err.strip().splitlines()[-1][:150]
    tmp_left = [x.name for x in (run / "report" / ".cache").glob(".tmp-*")] \
        if (run / "report" / ".cache").is_dir() else []
    p.rows.append(("7 concurrent analyze", f"{rounds} rounds of {n} concurrent analyze RUN",
                   f"{failed}/{total} failed", first, f"{time.monotonic() - t0:.1f}", "-",
                   f".tmp-* left: {len(tmp_left)}"))


def case_9(p: Probe, mb: int) -> None:
    import gzip

    folder = p.tmp / "plain9"
    folder.mkdir()
    text = gzip.decompress((SAMPLE / "traces" / "rank0.json.gz").read_bytes())
    head, tail = text.rsplit(b"]", 1)
    with open(folder / "rank0.pt.trace.json", "wb") as f:
        f.write(head)
        chunk = b" " * MIB
        for _ in range(mb):
            f.write(chunk)
        f.write(b"]" + tail)
    r = p.run("analyze", folder, "--out", p.tmp / "out9")
    p.row("9 uncompressed", f"analyze (one trace + {mb} MiB of white space, .json)", r)
    shutil.rmtree(folder)


def case_11(p: Probe) -> None:
    samples = ROOT / "samples"
    hollow = p.tmp / "hollow"
    hollow.mkdir()
    (hollow / "summary.json").write_text('{"schema_version": 99}')
    r = p.run("compare", samples / "dp4-ddp", hollow)
    p.row("11 hollow report", "compare RUN DIR({\"schema_version\": 99})", r,
          r[1].splitlines()[2][:80] if r[0] == 0 and len(r[1].splitlines()) > 2 else "")
    target = p.tmp / "theirs.txt"
    target.write_text("keep me")
    (p.tmp / "j.xml").symlink_to(target)
    r = p.run("compare", samples / "dp4-ddp", samples / "dp2-pp2-1f1b", "--fail-if",
              "step_time>+1000%", "--junit", p.tmp / "j.xml")
    p.row("11 --junit onto a link", "compare A B --junit LINK", r,
          "link target " + ("kept" if target.read_text() == "keep me" else "OVERWRITTEN"))
    r = p.run("compare", samples / "dp4-ddp", samples / "dp2-pp2-1f1b", "--fail-if",
              "exposed_comm.pp>+10%")
    p.row("11 relative to 0", "compare dp4-ddp dp2-pp2-1f1b --fail-if exposed_comm.pp>+10%", r)
    r = p.run("compare", samples / "dp4-ddp", samples / "dp4-ddp", "--fail-if",
              "step_time>\u22125%")
    p.row("11 Unicode minus", "compare A A --fail-if 'step_time>\u22125%'", r)
    r = p.run("compare", samples / "dp4-ddp", samples / "dp2-pp2-1f1b" / "report")
    p.row("11 B/report", "compare A B/report", r, r[1].splitlines()[0] if r[1] else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=pathlib.Path, default=ROOT,
                    help="the checkout whose code runs (default: this one)")
    ap.add_argument("--kill-timings", type=int, default=20)
    ap.add_argument("--concurrent", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--whitespace-mb", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        p = Probe(args.code.resolve(), pathlib.Path(tmp))
        case_1(p)
        case_4_and_8(p)
        case_5(p, [round(0.3 + 0.15 * i, 2) for i in range(args.kill_timings)])
        case_6(p)
        case_7(p, args.concurrent, args.rounds)
        case_9(p, args.whitespace_mb)
        case_11(p)
    print(f"code: {args.code}")
    print("| case | command | exit | stderr, first line | s | peak RSS MB | left |")
    print("|---|---|---|---|---:|---:|---|")
    for r in p.rows:
        print("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |")
    print(json.dumps({"rows": p.rows}), file=sys.stderr)


if __name__ == "__main__":
    main()
