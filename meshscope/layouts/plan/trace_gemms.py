"""The GEMMs and kernel launches of anyone's Kineto trace, for ``plan --from TRACE`` and the
GEMMs term of ``compare --detail`` (``layouts/job_vs_plan.py``).

One reading of a trace's matrix products: the analysis' own (``analysis/gpu/kernels.py``:
``gemm_table``, the report's ``gemms`` table, with ``gemm_shape`` for each product's M, N, K).
A trace file is read by the analysis' ingest and ``gemm_table`` runs over its device events —
the whole trace, where the report's table keeps the profiled steps' windows (on the corpus'
H100 trace they hold the same 168 products); a report's table is read as it is
(``gemms_of_table``). From it:

- each 16-bit GEMM's M, N, K and its kernels' time on the GPU — every device operation its
  operator launched, by correlation, the memsets cuBLAS issues before a split-K product among
  them: the achieved GEMM rate, held against what the device's curve expects at the same
  shapes (``gemm_rate_factor``), the factor the plan's GEMM curves are scaled by;
- the host's time per kernel launch (``cudaLaunchKernel`` and its variants): measured and
  reported; the planner has no host-launch term it could replace with it (yet).

Only 16-bit GEMMs are counted (they calibrate the bf16 curve the plan's bf16 GEMMs run on).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import TYPE_CHECKING

from .devices import DeviceSpec

if TYPE_CHECKING:
    import pandas as pd

LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "hipLaunchKernel", "hipExtModuleLaunchKernel"}
SIXTEEN_BIT = {"c10::BFloat16", "c10::Half"}


class TraceError(ValueError):
    """A trace the calibration cannot read; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class TraceGemm:
    m: int
    n: int
    k: int
    count: int          # products of this shape: calls × batch
    kernel_us: float    # their kernels' time on the GPU
    calls: int = 1      # operator calls

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclasses.dataclass(frozen=True)
class TraceMeasures:
    """What ``read_trace`` measured in one trace."""
    path: str
    device_name: str | None
    gemms: tuple[TraceGemm, ...]
    launches: int
    launch_host_us: float           # mean host time of a kernel launch call

    @property
    def gemm_kernel_us(self) -> float:
        return sum(g.kernel_us for g in self.gemms)

    @property
    def gemm_flops(self) -> float:
        return sum(g.flops for g in self.gemms)

    @property
    def gemm_calls(self) -> int:
        return sum(g.calls for g in self.gemms)


def gemms_of_table(table: pd.DataFrame) -> tuple[TraceGemm, ...]:
    """The 16-bit rows of a ``gemm_table`` (the report's ``gemms`` table, or one made here
    from a trace) as ``TraceGemm``: each row's shape from its op and ``shapes``
    (``kernels.gemm_shape``), its calls and kernel time."""
    # the analysis (pandas, the trace reader) loads when a trace or table is read, not with
    # the CLI (``meshscope --help`` imports plan's inputs)
    from meshscope.analysis.gpu import kernels

    out = []
    for op, shapes, dtype, calls, kernel_us in zip(table["op"], table["shapes"],
                                                   table["dtype"], table["calls"],
                                                   table["kernel_us"]):
        if dtype not in SIXTEEN_BIT:
            continue
        shape = kernels.gemm_shape(op, json.loads(shapes))
        if shape is None:
            continue
        m, n, k, batch = shape
        out.append(TraceGemm(m, n, k, int(calls) * batch, float(kernel_us), int(calls)))
    return tuple(out)


def read_trace(path: pathlib.Path) -> TraceMeasures:
    """The 16-bit GEMMs with their kernel time (the report's ``gemm_table`` over the whole
    trace), and the launches' host time, of a trace file."""
    from meshscope.analysis.errors import InputError
    from meshscope.analysis.gpu import host_activity, kernels
    from meshscope.analysis.ingest.events import load_trace
    from meshscope.analysis.report.rank_work import device_name

    try:
        trace = load_trace(pathlib.Path(path))
    except InputError as e:
        raise TraceError(f"{path}: not a readable Kineto trace ({e})") from e
    ev = trace.events
    device = ev["device"].to_numpy()
    dev, host = ev[device], ev[~device]
    runtime = host_activity.runtime_calls(host)
    table = kernels.gemm_table(trace.rank, host[host["name"].isin(kernels.GEMM_OPS)], dev,
                               runtime[["lane", "ts_us", "end_us", "correlation"]],
                               device_name(trace.meta))
    launches = runtime[runtime["name"].isin(LAUNCHES)]
    launch_us = launches["end_us"] - launches["ts_us"]
    return TraceMeasures(path=str(path), device_name=device_name(trace.meta),
                         gemms=gemms_of_table(table), launches=len(launch_us),
                         launch_host_us=float(launch_us.mean()) if len(launch_us) else 0.0)


def expected_gemm_us(gemms: tuple[TraceGemm, ...], dev: DeviceSpec) -> float:
    """What the device's bf16 curve expects the GEMMs to take, at their shapes."""
    curve, peak = dev.curve("bf16"), dev.peak_flops["bf16"]
    return sum(curve.time_us(g.m, g.n, g.k, peak) * g.count for g in gemms)


def gemm_rate_factor(t: TraceMeasures, dev: DeviceSpec) -> tuple[float, float, float]:
    """(the factor the device's GEMM curves are scaled by, the measured efficiency, the
    curve's at the same GEMMs): the bf16 curve's time for the trace's GEMMs, at their shapes,
    over the time their kernels took. Raises TraceError without 16-bit GEMMs."""
    if not t.gemms:
        raise TraceError(f"{t.path}: no 16-bit matrix products (aten::mm, addmm, bmm, "
                         f"linear, …) with input shapes and kernels (record the trace with "
                         f"record_shapes=True)")
    peak = dev.peak_flops["bf16"]
    expected_us = expected_gemm_us(t.gemms, dev)
    measured = t.gemm_flops / (t.gemm_kernel_us * 1e-6) / peak
    expected = t.gemm_flops / (expected_us * 1e-6) / peak
    return expected_us / t.gemm_kernel_us, measured, expected
