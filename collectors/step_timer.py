"""Always-on per-rank step timers, written to ``steps/rank{R}.parquet``.

One row per step:

==================== ======================================================================
column               meaning
==================== ======================================================================
rank, step           the rank and the step index
start_unix_s         wall-clock start of the step (seconds since the epoch)
wall_time_us         duration of the step (µs)
fwd_bwd_us           time in forward and backward (the pipeline schedule, or the microbatch
                     loop), µs; NaN where the loop does not mark phases
optimizer_us         time in the optimizer step, µs; NaN where not marked
tokens               tokens this rank processed in the step
loss                 the step's loss on this rank; NaN on ranks that do not compute it (every
                     pipeline stage but the last)
peak_memory_bytes    CUDA: peak allocated device memory in the step; CPU: the process's peak
                     resident set size so far (the OS keeps no per-step peak), including
                     the heap reserved for the profiled steps (collectors/heap.py)
==================== ======================================================================

Durations use CUDA events on a GPU (recorded on the current stream, read once at the end of the
step) and the monotonic clock on a CPU. Rows are flushed every ``flush_every`` steps, and by
``flush()``, so that a killed run keeps what it measured.
"""
from __future__ import annotations

import contextlib
import math
import pathlib
import resource
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

from .run_dir import STEPS, unusable_file

PHASES = ("fwd_bwd", "optimizer")
SCHEMA = pa.schema([
    ("rank", pa.int32()),
    ("step", pa.int32()),
    ("start_unix_s", pa.float64()),
    ("wall_time_us", pa.float64()),
    ("fwd_bwd_us", pa.float64()),
    ("optimizer_us", pa.float64()),
    ("tokens", pa.int64()),
    ("loss", pa.float64()),
    ("peak_memory_bytes", pa.int64()),
])


class _CpuClock:
    def mark(self):
        return time.perf_counter()

    def elapsed_us(self, a, b) -> float:
        return (b - a) * 1e6

    def peak_memory_bytes(self) -> int:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024

    def sync(self):
        pass


class _CudaClock:
    def __init__(self):
        import torch
        self.torch = torch

    def mark(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def elapsed_us(self, a, b) -> float:
        return a.elapsed_time(b) * 1e3

    def peak_memory_bytes(self) -> int:
        peak = self.torch.cuda.max_memory_allocated()
        self.torch.cuda.reset_peak_memory_stats()
        return int(peak)

    def sync(self):
        self.torch.cuda.synchronize()


class StepTimer:
    def __init__(self, path: pathlib.Path, rank: int, *, flush_every: int = 10,
                 cuda: bool = False):
        self.path = pathlib.Path(path)
        self.rank = rank
        self.flush_every = flush_every
        self._clock = _CudaClock() if cuda else _CpuClock()
        self._rows: list[dict] = []
        self._start = None
        self._phases: dict[str, list] = {}

    def start(self) -> None:
        self._unix0 = time.time()
        self._phases = {}
        self._start = self._clock.mark()

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time a phase of the current step (``fwd_bwd`` or ``optimizer``)."""
        a = self._clock.mark()
        try:
            yield
        finally:
            self._phases.setdefault(name, []).append((a, self._clock.mark()))

    def stop(self, step: int, *, tokens: int, loss: float | None) -> float:
        """Close the step started by ``start``; returns its wall time in µs."""
        end = self._clock.mark()
        self._clock.sync()
        row = {"rank": self.rank, "step": step, "start_unix_s": self._unix0,
               "wall_time_us": self._clock.elapsed_us(self._start, end), "tokens": tokens,
               "loss": math.nan if loss is None else float(loss),
               "peak_memory_bytes": self._clock.peak_memory_bytes()}
        for name in PHASES:
            spans = self._phases.get(name)
            row[f"{name}_us"] = (sum(self._clock.elapsed_us(a, b) for a, b in spans)
                                 if spans else math.nan)
        self._rows.append(row)
        if len(self._rows) % self.flush_every == 0:
            self.flush()
        return row["wall_time_us"]

    @property
    def last_peak_memory_bytes(self) -> int | None:
        """The last closed step's ``peak_memory_bytes`` (None before any)."""
        return self._rows[-1]["peak_memory_bytes"] if self._rows else None

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(self._rows, schema=SCHEMA)
        tmp = self.path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        tmp.replace(self.path)


def read_all(run: pathlib.Path, columns: list[str] | None = None):
    """Every rank's step timers (``steps/rank*.parquet`` of run directory ``run``) as one pandas
    table with the columns above (``columns``: only those of them that a file has; a long run's
    timers are millions of rows), empty when there are none, and a line naming each file that
    could not be read; a damaged file loses its rank's rows only."""
    import pandas as pd

    tables, problems = [], []
    for f in sorted((pathlib.Path(run) / STEPS).glob("rank*.parquet")):
        why = unusable_file(f, run)         # a FIFO would hang the reader, a device not end
        if why:
            problems.append(f"{f}: {why}")
            continue
        try:
            with pq.ParquetFile(f) as pf:
                names = pf.schema_arrow.names
                tables.append(pf.read(columns=None if columns is None else
                                      [c for c in columns if c in names]))
        except (OSError, pa.ArrowException) as e:
            problems.append(f"{f}: not a readable step-timer file ({e})")
    if not tables:
        return pd.DataFrame(), problems
    try:    # joined as Arrow, then one conversion: not a pandas table per rank and their join
        return pa.concat_tables(tables, promote_options="permissive").to_pandas(), problems
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pd.concat([t.to_pandas() for t in tables], ignore_index=True), problems
