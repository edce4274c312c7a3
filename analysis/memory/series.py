"""Allocated and reserved memory over time, per device of one rank.

A rank's ``[memory]`` events (``analysis/ingest/memory_events.py``) are split by device —
``device_label``: ``cuda:0`` for ``Device Type`` 1 and ``Device Id`` 0, ``cpu`` for type 0 —
and ordered by time (events at one time keep their order in the file, which is the order the
allocator made them). A device's ``Series`` holds, after each event, the allocator's totals:

- ``allocated``: bytes held by live tensors (``Total Allocated``);
- ``reserved``: bytes the caching allocator holds from the device, in use or cached for
  reuse (``Total Reserved``); null for the CPU, whose allocator reserves nothing (its
  events say 0).

``totals`` says what those numbers are:

- ``absolute`` — the allocator's own device-wide counters (CUDA/HIP): memory allocated before
  the profiler started is in them, so the first event's total is the whole device's;
- ``since-start`` — the CPU allocator's counter, which PyTorch keeps only while the profiler
  records memory: allocations made before it started, and their frees, are not in it (c10's
  ``ProfiledCPUMemoryReporter``), so it starts near 0;
- ``rebuilt`` — the trace has no totals (PyTorch 1.8 wrote only ``Bytes``): ``allocated`` is the
  running sum of the signed ``Bytes`` from the trace's start (what was allocated since then,
  net), ``reserved`` unknown.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

# torch's c10::DeviceType numbers that traces carry (the common ones named, others by number).
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 6: "hip", 9: "xla", 12: "xpu", 13: "mps",
                19: "mtia", 20: "privateuse1"}
TOTALS = ("absolute", "since-start", "rebuilt")


def device_label(device_type: int, device_id: int) -> str:
    """``cuda:0``, ``cpu``, ``xpu:1``; ``device<N>`` for a type without a name, ``unknown``
    where the trace gave none (-1)."""
    if device_type < 0:
        return "unknown"
    name = DEVICE_TYPES.get(int(device_type), f"device{int(device_type)}")
    return name if name == "cpu" or device_id < 0 else f"{name}:{int(device_id)}"


def is_cpu(device: str) -> bool:
    return device == "cpu"


@dataclasses.dataclass(frozen=True)
class Series:
    """One device's ``[memory]`` events in time order, with the totals after each."""
    device: str
    device_type: int
    device_id: int
    ts_us: np.ndarray            # float64
    bytes: np.ndarray            # int64, + allocated, − freed
    allocated: np.ndarray        # int64, after each event
    reserved: np.ndarray | None  # int64 after each event; None where unknown
    addr: np.ndarray             # uint64; 0 where unknown
    lane: np.ndarray             # object (the thread, ``cpu:<pid>:<tid>``)
    totals: str                  # one of TOTALS

    def __len__(self) -> int:
        return len(self.ts_us)

    def before(self, i: int) -> int:
        """The allocated total just before event ``i``."""
        return int(self.allocated[i] - self.bytes[i])


def split(memory: pd.DataFrame) -> list[Series]:
    """The memory table of one rank, one ``Series`` per device (module docstring), sorted by
    device label."""
    if memory is None or memory.empty:
        return []
    out = []
    keys = memory[["device_type", "device_id"]].drop_duplicates().itertuples(index=False)
    for dt, did in sorted(keys, key=lambda k: device_label(int(k[0]), int(k[1]))):
        rows = memory[(memory["device_type"] == dt) & (memory["device_id"] == did)]
        order = np.argsort(rows["ts_us"].to_numpy(), kind="stable")
        rows = rows.iloc[order]
        size = rows["bytes"].to_numpy(dtype=np.int64)
        alloc = rows["total_allocated"]
        if alloc.isna().any():
            allocated, totals = np.cumsum(size), "rebuilt"
            reserved = None
        else:
            allocated = alloc.to_numpy(dtype=np.int64)
            totals = "since-start" if int(dt) == 0 else "absolute"
            res = rows["total_reserved"]
            reserved = None if int(dt) == 0 or res.isna().any() else \
                res.to_numpy(dtype=np.int64)
        out.append(Series(device=device_label(int(dt), int(did)), device_type=int(dt),
                          device_id=int(did), ts_us=rows["ts_us"].to_numpy(dtype=np.float64),
                          bytes=size, allocated=allocated, reserved=reserved,
                          addr=rows["addr"].to_numpy(dtype=np.uint64),
                          lane=rows["lane"].astype(object).to_numpy(), totals=totals))
    return out


def device_memory_bytes(meta: dict, s: Series) -> int | None:
    """The device's memory as the trace's ``deviceProperties`` give it (``totalGlobalMem`` of
    the entry whose ``id`` is the device's), None when the trace does not say (the CPU, a
    trace without properties)."""
    if s.device_type < 0 or s.device_type == 0:
        return None
    props = meta.get("deviceProperties") if isinstance(meta, dict) else None
    if not isinstance(props, list):
        return None
    for p in props:
        if isinstance(p, dict) and p.get("id") == s.device_id:
            v = p.get("totalGlobalMem")
            if type(v) is int and 0 < v < 1 << 50:
                return v
    return None
