"""Benchmark: the plain-data unpickler (collectors/plain_pickle.py) on hostile pickles of 1, 10
and 100 MB — its time and peak memory against the file's size (issue 46, cases 2 and 3).

Usage (from the repository root):

    .venv/bin/python bench/pickle_bounds.py [--sizes 1,10,100] [--kinds KIND,...]
                                            [--code PATH] [--timeout SECONDS]

For each kind and size a pickle is written into a temporary folder, then loaded by
``meshscope.collectors.plain_pickle.loads`` in a fresh process (``python -c``) that reports
the load's wall time; its peak RSS is the process' ``VmHWM`` (the interpreter, the file's bytes
and whatever the loader built; ``getrusage``'s ``ru_maxrss`` would count what this process held
when it started the child), watched every 50 ms too. A row that runs past ``--timeout`` is
stopped, its peak as last seen. The kinds, each shaped as PyTorch's files are (a dict at the
top, the hostile part under one key):

- ``collisions``: a Flight Recorder dump whose ``pg_status`` has int keys ``i*(2**61-1)``, which
  all hash alike: Python's unpickler builds the dict in quadratic time;
- ``small-objects``: a snapshot whose ``segments`` are empty dicts, one byte each (5,000,000
  in 5 MB): Python's unpickler builds them all, ~230 bytes of memory per byte of file;
- ``deep-nesting``: a list nested once per two bytes (``]]]…aaa``);
- ``huge-int``: one integer (``LONG4``) as long as the file;
- ``ordinary``: a plain snapshot-like document (segments, blocks, frames, a trace), as
  ``pickle.dumps`` writes it — accepted; ``ordinary/pickle.loads`` loads the same file with
  Python's own unpickler, for the speed ratio.

``--code PATH`` puts PATH first on ``sys.path`` in the measuring process, so that the same
script measures another checkout's loader (``--code /work/base --sizes 1,10``: the loader
before the bounds; its 100 MB rows would take hours). The bound the loader keeps is printed
beside each row: 20 × the file's size + 200 MB.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import random
import struct
import subprocess
import sys
import tempfile
import time

MB = 1_000_000
KINDS = ("collisions", "small-objects", "deep-nesting", "huge-int", "ordinary",
         "ordinary/pickle.loads")

CHILD = r'''
import json, sys, time
code, path, loader = sys.argv[1], sys.argv[2], sys.argv[3]
if code:
    sys.path.insert(0, code)
import pickle
from meshscope.collectors import plain_pickle
raw = open(path, "rb").read()
t0 = time.perf_counter()
try:
    obj = (pickle.loads if loader == "pickle" else plain_pickle.loads)(raw)
    outcome = "accepted"
except plain_pickle.UnsafePickleError as e:
    outcome = "refused: " + str(e)
except RecursionError as e:
    outcome = "crashed: RecursionError"
seconds = time.perf_counter() - t0
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")]
print(json.dumps({"seconds": seconds, "outcome": outcome, "hwm": hwm[0],
                  "module": plain_pickle.__file__}), flush=True)
'''


def _header(key: str) -> bytes:
    """``{key: `` of a protocol-4 pickle: the hostile value follows, then ``_footer``."""
    k = key.encode()
    return b"\x80\x04}(\x8c" + bytes([len(k)]) + k


_FOOTER = b"u."


def collisions(size: int) -> bytes:
    """A Flight Recorder dump: {"version": "2.10", "pg_status": {i*(2**61-1): 1, …}}, the
    keys in one SETITEMS (as PyTorch's own pickler writes a dict)."""
    head = b"\x80\x04}(\x8c\x07version\x8c\x042.10\x8c\tpg_status}("
    parts, total, i = [head], len(head) + 4, 0
    while total < size:
        enc = pickle.encode_long(i * (2 ** 61 - 1))
        item = b"\x8a" + bytes([len(enc)]) + enc + b"K\x01"
        parts.append(item)
        total += len(item)
        i += 1
    parts.append(b"uu.")
    return b"".join(parts)


def small_objects(size: int) -> bytes:
    n = size - len(_header("segments")) - 4
    return _header("segments") + b"](" + b"}" * n + b"e" + _FOOTER


def deep_nesting(size: int) -> bytes:
    n = (size - len(_header("segments")) - 2) // 2
    return _header("segments") + b"]" * n + b"a" * (n - 1) + _FOOTER


def huge_int(size: int) -> bytes:
    n = size - len(_header("segments")) - 7
    return _header("segments") + b"\x8b" + struct.pack("<i", n) + b"\x11" * n + _FOOTER


def ordinary(size: int) -> bytes:
    """A plain snapshot-like document of about ``size`` bytes, as ``pickle.dumps`` writes it:
    segments of 8 blocks, a trace entry per block, each with 12 stack frames of its own."""
    rnd = random.Random(1)
    files = [f"/src/model/layer{i}.py" for i in range(50)]
    names = [f"forward_{i}" for i in range(80)]

    def frames():
        return [{"filename": rnd.choice(files), "line": rnd.randint(1, 2000),
                 "name": rnd.choice(names)} for _ in range(12)]

    n = max(1, size // 4300)                        # ~4.3 kB of pickle a segment
    segments, trace, addr = [], [], 1 << 40
    for _ in range(n):
        blocks = []
        for _ in range(8):
            blocks.append({"address": addr, "size": 1 << 20, "requested_size": (1 << 20) - 17,
                           "state": "active_allocated", "frames": frames()})
            trace.append({"action": "alloc", "addr": addr, "size": 1 << 20, "stream": 0,
                          "time_us": 10 ** 15 + len(trace), "frames": frames()})
            addr += 1 << 20
        segments.append({"device": 0, "address": addr, "total_size": 8 << 20, "stream": 0,
                         "segment_type": "large", "segment_pool_id": (0, 0),
                         "allocated_size": 8 << 20, "active_size": 8 << 20, "blocks": blocks})
    return pickle.dumps({"segments": segments, "device_traces": [trace],
                         "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}})


MAKERS = {"collisions": collisions, "small-objects": small_objects,
          "deep-nesting": deep_nesting, "huge-int": huge_int, "ordinary": ordinary,
          "ordinary/pickle.loads": ordinary}


def _hwm(pid: int) -> int:
    """The peak RSS of process ``pid`` so far (``VmHWM``: its own, not what a parent had when
    it forked, which ``ru_maxrss`` counts); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM")), 0)
    except OSError:
        return 0


def measure(path: pathlib.Path, code: str, loader: str, timeout: float) -> dict:
    """Load ``path`` in a fresh process; its wall time, peak RSS and outcome. The peak is
    watched every 50 ms as well, for a process stopped at the timeout."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, code, str(path), loader],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak, stopped = 0, False
    while proc.poll() is None:
        peak = max(peak, _hwm(proc.pid))
        if time.perf_counter() - t0 > timeout:
            peak = max(peak, _hwm(proc.pid))
            proc.kill()
            proc.wait()
            stopped = True
            break
        time.sleep(0.05)
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    row = {"hwm": peak}
    if stopped:
        row.update(seconds=None, outcome=f"stopped after {timeout:.0f} s (still loading)")
    elif proc.returncode != 0 or not out.strip():
        last = (err.strip().splitlines() or ["?"])[-1]
        row.update(seconds=None, outcome=f"exit {proc.returncode}: {last[:80]}")
    else:
        row.update(json.loads(out.strip().splitlines()[-1]))
        row["hwm"] = max(peak, row["hwm"])
    return row


def _said(outcome: str, width: int = 100) -> str:
    """The outcome, without the loader's generic preamble, cut to ``width``."""
    preamble = "refused: not a plain-data pickle ("
    text = "refused: " + outcome[len(preamble):-1] if outcome.startswith(preamble) else outcome
    return text if len(text) <= width else text[:width - 1] + "…"


def _size(n: float) -> str:
    return f"{n / MB:,.1f} MB" if n < 10 ** 9 else f"{n / 10 ** 9:,.2f} GB"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,10,100", help="file sizes in MB (default 1,10,100)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    p.add_argument("--code", default="", help="a checkout to measure instead of this one")
    p.add_argument("--timeout", type=float, default=600, help="seconds a row may take")
    args = p.parse_args(argv)
    sizes = [int(float(s) * MB) for s in args.sizes.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in MAKERS:
            p.error(f"unknown kind {k!r} (of {', '.join(KINDS)})")
    code = str(pathlib.Path(args.code).resolve()) if args.code else ""
    print(f"loader: {code or pathlib.Path(__file__).resolve().parents[1]}  "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    print(f"{'kind':<22} {'size':>9} {'time':>9} {'peak RSS':>10} {'bound':>10}  outcome")
    with tempfile.TemporaryDirectory(prefix="pickle-bounds-") as tmp:
        for kind in kinds:
            for size in sizes:
                path = pathlib.Path(tmp) / f"{kind.replace('/', '-')}-{size}.pickle"
                if not path.exists():
                    made = pathlib.Path(tmp) / f"{kind.split('/')[0]}-{size}.pickle"
                    if not made.exists():
                        made.write_bytes(MAKERS[kind](size))
                    path = made
                loader = "pickle" if kind.endswith("pickle.loads") else "plain"
                row = measure(path, code, loader, args.timeout)
                real = path.stat().st_size
                bound = 20 * real + 200 * 2 ** 20
                took = "-" if row["seconds"] is None else f"{row['seconds']:.2f} s"
                print(f"{kind:<22} {_size(real):>9} {took:>9} {_size(row['hwm']):>10} "
                      f"{_size(bound):>10}  {_said(row['outcome'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
