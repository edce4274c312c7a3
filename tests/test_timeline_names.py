"""The Timeline's named lanes (``analysis/timeline/named_lanes.py``) on hand-made event tables
whose answer is known by construction: lanes labelled and ordered CPU threads first, then GPU
streams by number; nesting depth on a lane; events cut to the step's range on its axis (the
shift) and the longest kept when there are too many; a collective named with its collective;
one flow from each launch to the kernel it launched, and none where no correlation joins
them."""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.timeline import named_lanes as nl


def _events(rows) -> pd.DataFrame:
    """(name, lane, start, end, kind, correlation[, coll_name]) rows as an event table."""
    rows = [r + (None,) * (7 - len(r)) for r in rows]
    df = pd.DataFrame(rows, columns=["name", "lane", "ts_us", "end_us", "kind", "correlation",
                                     "coll_name"])
    df["dur_us"] = df["end_us"] - df["ts_us"]
    for c in ("name", "lane", "kind", "coll_name"):
        df[c] = df[c].astype("category")
    df["correlation"] = df["correlation"].astype(np.int64)
    return df


def test_lanes_are_labelled_and_ordered_cpu_first_then_streams_by_number():
    lanes = ["gpu:0:13", "cpu:10:200", "gpu:0:7", "gpu:1:7", "cpu:10:31", "gpu:0:7"]
    assert nl.lane_order(lanes) == ["cpu:10:31", "cpu:10:200", "gpu:0:7", "gpu:0:13",
                                    "gpu:1:7"]
    assert nl.lane_label("cpu:10:31") == "CPU thread 31"
    assert nl.lane_label("gpu:1:7") == "GPU 1 stream 7"
    assert nl.lane_label("Traces") == "Traces"


def test_nesting_depth_on_a_lane():
    # a [0, 100) holds b [10, 50), which holds c [20, 30); d [60, 70) is inside a only;
    # e [100, 120) starts when a ends: inside nothing
    start = np.array([0, 10, 20, 60, 100], dtype=float)
    end = np.array([100, 50, 30, 70, 120], dtype=float)
    assert nl.nesting_depth(start, end).tolist() == [0, 1, 2, 1, 0]
    # two siblings one after the other are both at depth 0
    assert nl.nesting_depth(np.array([0.0, 5.0]), np.array([5.0, 9.0])).tolist() == [0, 0]


def test_events_are_cut_to_the_range_on_the_shifted_axis():
    ev = _events([
        ("before", "cpu:1:1", 1000.0, 1090.0, "compute", -1),     # ends before the range
        ("straddles", "cpu:1:1", 1050.0, 1150.0, "compute", -1),  # clipped at 0
        ("inside", "cpu:1:1", 1200.0, 1300.0, "compute", -1),
        ("after", "cpu:1:1", 1600.0, 1700.0, "compute", -1),      # starts after the range
    ])
    got = nl.named_events(ev, 0.0, 500.0, shift_us=1100.0)
    assert got.dropped == 0
    assert got.events["name"].tolist() == ["straddles", "inside"]
    assert got.events["start_us"].tolist() == [0.0, 100.0]
    assert got.events["end_us"].tolist() == [50.0, 200.0]
    assert got.events["lane_label"].tolist() == ["CPU thread 1", "CPU thread 1"]


def test_the_longest_events_are_kept_and_the_others_counted():
    ev = _events([(f"e{i}", "cpu:1:1", 10.0 * i, 10.0 * i + i, "compute", -1)
                  for i in range(1, 7)])           # e_i lasts i µs
    got = nl.named_events(ev, 0.0, 1000.0, max_events=2)
    assert got.dropped == 4
    assert sorted(got.events["name"]) == ["e5", "e6"]
    # every event is kept when they fit
    assert nl.named_events(ev, 0.0, 1000.0, max_events=6).dropped == 0


def test_a_collective_is_named_with_its_collective():
    ev = _events([("nccl:all_reduce", "cpu:1:1", 0.0, 10.0, "communication", -1,
                   "allreduce"),
                  ("aten::mm", "cpu:1:1", 20.0, 30.0, "compute", -1, None)])
    names = nl.named_events(ev, 0.0, 100.0).events["name"].tolist()
    assert names == ["nccl:all_reduce · allreduce", "aten::mm"]


def test_flows_run_from_each_launch_to_its_kernel():
    ev = _events([
        ("aten::mm", "cpu:1:1", 0.0, 30.0, "compute", -1),
        ("cudaLaunchKernel", "cpu:1:1", 5.0, 8.0, "other", 42),    # inside aten::mm
        ("cudaLaunchKernel", "cpu:1:1", 10.0, 12.0, "other", 43),
        ("gemm_kernel", "gpu:0:7", 20.0, 60.0, "compute", 42),
        ("relu_kernel", "gpu:0:7", 61.0, 70.0, "compute", 43),
        ("memcpy", "gpu:0:13", 80.0, 90.0, "memory", 99),          # launch not traced
    ])
    got = nl.named_events(ev, 0.0, 100.0)
    flows = got.flows
    assert flows["correlation"].tolist() == [42, 43]
    assert flows["launch_us"].tolist() == [5.0, 10.0]
    assert flows["gpu_us"].tolist() == [20.0, 61.0]
    assert flows["gpu_lane"].tolist() == ["gpu:0:7", "gpu:0:7"]
    assert flows["name"].tolist() == ["gemm_kernel", "relu_kernel"]
    depth = dict(zip(got.events["name"] + "@" + got.events["start_us"].astype(str),
                     got.events["depth"]))
    assert depth["aten::mm@0.0"] == 0 and depth["cudaLaunchKernel@5.0"] == 1


def test_no_flow_without_a_correlation_on_both_sides():
    ev = _events([("cudaLaunchKernel", "cpu:1:1", 5.0, 8.0, "other", -1),
                  ("gemm_kernel", "gpu:0:7", 20.0, 60.0, "compute", -1),
                  ("other_kernel", "gpu:0:7", 61.0, 70.0, "compute", 7)])
    flows = nl.named_events(ev, 0.0, 100.0).flows
    assert flows.empty and list(flows.columns) == nl.FLOW_COLUMNS
