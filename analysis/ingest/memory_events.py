"""The allocator's ``[memory]`` events of a trace, read into their own small table per rank.

With ``profile_memory=True`` PyTorch's profiler writes one instant event (``ph: "i"``) named
``[memory]`` for every allocation and every free of the caching allocator (CUDA, HIP) and of
the CPU allocator: its arguments hold the signed size (``Bytes``: positive for an allocation,
negative for a free), the allocator's totals right after it (``Total Allocated``,
``Total Reserved``), the block's address (``Addr``) and the device (``Device Type``: 0 CPU,
1 CUDA — ROCm's HIP traces say 1 too —, ``Device Id``: -1 for the CPU). PyTorch 1.8 wrote
no totals: they are rebuilt from ``Bytes`` by the analysis (``analysis/memory/timeline.py``).

They are not complete events, so they are kept out of the event table (``events.py``: one row
per complete event, which would otherwise grow by a fifth on a trace recorded with memory) and
read into a table of their own, one row per ``[memory]`` event, in file order:

===================== ======== ===========================================================
column                dtype    meaning
===================== ======== ===========================================================
ts_us                 float64  when, µs on the trace's clock
bytes                 int64    ``Bytes``: + allocated, − freed
total_allocated       Int64    ``Total Allocated`` after it; null where the trace has none
total_reserved        Int64    ``Total Reserved`` after it; null where the trace has none
addr                  uint64   ``Addr``; 0 where absent or unusable
device_type           int16    ``Device Type``; -1 where absent
device_id             int32    ``Device Id``; -1 where absent (the CPU)
lane                  category ``cpu:<pid>:<tid>``: the thread that allocated or freed
===================== ======== ===========================================================

Every field is typed where it is read (docs/damaged-input.md): an event whose ``ts`` or
``Bytes`` is missing, not a number, not finite or (``Bytes``) not an integer within 64 bits is
dropped and counted under ``[memory].ts`` / ``[memory].args.Bytes``; a total that is not a
non-negative integer within 64 bits, an address that is not an integer from 0 to 2⁶⁴−1 or a
device that is not a small integer is ignored on that event (null, 0, -1) and counted. An
event far outside the span of the trace's complete events is dropped
(``validate.instants_within``). The table counts against the trace's reading budgets like the
event table: its events against ``--max-events`` (every element of ``traceEvents`` does), its
bytes against ``--max-rank-memory`` (``events._parse_events_of``); at about 40 bytes an event,
millions of them stay a few hundred MB at most.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from meshscope.analysis.ingest.dictionaries import one_dictionary
from meshscope.analysis.ingest.validate import INT64_MAX, Damage

NAME = "[memory]"
INSTANT_PHASES = ("i", "I")
_NAMES = pa.dictionary(pa.int32(), pa.large_string())
SCHEMA = pa.schema([
    ("ts_us", pa.float64()), ("bytes", pa.int64()), ("total_allocated", pa.int64()),
    ("total_reserved", pa.int64()), ("addr", pa.uint64()), ("device_type", pa.int16()),
    ("device_id", pa.int32()), ("lane", _NAMES),
])
COLUMNS = [f.name for f in SCHEMA]
UINT64_MAX = 2**64 - 1
_NUMBER = (int, float)


def is_memory(e) -> bool:
    """Whether a decoded event (``decode.Event``) is an allocator ``[memory]`` event."""
    return e.ph in INSTANT_PHASES and e.name == NAME


def _int64_at_once(values: list, lo: int, hi: int) -> np.ndarray | None:
    """``values`` as an int64 array when every one is a Python integer in [lo, hi] — a real
    trace's, checked at once —, else None (an empty list, another type, a value out of range
    or beyond 64 bits: the caller checks one value at a time)."""
    if not values or set(map(type, values)) != {int}:
        return None
    try:
        arr = np.array(values, dtype=np.int64)
    except OverflowError:
        return None
    return arr if int(arr.min()) >= lo and int(arr.max()) <= hi else None


def _int_or(values: list, lo: int, hi: int, missing, field: str, why: str,
            damage: Damage) -> list | np.ndarray:
    """Each value when it is an integer in [lo, hi], else ``missing`` (a value present but
    unusable is counted as ignored under ``field``): as an int64 array when all are such
    integers (a real trace's, checked at once), else as a list."""
    arr = _int64_at_once(values, lo, hi)
    if arr is not None:
        return arr
    if values.count(None) == len(values):   # a field the trace does not have (PyTorch 1.8's
        return [missing] * len(values)      # totals): nothing to count
    out = []
    bad = 0
    for v in values:
        if type(v) is int and lo <= v <= hi:
            out.append(v)
        else:
            if v is not None:
                bad += 1
            out.append(missing)
    damage.ignore(field, why, bad)
    return out


def _times(ms: list) -> tuple[np.ndarray, np.ndarray]:
    """(float64 ``ts`` of each event, NaN where not a number; whether it is missing)."""
    ts = [e.ts for e in ms]
    if set(map(type, ts)) <= {int, float}:      # a real trace's: converted at once
        try:
            return np.array(ts, dtype=np.float64), np.zeros(len(ts), dtype=bool)
        except OverflowError:                   # an integer beyond the float range
            pass
    return (np.array([v if type(v) in _NUMBER else np.nan for v in ts], dtype=np.float64),
            np.array([v is None for v in ts], dtype=bool))


def _sizes(size: list) -> tuple[list | np.ndarray, np.ndarray]:
    """(``Bytes`` of each event, whether it is an integer within 64 bits)."""
    arr = _int64_at_once(size, -INT64_MAX, INT64_MAX)
    if arr is not None:
        return arr, np.ones(len(size), dtype=bool)
    return size, np.array([type(v) is int and -INT64_MAX <= v <= INT64_MAX for v in size],
                          dtype=bool)


def columns(ms: list, lanes: pa.Array, damage: Damage) -> dict[str, pa.Array] | None:
    """The columns of one batch's ``[memory]`` events (``ms``, decoded ``decode.Event``;
    ``lanes`` their ``cpu:<pid>:<tid>``), None when none is usable; what was dropped or
    ignored is counted in ``damage``. Each field is read in one pass and checked at once
    where all its values are what a real trace holds (``_times``, ``_sizes``, ``_int_or``);
    one value at a time only where they are not."""
    if not ms:
        return None
    args = [e.args for e in ms]
    ts, ts_missing = _times(ms)
    ts_bad = ~np.isfinite(ts) & ~ts_missing
    size, size_ok = _sizes([a.mem_bytes if a is not None else None for a in args])
    keep = np.ones(len(ms), dtype=bool)
    for field, why, bad in (("[memory].ts", "missing", ts_missing),
                            ("[memory].ts", "not a finite number", ts_bad),
                            ("[memory].args.Bytes", "missing, or not an integer within 64 bits",
                             ~size_ok)):
        damage.drop(field, why, int((bad & keep).sum()))
        keep &= ~bad
    if not keep.any():
        return None
    every = bool(keep.all())
    idx = np.flatnonzero(keep)
    if not every:
        args = [args[i] for i in idx]
        size = size[idx] if isinstance(size, np.ndarray) else [size[i] for i in idx]
    fields = {      # (values, lo, hi, missing, argument, why)
        "total_allocated": ([a.mem_allocated if a is not None else None for a in args],
                            0, INT64_MAX, None, "Total Allocated",
                            "not an integer from 0 to 2^63-1"),
        "total_reserved": ([a.mem_reserved if a is not None else None for a in args],
                           0, INT64_MAX, None, "Total Reserved",
                           "not an integer from 0 to 2^63-1"),
        "addr": ([a.mem_addr if a is not None else None for a in args],
                 0, UINT64_MAX, 0, "Addr", "not an integer from 0 to 2^64-1"),
        "device_type": ([a.mem_device_type if a is not None else None for a in args],
                        0, 255, -1, "Device Type", "not an integer from 0 to 255"),
        "device_id": ([a.mem_device_id if a is not None else None for a in args],
                      -1, 1 << 20, -1, "Device Id", "not an integer from -1 to 2^20"),
    }
    typed = {col: pa.array(_int_or(values, lo, hi, missing, f"[memory].args.{key}", why,
                                   damage), SCHEMA.field(col).type)
             for col, (values, lo, hi, missing, key, why) in fields.items()}
    return {
        "ts_us": pa.array(ts if every else ts[idx]),
        "bytes": pa.array(size, pa.int64()),
        **typed,
        "lane": lanes if every else lanes.take(pa.array(idx)),
    }


class Collector:
    """The ``[memory]`` columns of a trace's batches, joined into one chunk per column every
    few batches (``consolidate``) so that many small arrays are not held; ``table`` joins the
    chunks into the rank's memory table."""

    def __init__(self):
        self.small: dict[str, list[pa.Array]] = {}
        self.chunks: dict[str, list[pa.Array]] = {}
        self.rows = 0

    def add(self, cols: dict[str, pa.Array]) -> int:
        """Keep one batch's columns; returns their bytes (for the rank's memory budget)."""
        nbytes = 0
        for k, arr in cols.items():
            self.small.setdefault(k, []).append(arr)
            nbytes += arr.nbytes
        self.rows += len(cols["ts_us"])
        return nbytes

    def consolidate(self) -> None:
        for k, parts in self.small.items():
            joined = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
            if k == "lane":
                joined = pc.dictionary_encode(joined)
            self.chunks.setdefault(k, []).append(joined)
        self.small.clear()

    def table(self, keep_ts) -> tuple[pa.Table, int]:
        """The memory table of every batch added, with only the rows whose ``ts_us``
        ``keep_ts`` (a function of the times array returning a mask) keeps; and how many it
        left out."""
        self.consolidate()
        if not self.rows:
            return SCHEMA.empty_table(), 0
        arrays = {}
        for k in COLUMNS:
            parts = self.chunks.pop(k)
            if k == "lane":
                arrays[k] = one_dictionary(parts)
            else:
                arrays[k] = pa.concat_arrays(parts)
        table = pa.Table.from_arrays([arrays[k] for k in COLUMNS], schema=SCHEMA)
        keep = keep_ts(arrays["ts_us"].to_numpy(zero_copy_only=False))
        dropped = int((~keep).sum())
        if dropped:
            table = table.filter(pa.array(keep))
        return table, dropped


def to_frame(table: pa.Table | None) -> pd.DataFrame:
    """The pandas memory table (the module docstring's dtypes; ``lane`` a categorical)."""
    if table is None or table.num_rows == 0:
        return empty()
    df = table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    df["bytes"] = df["bytes"].astype(np.int64)
    return df[COLUMNS]


def empty() -> pd.DataFrame:
    """A memory table with no rows and the module docstring's columns and dtypes."""
    return pd.DataFrame({
        "ts_us": pd.Series([], dtype=np.float64), "bytes": pd.Series([], dtype=np.int64),
        "total_allocated": pd.Series([], dtype="Int64"),
        "total_reserved": pd.Series([], dtype="Int64"),
        "addr": pd.Series([], dtype=np.uint64), "device_type": pd.Series([], dtype=np.int16),
        "device_id": pd.Series([], dtype=np.int32),
        "lane": pd.Series([], dtype="category")})
