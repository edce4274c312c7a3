"""The column building's fast paths (``batch_columns``, ``memory_events``): a batch whose
values are what a real trace holds is built at once (the phases met as a set, lanes made once
per distinct thread, the ``[memory]`` fields checked as arrays); one holding an odd value takes
the one-at-a-time path. Both must give the same columns and the same damage: each test builds
the answer by hand and checks a batch that takes each path (docs/benchmarks.md, "Second pass").
"""
from __future__ import annotations

import pyarrow as pa

from meshscope.analysis.ingest import batch_columns, decode, memory_events
from meshscope.analysis.ingest.validate import DROPPED, IGNORED, Damage


def _x(name="aten::mm", pid=1, tid=2, ts=10.0, dur=1.0, cat="cpu_op", args=None, ph="X"):
    return decode.Event(ph=ph, name=name, cat=cat, ts=ts, dur=dur, pid=pid, tid=tid, args=args)


def _mem(ts=5.0, pid=1, tid=2, **args):
    fields = {"mem_bytes": 64, "mem_allocated": 128, "mem_reserved": 256, "mem_addr": 7,
              "mem_device_type": 1, "mem_device_id": 0, **args}
    return decode.Event(ph="i", name="[memory]", ts=ts, pid=pid, tid=tid,
                        args=decode.Args(**fields))


def _batch(evs):
    reading = batch_columns.Reading()
    cols, _, damage = batch_columns.batch(evs, reading)
    return cols, damage, reading


def test_lanes_once_per_thread_keep_event_order_and_python_text():
    # Negative, large and repeated pids/tids, in an order np.unique would sort differently.
    threads = [(9, 1), (-3, 2**62), (9, 1), (0, -7), (-3, 2**62), (9, 2)]
    cols, damage, _ = _batch([_x(pid=p, tid=t) for p, t in threads])
    assert cols["lane"].to_pylist() == ["cpu:9:1", f"cpu:-3:{2**62}", "cpu:9:1", "cpu:0:-7",
                                        f"cpu:-3:{2**62}", "cpu:9:2"]
    assert not damage


def test_lanes_of_odd_pids_take_the_slow_path_with_the_same_text():
    # A string pid, a bool, a float, an integer beyond 64 bits and a missing tid.
    threads = [("main", 2), (True, 2), (1.5, 2), (2**70, 3), (4, None)]
    cols, damage, _ = _batch([_x(pid=p, tid=t) for p, t in threads])
    assert cols["lane"].to_pylist() == ["cpu:main:2", "cpu:True:2", "cpu:1.5:2",
                                        f"cpu:{2**70}:3", "cpu:4:None"]
    assert damage == {("pid/tid", IGNORED, "missing: the event's thread is unknown"): 1}


def test_device_lanes_from_arguments_integers_or_not():
    ints = decode.Args(device=0, stream=7)
    cols, _, _ = _batch([_x(name="k1", cat="kernel", pid=0, tid=1, args=ints),
                         _x(name="op", pid=5, tid=6),
                         _x(name="k2", cat="kernel", pid=0, tid=1,
                            args=decode.Args(device=1, stream=13)),
                         _x(name="k3", cat="kernel", pid=3, tid=4)])      # no arguments
    assert cols["lane"].to_pylist() == ["gpu:0:7", "cpu:5:6", "gpu:1:13", "gpu:3:4"]
    cols, _, _ = _batch([_x(name="k1", cat="kernel", args=decode.Args(device="0", stream=7))])
    assert cols["lane"].to_pylist() == ["gpu:0:7"]


def test_unicode_names_and_a_batch_of_complete_events_only():
    names = ["aten::mm", "ρ·σ", "名前", "aten::mm", "🙂"]
    cols, damage, _ = _batch([_x(name=n, ts=float(i)) for i, n in enumerate(names)])
    assert cols["name"].to_pylist() == names
    assert cols["ts_us"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert not damage


def test_phases_met_counted_once_each_hashable_or_not():
    # Unknown phases: None, a number, True (equal to 1 as a set member), an unknown letter
    # and a list (unhashable: the one-at-a-time count). Flow and metadata events are known
    # kinds, left out without damage.
    odd = [None, 1, True, "Q", "Q"]
    evs = [_x(ts=1.0)] + [_x(ph=p) for p in odd] + [_x(ph="f"), _x(ph="M"), _x(ts=2.0)]
    cols, damage, _ = _batch(evs)
    why = "missing, or not one of the trace format's event phases"
    assert cols["ts_us"].to_pylist() == [1.0, 2.0]
    assert damage == {("ph", DROPPED, why): 5}
    cols, damage, _ = _batch(evs + [_x(ph=["X"])])
    assert cols["ts_us"].to_pylist() == [1.0, 2.0]
    assert damage == {("ph", DROPPED, why): 6}


def test_pairs_and_memory_events_beside_complete_events():
    evs = [_x(name="a", ts=1.0), _mem(ts=1.5), _x(ph="B", name="b", ts=2.0, dur=None),
           decode.Event(ph="i", name="not memory", ts=2.5, pid=1, tid=2),
           _x(ph="E", name=None, ts=5.0, dur=None), _x(name="c", ts=6.0)]
    cols, damage, reading = _batch(evs)
    # The X events first, in file order, then the pair it closes (``Reading.pair``).
    assert cols["name"].to_pylist() == ["a", "c", "b"]
    assert cols["dur_us"].to_pylist() == [1.0, 1.0, 3.0]
    assert reading.memory.rows == 1 and not damage


def test_memory_columns_fast_and_slow_paths_agree():
    good = [_mem(ts=float(i), mem_bytes=(-1) ** i * 64 * (i + 1), mem_addr=2**63 - 1 - i)
            for i in range(4)]
    lanes = pa.array([f"cpu:1:{i}" for i in range(4)], pa.large_string())
    expected = {"ts_us": [0.0, 1.0, 2.0, 3.0], "bytes": [64, -128, 192, -256],
                "total_allocated": [128] * 4, "total_reserved": [256] * 4,
                "addr": [2**63 - 1 - i for i in range(4)], "device_type": [1] * 4,
                "device_id": [0] * 4, "lane": lanes.to_pylist()}
    damage = Damage()
    cols = memory_events.columns(good, lanes, damage)
    assert {k: v.to_pylist() for k, v in cols.items()} == expected and not damage
    # One odd value per field sends each through the one-at-a-time check: the good events'
    # values are the same, the odd one dropped or its field ignored, and counted.
    odd = [_mem(ts="soon"), _mem(mem_bytes=2**64), _mem(mem_allocated=-1),
           _mem(mem_reserved=1.5), _mem(mem_addr=2**64), _mem(mem_device_type=300),
           _mem(mem_device_id="cuda")]
    damage = Damage()
    cols = memory_events.columns(good + odd, pa.array(
        lanes.to_pylist() + [f"odd{i}" for i in range(len(odd))], pa.large_string()), damage)
    got = {k: v.to_pylist()[:4] for k, v in cols.items()}
    assert got == expected
    assert cols["total_allocated"].to_pylist()[4:] == [None, 128, 128, 128, 128]
    assert cols["total_reserved"].to_pylist()[4:] == [256, None, 256, 256, 256]
    assert cols["addr"].to_pylist()[4:] == [7, 7, 0, 7, 7]
    assert cols["device_type"].to_pylist()[4:] == [1, 1, 1, -1, 1]
    assert cols["device_id"].to_pylist()[4:] == [0, 0, 0, 0, -1]
    assert damage.dropped == 2 and sum(n for (_, a, _), n in damage.items()
                                       if a == IGNORED) == 5


def test_memory_events_without_totals_pytorch_18():
    evs = [_mem(ts=float(i), mem_allocated=None, mem_reserved=None) for i in range(3)]
    damage = Damage()
    cols = memory_events.columns(evs, pa.array(["l"] * 3, pa.large_string()), damage)
    assert cols["total_allocated"].to_pylist() == [None] * 3
    assert cols["total_reserved"].null_count == 3 and not damage
