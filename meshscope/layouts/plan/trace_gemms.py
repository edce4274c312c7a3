"""The GEMMs and kernel launches of anyone's Kineto trace, for ``plan --from TRACE``.

A PyTorch profiler trace recorded with ``record_shapes=True`` names each matrix product's
operator (``aten::mm``, ``aten::addmm``, ``aten::bmm``) with its input shapes; the CUDA runtime
call that launched its kernel lies inside the operator on the same thread, and shares its
``correlation`` with the kernel on the GPU. From those:

- each GEMM's M, N, K (``Input Dims``) and its kernels' time on the GPU: the achieved GEMM
  rate, held against what the device's curve expects at the same shapes
  (``gemm_rate_factor``) — the factor the plan's GEMM curves are scaled by;
- the host's time per kernel launch (``cudaLaunchKernel`` and its variants): measured and
  reported; the planner has no host-launch term it could replace with it (yet).

Only 16-bit GEMMs are counted (they calibrate the bf16 curve the plan's bf16 GEMMs run on).
"""
from __future__ import annotations

import bisect
import dataclasses
import gzip
import json
import pathlib

from .devices import DeviceSpec

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm"}
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
    count: int          # batch (bmm) products
    kernel_us: float    # its kernels' time on the GPU

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


def _shape(name: str, dims: list) -> tuple[int, int, int, int] | None:
    """(M, N, K, batch) of a GEMM operator's ``Input Dims``; None when they are not 2-D
    (3-D for bmm) matrices that multiply."""
    try:
        if name == "aten::addmm":
            dims = dims[1:3]
        a, b = dims[0], dims[1]
        if name == "aten::bmm":
            (ba, m, k), (bb, k2, n) = a, b
            return (m, n, k, ba) if ba == bb and k == k2 else None
        (m, k), (k2, n) = a, b
        return (m, n, k, 1) if k == k2 else None
    except (TypeError, ValueError, IndexError):
        return None


def _events(path: pathlib.Path) -> tuple[list[dict], dict]:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{path}: not a readable Kineto trace ({e})") from e
    if isinstance(doc, list):
        return doc, {}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents list (not a Kineto trace)")
    return doc["traceEvents"], doc


def read_trace(path: pathlib.Path) -> TraceMeasures:
    """The 16-bit GEMMs with their kernel time, and the launches' host time, of a trace."""
    events, doc = _events(path)
    kernel_us: dict[object, float] = {}
    launches: dict[tuple[object, object], list[tuple[float, object]]] = {}
    host = []
    ops = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, name, args = e.get("cat"), e.get("name"), e.get("args") or {}
        if cat == "kernel" and "correlation" in args:
            kernel_us[args["correlation"]] = kernel_us.get(args["correlation"], 0.0) \
                + float(e.get("dur", 0.0))
        elif cat in ("cuda_runtime", "cuda_driver") and name in LAUNCHES:
            host.append(float(e.get("dur", 0.0)))
            launches.setdefault((e.get("pid"), e.get("tid")), []).append(
                (float(e.get("ts", 0.0)), args.get("correlation")))
        elif cat == "cpu_op" and name in GEMM_OPS:
            ops.append(e)
    for lst in launches.values():
        lst.sort(key=lambda x: x[0])
    starts = {key: [x[0] for x in lst] for key, lst in launches.items()}
    gemms = []
    for op in ops:
        args = op.get("args") or {}
        types = args.get("Input type") or []
        if not any(t in SIXTEEN_BIT for t in types):
            continue
        shape = _shape(op["name"], args.get("Input Dims") or [])
        thread = (op.get("pid"), op.get("tid"))
        lst = launches.get(thread, [])
        if shape is None or not lst:
            continue
        start = float(op.get("ts", 0.0))
        end = start + float(op.get("dur", 0.0))
        i = bisect.bisect_left(starts[thread], start)
        us = 0.0
        while i < len(lst) and lst[i][0] <= end:
            us += kernel_us.get(lst[i][1], 0.0)
            i += 1
        if us > 0:
            m, n, k, b = shape
            gemms.append(TraceGemm(m, n, k, b, us))
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    device = props[0].get("name") if isinstance(props, list) and props and \
        isinstance(props[0], dict) else None
    return TraceMeasures(path=str(path), device_name=device, gemms=tuple(gemms),
                         launches=len(host),
                         launch_host_us=sum(host) / len(host) if host else 0.0)


def gemm_rate_factor(t: TraceMeasures, dev: DeviceSpec) -> tuple[float, float, float]:
    """(the factor the device's GEMM curves are scaled by, the measured efficiency, the
    curve's at the same GEMMs): the bf16 curve's time for the trace's GEMMs, at their shapes,
    over the time their kernels took. Raises TraceError without 16-bit GEMMs."""
    if not t.gemms:
        raise TraceError(f"{t.path}: no 16-bit aten::mm / addmm / bmm with input shapes and "
                         f"kernels (record the trace with record_shapes=True)")
    curve, peak = dev.curve("bf16"), dev.peak_flops["bf16"]
    expected_us = sum(curve.time_us(g.m, g.n, g.k, peak) * g.count for g in t.gemms)
    measured = t.gemm_flops / (t.gemm_kernel_us * 1e-6) / peak
    expected = t.gemm_flops / (expected_us * 1e-6) / peak
    return expected_us / t.gemm_kernel_us, measured, expected
