"""``analysis/memory/series.py`` against inputs whose answer is known by construction (issue 52
item 1: the mutants of ``split`` that mix two devices' events and of ``device_memory_bytes``
that read another entry or field of ``deviceProperties`` survived every fast test).

Three devices' events interleaved in one table, each device's own totals chosen apart (cuda:0
counts from 1 GiB, cuda:1 from 2 GiB, hip:0 from 3 GiB), so a series that takes one event of
another device shows it; and a trace's ``deviceProperties`` with two GPUs of different sizes."""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.memory import series

GiB = 1 << 30
MiB = 1 << 20


def _table() -> pd.DataFrame:
    """(device_type, device_id, ts_us, bytes) rows in file order; the totals are each device's
    own running sum from its base, the reserved total 1 GiB above it."""
    rows = [(1, 0, 1.0, 10 * MiB), (1, 1, 2.0, 20 * MiB), (6, 0, 3.0, 30 * MiB),
            (1, 0, 4.0, -10 * MiB), (6, 0, 5.0, -30 * MiB), (1, 1, 6.0, 5 * MiB),
            (1, 0, 7.0, 1 * MiB)]
    held = {(1, 0): 1 * GiB, (1, 1): 2 * GiB, (6, 0): 3 * GiB}
    out = []
    for dt, did, ts, size in rows:
        held[(dt, did)] += size
        out.append({"ts_us": ts, "bytes": size, "total_allocated": held[(dt, did)],
                    "total_reserved": held[(dt, did)] + GiB, "addr": int(ts),
                    "device_type": dt, "device_id": did, "lane": "cpu:1:1"})
    df = pd.DataFrame(out)
    df["total_allocated"] = df["total_allocated"].astype("Int64")
    df["total_reserved"] = df["total_reserved"].astype("Int64")
    df["addr"] = df["addr"].astype(np.uint64)
    return df


def test_each_device_gets_only_its_own_events_and_totals():
    got = {s.device: s for s in series.split(_table())}
    assert list(got) == ["cuda:0", "cuda:1", "hip:0"]
    c0, c1, h0 = got["cuda:0"], got["cuda:1"], got["hip:0"]
    # hip:0 shares cuda:0's device id: its events must not join cuda:0's
    assert c0.ts_us.tolist() == [1.0, 4.0, 7.0]
    assert c0.allocated.tolist() == [GiB + 10 * MiB, GiB, GiB + MiB]
    assert c0.reserved is not None and c0.reserved.tolist() == [2 * GiB + 10 * MiB, 2 * GiB,
                                                                2 * GiB + MiB]
    assert c1.ts_us.tolist() == [2.0, 6.0] and c1.bytes.tolist() == [20 * MiB, 5 * MiB]
    assert h0.allocated.tolist() == [3 * GiB + 30 * MiB, 3 * GiB]
    assert (c0.device_type, c0.device_id) == (1, 0)
    assert (c1.device_type, c1.device_id) == (1, 1)
    assert (h0.device_type, h0.device_id) == (6, 0)
    # the record's documented types: totals int64, times float64
    assert c0.allocated.dtype == np.int64 and c0.ts_us.dtype == np.float64
    assert c0.before(1) == GiB + 10 * MiB and c0.totals == "absolute"


def _props(*entries) -> dict:
    return {"deviceProperties": [{"id": i, "name": "GPU", "totalGlobalMem": m}
                                 for i, m in entries]}


def test_a_devices_memory_is_the_entry_with_its_id():
    by_dev = {s.device: s for s in series.split(_table())}
    meta = _props((0, 80 * GiB), (1, 40 * GiB))
    assert series.device_memory_bytes(meta, by_dev["cuda:0"]) == 80 * GiB
    assert series.device_memory_bytes(meta, by_dev["cuda:1"]) == 40 * GiB
    # the listed order does not decide: the id does
    assert series.device_memory_bytes(_props((1, 40 * GiB), (0, 80 * GiB)),
                                      by_dev["cuda:0"]) == 80 * GiB
    # a HIP device (type 6) is read as a CUDA one is
    assert series.device_memory_bytes(meta, by_dev["hip:0"]) == 80 * GiB


def test_no_memory_where_the_trace_does_not_say_it():
    by_dev = {s.device: s for s in series.split(_table())}
    c1 = by_dev["cuda:1"]
    assert series.device_memory_bytes({}, c1) is None                       # no properties
    assert series.device_memory_bytes({"deviceProperties": {"id": 1}}, c1) is None  # not a list
    assert series.device_memory_bytes(_props((0, 80 * GiB)), c1) is None    # no entry of id 1
    assert series.device_memory_bytes(_props((1, 0)), c1) is None           # zero
    assert series.device_memory_bytes(_props((1, 1 << 50)), c1) is None    # beyond 1 PiB
    assert series.device_memory_bytes(_props((1, (1 << 50) - 1)), c1) == (1 << 50) - 1
    assert series.device_memory_bytes(_props((1, True)), c1) is None        # a bool, not int
    assert series.device_memory_bytes(_props((1, 80.0 * GiB)), c1) is None  # a float
    cpu = pd.DataFrame({"ts_us": [1.0], "bytes": [64], "total_allocated": [64],
                        "total_reserved": [0], "addr": np.array([9], dtype=np.uint64),
                        "device_type": [0], "device_id": [0], "lane": ["cpu:1:1"]})
    (host,) = series.split(cpu)
    assert host.device == "cpu"
    # the CPU has no device memory even when an entry carries its id
    assert series.device_memory_bytes(_props((0, 80 * GiB)), host) is None
