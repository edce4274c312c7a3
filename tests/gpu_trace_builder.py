"""Small GPU Kineto traces made by hand, whose answer is known by construction.

``Trace`` collects events the way the PyTorch profiler writes them: host ranges (``cpu_op``,
``user_annotation``, ``cuda_runtime``) on one thread, and device activities (``kernel``,
``gpu_memcpy``) on a stream, linked to the runtime call that launched them by ``correlation``.
Times are in µs.
"""
from __future__ import annotations

import gzip
import json
import pathlib

PID, TID = 100, 100


class Trace:
    def __init__(self, rank: int | None = 0, world: int = 1):
        self.events: list[dict] = []
        self.corr = 1
        self.rank, self.world = rank, world

    def host(self, name: str, ts: float, dur: float, cat: str = "cpu_op", **args) -> None:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts,
              "dur": dur}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def step(self, n: int, ts: float, dur: float) -> None:
        self.host(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def launch(self, ts: float, dur: float, kernel_ts: float, kernel_dur: float,
               name: str = "ampere_sgemm_128x64_nn", call: str = "cudaLaunchKernel",
               cat: str = "kernel", stream: int = 7, **kargs) -> int:
        """A runtime call at ``ts`` that launches one device activity at ``kernel_ts``."""
        c = self.corr
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": call, "pid": PID,
                            "tid": TID, "ts": ts, "dur": dur, "args": {"correlation": c}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                            "ts": kernel_ts, "dur": kernel_dur,
                            "args": {"device": 0, "stream": stream, "correlation": c,
                                     **kargs}})
        return c

    def doc(self) -> dict:
        out = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
               "traceEvents": self.events}
        if self.rank is not None:
            out["distributedInfo"] = {"rank": self.rank, "world_size": self.world,
                                      "backend": "nccl"}
        return out

    def write(self, folder: pathlib.Path, name: str | None = None) -> pathlib.Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (name or f"rank{self.rank or 0}.json.gz")
        with gzip.open(path, "wt") as f:
            json.dump(self.doc(), f)
        return path


def kernels_back_to_back(t: Trace, launch_ts: float, first_kernel_ts: float, n: int,
                         kernel_us: float, launch_us: float = 10.0,
                         name: str = "ampere_sgemm_128x64_nn") -> float:
    """``n`` launches of ``launch_us`` each from ``launch_ts``; their kernels of ``kernel_us``
    run back to back from ``first_kernel_ts``. Returns the end of the last kernel."""
    k = first_kernel_ts
    for i in range(n):
        t.launch(launch_ts + i * launch_us, launch_us, k, kernel_us, name=name)
        k += kernel_us
    return k
