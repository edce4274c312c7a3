"""The checks of ``bench/gpu_check.sh``: what a CUDA run of the runner and its analysis say, set
beside an independent reading of the same files.

    .venv/bin/python bench/gpu_report.py machine [--cpu]   # torch, CUDA, device, peak; a preset
    .venv/bin/python bench/gpu_report.py check RUN         # after `run` and `analyze`

``check`` reads RUN/report/summary.json (written by ``meshscope analyze``) and prints:

1. **overlap against HTA** — Holistic Trace Analysis loads the same traces;
   its ``get_comm_comp_overlap`` per rank against meshscope's whole-trace ``overlap_pct``
   (agreement within 1 percentage point, as tests/test_hta_agreement.py asks of recorded
   traces), and its ``get_temporal_breakdown`` compute time against meshscope's (within 5%:
   on the shared corpus's GPU traces they differ by 0-2.3%, the most where compute kernels of
   several streams overlap).
   Where there is no communication (one GPU) the overlap is undefined on both sides and only
   the compute time is compared; on CPU traces HTA finds no kernels and the step says so;
2. **tokens/s and MFU** — the report's throughput (median over the steps after warm-up) and the
   peak it used, beside the device table's entry for this device (``collectors/devices.py``);
   on CUDA an MFU must come out;
3. **step timers against the trace** — per rank and profiled step, the step timer's wall time
   (CUDA events on a GPU) against the trace's ``ProfilerStep#N`` span; the median relative
   difference must stay within 5%;
4. **memory against the allocator's own peak** (CUDA only) — per rank and profiled step, the
   report's peak allocated (the largest ``Total Allocated`` of the trace's ``[memory]`` events
   in the step, ``memory_steps.parquet``) against the step timer's ``peak_memory_bytes``
   (``torch.cuda.max_memory_allocated``, reset at every step's end): within 1% — both are the
   caching allocator's counter, the timer's window the step timer's (from the previous step's
   end); and each rank's memory snapshot (``--memory-snapshot``) read into the report.

Each check passes, fails, or does not apply (HTA on CPU traces); the exit code is the number
of checks that failed.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import pathlib
import shutil
import statistics
import sys
import tempfile
import warnings

OVERLAP_TOLERANCE_PP = 1.0
COMPUTE_TOLERANCE = 0.05   # recorded corpus traces: 0%, 0% and 2.3% (several streams)
TIMER_TOLERANCE = 0.05
# Bytes of GPU memory per parameter a preset needs to train here (fp32 weights, gradients and
# AdamW's two moments: 16 B) with room for activations: a preset is taken when it fits twice.
BYTES_PER_PARAM = 16


def machine(cpu: bool) -> int:
    """Print what the run will use; the chosen preset and layout on the last line as
    ``preset=NAME layout=LAYOUT global_batch=N``. Exit code 3 when CUDA was asked for and is
    not there."""
    import torch

    from meshscope.collectors.devices import lookup
    from meshscope.parallel.config import PRESETS

    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, "
          f"cuda available: {torch.cuda.is_available()}")
    if cpu:
        print("mode: CPU fallback (gloo, 2 ranks, the tiny preset)")
        print("preset=tiny layout=dp=2 global_batch=16")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: run with --cpu for the CPU fallback", file=sys.stderr)
        return 3
    n = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    peak = lookup(props.name)
    print(f"{n} × {props.name}, {props.total_memory / 2**30:.0f} GiB each; device table: "
          + (f"{peak[0] / 1e12:.0f} TFLOP/s bf16 dense, {peak[1] / 1e12:.2f} TB/s"
             if peak else "not listed (MFU needs --peak-tflops)"))
    fits = [(cfg.n_params(), name) for name, cfg in PRESETS.items()
            if 2 * BYTES_PER_PARAM * cfg.n_params() < props.total_memory]
    _, preset = max(fits)
    # One rank per GPU: NCCL refuses two ranks of one communicator on the same device
    # ("Duplicate GPU detected"), so one GPU means world size 1 and no collectives.
    print(f"preset {preset} ({PRESETS[preset].n_params() / 1e6:.0f} M parameters), the largest "
          f"that fits; {n} rank(s), one per GPU")
    print(f"preset={preset} layout=dp={n} global_batch={8 * n}")
    return 0


def _hta(traces: pathlib.Path):
    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore", RuntimeWarning)   # HTA divides 0 by 0 without kernels
    with tempfile.TemporaryDirectory(prefix="meshscope-hta-") as tmp:
        for f in traces.iterdir():
            shutil.copy(f, pathlib.Path(tmp) / f.name)
        analysis = TraceAnalysis(trace_dir=tmp)
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        try:
            breakdown = analysis.get_temporal_breakdown(visualize=False)
        except (IndexError, KeyError, ValueError):   # HTA finds no kernels (a CPU trace)
            breakdown = None
    return overlap, breakdown


def check_overlap(run: pathlib.Path, summary: dict) -> bool | None:
    print("\n== 1. overlap and compute time against HTA (same traces) ==")
    ours = {r["rank"]: r for r in summary["trace_overlap"]}
    overlap, breakdown = _hta(run / "traces")
    if summary["device"] != "gpu":
        print("  CPU traces: HTA reads GPU kernels only (its overlap is "
              f"{overlap['comp_comm_overlap_pctg'].tolist()}): does not apply — run on a GPU")
        return None
    ok = True
    theirs = dict(zip(overlap["rank"], overlap["comp_comm_overlap_pctg"]))
    compute = dict(zip(breakdown["rank"], breakdown["compute_time(us)"])) \
        if breakdown is not None else {}
    print(f"  {'rank':>4} {'meshscope %':>12} {'HTA %':>8} {'compute us':>12} {'HTA us':>12}")
    for rank, row in sorted(ours.items()):
        hta_pct, hta_compute = theirs.get(rank, math.nan), compute.get(rank, math.nan)
        print(f"  {rank:>4} {row['overlap_pct']:>12.2f} {hta_pct:>8.2f} "
              f"{row['compute_us']:>12.0f} {hta_compute:>12.0f}")
        if row["comm_us"] > 0:
            ok &= abs(row["overlap_pct"] - hta_pct) <= OVERLAP_TOLERANCE_PP
        ok &= abs(row["compute_us"] - hta_compute) <= COMPUTE_TOLERANCE * hta_compute
    if not any(r["comm_us"] > 0 for r in ours.values()):
        print("  no communication (one rank): overlap undefined on both sides; compute compared")
    print(f"  {'agree' if ok else 'DISAGREE'} (overlap within {OVERLAP_TOLERANCE_PP} pp, "
          f"compute within {COMPUTE_TOLERANCE:.0%})")
    return ok


def check_throughput(run: pathlib.Path, summary: dict) -> bool:
    from meshscope.collectors.devices import lookup

    print("\n== 2. tokens/s and MFU ==")
    desc = json.loads((run / "run.json").read_text())
    device = desc["device"]
    t = summary["throughput"]
    table = lookup(device["name"])
    used = f"{device['peak_flops'] / 1e12:.0f} TFLOP/s from {device['peak_source']}" \
        if device["peak_flops"] else "none"
    print(f"  device {device['name']} ({device['type']}, {device['backend']}); peak used: "
          f"{used}; device table: {f'{table[0] / 1e12:.0f} TFLOP/s' if table else 'not listed'}")
    mfu = t["mfu_pct"]
    print(f"  steps {t['steps']}: step {t['step_time_us'] / 1000:.1f} ms, "
          f"{t['tokens_per_s']:,.0f} tokens/s, MFU "
          f"{f'{mfu:.2f}%' if mfu is not None else 'unknown (no peak for this device)'}")
    print(f"  model {desc['model']['preset']}: {desc['model']['n_params'] / 1e6:.3g} M "
          f"parameters, {desc['model']['flops_per_token'] / 1e6:.4g} MFLOP per token")
    ok = device["type"] != "cuda" or (mfu is not None and 0 < mfu < 100)
    print(f"  {'ok' if ok else 'FAILED: no MFU on a CUDA device'}")
    return ok


def _profiler_steps(trace: pathlib.Path) -> dict[int, float]:
    data = json.loads(gzip.decompress(trace.read_bytes()))
    out = {}
    for e in data["traceEvents"]:
        name = e.get("name", "")
        if e.get("ph") == "X" and name.startswith("ProfilerStep#"):
            out[int(name.split("#")[1])] = float(e["dur"])
    return out


def check_timers(run: pathlib.Path) -> bool:
    import pyarrow.parquet as pq

    print("\n== 3. step timers against the trace (ProfilerStep#N) ==")
    diffs = []
    print(f"  {'rank':>4} {'step':>4} {'timer ms':>10} {'trace ms':>10} {'diff':>7}")
    for trace in sorted((run / "traces").glob("rank*.json.gz")):
        rank = int(trace.name[4:].split(".")[0])
        spans = _profiler_steps(trace)
        timers = pq.read_table(run / "steps" / f"rank{rank}.parquet").to_pylist()
        for row in timers:
            if row["step"] in spans:
                d = row["wall_time_us"] / spans[row["step"]] - 1
                diffs.append(abs(d))
                print(f"  {rank:>4} {row['step']:>4} {row['wall_time_us'] / 1000:>10.2f} "
                      f"{spans[row['step']] / 1000:>10.2f} {d:>+7.1%}")
    ok = bool(diffs) and statistics.median(diffs) <= TIMER_TOLERANCE
    print(f"  median |difference| {statistics.median(diffs) if diffs else math.nan:.1%}: "
          f"{'agree' if ok else 'DISAGREE'} (within {TIMER_TOLERANCE:.0%})")
    return ok


MEMORY_TOLERANCE = 0.01


def check_memory(run: pathlib.Path, summary: dict) -> bool | None:
    import pandas as pd
    import pyarrow.parquet as pq

    print("\n== 4. memory against the allocator's own peak (torch.cuda.max_memory_allocated) ==")
    if summary.get("device") != "gpu":
        print("  a CPU run: the CPU allocator's totals count only what the profiler saw, and the "
              "step timer holds the process's peak resident set: does not apply")
        return None
    steps = pd.read_parquet(run / "report" / "memory_steps.parquet")
    steps = steps[steps["device"] != "cpu"]
    diffs = []
    print(f"  {'rank':>4} {'step':>4} {'trace MiB':>10} {'timer MiB':>10} {'diff':>7}")
    for f in sorted((run / "steps").glob("rank*.parquet")):
        rank = int(f.name[4:].split(".")[0])
        timer = {r["step"]: r["peak_memory_bytes"] for r in pq.read_table(f).to_pylist()}
        for row in steps[steps["rank"] == rank].itertuples():
            if timer.get(row.step):
                d = row.peak_allocated_bytes / timer[row.step] - 1
                diffs.append(abs(d))
                print(f"  {rank:>4} {row.step:>4} {row.peak_allocated_bytes / 2**20:>10.1f} "
                      f"{timer[row.step] / 2**20:>10.1f} {d:>+7.2%}")
    snaps = {s["rank"] for s in summary.get("memory", {}).get("snapshots", [])}
    ranks = set(summary.get("ranks", []))
    ok = bool(diffs) and max(diffs) <= MEMORY_TOLERANCE and ranks <= snaps
    print(f"  largest |difference| {max(diffs) if diffs else math.nan:.2%} (within "
          f"{MEMORY_TOLERANCE:.0%}); snapshots read for ranks {sorted(snaps)} of "
          f"{sorted(ranks)}: {'agree' if ok else 'DISAGREE'}")
    return ok


def check(run: pathlib.Path) -> int:
    summary = json.loads((run / "report" / "summary.json").read_text())
    if summary["problems"]:
        print("analysis problems:", *summary["problems"], sep="\n  ")
    results = [check_overlap(run, summary), check_throughput(run, summary), check_timers(run),
               check_memory(run, summary)]
    failed = results.count(False)
    print(f"\nchecks: {results.count(True)} passed, {failed} failed, {results.count(None)} "
          f"did not apply")
    return failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("machine")
    m.add_argument("--cpu", action="store_true")
    c = sub.add_parser("check")
    c.add_argument("run", type=pathlib.Path)
    a = ap.parse_args()
    raise SystemExit(machine(a.cpu) if a.what == "machine" else check(a.run))


if __name__ == "__main__":
    main()
