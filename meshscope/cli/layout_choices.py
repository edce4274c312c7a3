"""What ``sweep``, ``plan`` and ``compare`` take from the command line to describe layouts,
and the rates the planner assumes before anything is measured.

``choice_options`` are the flags that choose layouts (dimensions, schedules, microbatches…),
declared once for ``sweep`` and ``plan``; ``assumed_rates`` and ``baseline_model`` are the
compute rate and communication model a plan starts from (given by flags, a device's peak or a
measured baseline table), used by ``plan``, the sweep's ``plan.json`` and ``compare --from``.
"""
from __future__ import annotations

import os
import pathlib

import click

from meshscope.collectors.devices import lookup
from meshscope.layouts.plan import CPU_ASSUMED_FLOPS, CommModel, Rates

from .common import fail


def csv_values(text: str | None, cast=str) -> tuple:
    """``"a, b,c"`` → ``("a", "b", "c")``, each value through ``cast``; a clear error for a
    value ``cast`` refuses."""
    if not text:
        return ()
    try:
        return tuple(cast(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        fail(f"{text!r}: expected a comma-separated list")


def layouts_of(text: str | None) -> tuple[str, ...] | None:
    """``dp=2,pp=2;tp=4`` → ("dp=2,pp=2", "tp=4")."""
    if not text:
        return None
    return tuple(p.strip() for p in text.split(";") if p.strip()) or None


def model_overrides(layers, moe_experts, moe_top_k, moe_every) -> tuple:
    """The preset's fields the flags override, as sorted (field, value) pairs."""
    o = {"n_layers": layers, "moe_experts": moe_experts, "moe_top_k": moe_top_k,
         "moe_every": moe_every}
    return tuple(sorted((k, v) for k, v in o.items() if v is not None))


def choice_options(f):
    """The options that choose layouts, shared by ``sweep`` and ``plan``."""
    opts = [
        click.option("--dims", default="dp,tp,pp", show_default=True,
                     help="Dimensions to split the world over (any of dp, tp, pp, cp, ep)."),
        click.option("--layouts", default=None,
                     help="Exactly these layouts instead, separated by ';': "
                          "'dp=2,pp=2;tp=4'."),
        click.option("--schedules", default="1f1b", show_default=True,
                     help="Pipeline schedules to try (comma-separated) for layouts with pp>1."),
        click.option("--microbatches", default="4", show_default=True,
                     help="Microbatch counts to try (comma-separated)."),
        click.option("--global-batch", default=16, show_default=True, type=int,
                     help="Sequences per step over all data-parallel ranks."),
        click.option("--no-sp", is_flag=True, help="Tensor parallelism without sequence "
                                                   "parallelism."),
        click.option("--layers", type=int, default=None, help="Override the preset's layers."),
        click.option("--moe-experts", type=int, default=None),
        click.option("--moe-top-k", type=int, default=None),
        click.option("--moe-every", type=int, default=None),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def baseline_model(path: str | None):
    """``--baseline``'s measured collectives as the planner's communication model (None
    without the flag); a clear error for a file that is not one."""
    if not path:
        return None
    # Here, not above: a baseline is read with pandas (0.4 s), which a plan without one
    # never needs.
    from meshscope.analysis.comm import nccl_tests

    try:
        table = nccl_tests.read_baseline(pathlib.Path(path))
    except (OSError, ValueError) as e:
        fail(f"{path}: not a usable baseline ({e})")
    if table is None or table.empty:
        fail(f"{path}: no baseline rows")
    missing = [c for c in ("op", "n_ranks", "size_bytes", "time_us") if c not in table]
    if missing:
        fail(f"{path}: a baseline needs the column {missing[0]}")
    return CommModel.from_rows(table.itertuples(), source=f"baseline {path}")


def assumed_rates(tflops, peak_tflops, devices, device, bandwidth_gbps, latency_us):
    """Rates and comm model before calibration, and notes on what was assumed."""
    notes = []
    peak = peak_tflops * 1e12 if peak_tflops else None
    known = lookup(device) if device else None
    if device and not known:
        fail(f"--device {device!r}: not in the device table (collectors/devices.py); give "
             f"--tflops and --peak-tflops instead")
    if known and not peak:
        peak = known[0]
    gpu = bool(device or tflops or peak_tflops)
    if tflops:
        flops = tflops * 1e12
    elif peak:
        flops = 0.4 * peak
        notes.append(f"compute at 40% of the {peak / 1e12:g} TFLOP/s peak (assumed; "
                     f"--tflops sets the sustained rate)")
    else:
        flops = CPU_ASSUMED_FLOPS
        notes.append(f"CPU compute at an assumed {CPU_ASSUMED_FLOPS / 1e9:g} GFLOP/s per core, "
                     f"ranks sharing {devices or os.cpu_count()} cores (--tflops, --devices, "
                     f"or --from RUN to calibrate)")
    if not gpu and devices is None:
        devices = os.cpu_count()
    default_bw, default_lat = (100.0, 10.0) if gpu else (1.0, 50.0)
    comm = CommModel(alpha_us=latency_us if latency_us is not None else default_lat,
                     busbw_gbps=bandwidth_gbps or default_bw,
                     source="assumed" if not bandwidth_gbps else "--bandwidth-gbps")
    if not bandwidth_gbps:
        notes.append(f"communication at an assumed {comm.busbw_gbps:g} GB/s bus bandwidth and "
                     f"{comm.alpha_us:g} µs latency (--baseline or --bandwidth-gbps)")
    src = "given" if tflops else ("device peak" if peak else "assumed")
    return Rates(flops_per_s=flops, devices=devices, peak_flops=peak, source=src), comm, notes


