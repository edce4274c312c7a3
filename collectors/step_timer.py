"""Always-on per-rank step timers, written to ``steps/rank{R}.parquet``.

One row per step: ``step``, ``wall_time_us`` (monotonic clock on CPU; the device is synchronised
first on CUDA), ``tokens`` (tokens this rank processed), ``loss`` (NaN on ranks that do not
compute the loss, e.g. non-final pipeline stages), and ``start_unix_s``. Rows are flushed every
``flush_every`` steps so that a killed run keeps what it measured.
"""
from __future__ import annotations

import math
import pathlib
import time

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([
    ("rank", pa.int32()),
    ("step", pa.int32()),
    ("start_unix_s", pa.float64()),
    ("wall_time_us", pa.float64()),
    ("tokens", pa.int64()),
    ("loss", pa.float64()),
])


class StepTimer:
    def __init__(self, path: pathlib.Path, rank: int, *, flush_every: int = 10, sync=None):
        self.path = pathlib.Path(path)
        self.rank = rank
        self.flush_every = flush_every
        self._sync = sync or (lambda: None)
        self._rows: list[dict] = []
        self._t0 = None

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()
        self._unix0 = time.time()

    def stop(self, step: int, *, tokens: int, loss: float | None) -> float:
        """Close the step started by ``start``; returns its wall time in µs."""
        self._sync()
        wall_us = (time.perf_counter() - self._t0) * 1e6
        self._rows.append({"rank": self.rank, "step": step, "start_unix_s": self._unix0,
                           "wall_time_us": wall_us, "tokens": tokens,
                           "loss": math.nan if loss is None else float(loss)})
        if len(self._rows) % self.flush_every == 0:
            self.flush()
        return wall_us

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(self._rows, schema=SCHEMA)
        tmp = self.path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        tmp.replace(self.path)
