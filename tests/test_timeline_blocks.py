"""The per-rank stage builds its interval sets over blocks of rows (``rank_timeline
.sets_in_blocks``), so that what a builder holds meanwhile is one block's, not the whole
trace's: the sets must be the same, to the bit, as the builder's over the whole frame."""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.gpu import host_activity, step_categories
from meshscope.analysis.timeline import rank_timeline as timeline


def _frame(rows: list[tuple]) -> pd.DataFrame:
    """An event table of (name, cat, lane, device, kind, ts_us, end_us) rows."""
    df = pd.DataFrame(rows, columns=["name", "cat", "lane", "device", "kind", "ts_us",
                                     "end_us"])
    for col in ("name", "cat", "lane", "kind"):
        df[col] = df[col].astype("category")
    df = df.astype({"device": bool, "ts_us": float, "end_us": float})
    df["dur_us"] = df["end_us"] - df["ts_us"]
    df["correlation"] = -1
    return df


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k])
                                                                   for k in a)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


# Ranges that meet, overlap and nest across any cut into blocks: on the main thread an
# operator [0, 10) and one touching it [10, 20), an operator [15, 40) overlapping both, a
# runtime call [30, 35) and one [50, 60) enclosed by a later-starting operator's row order;
# a second thread's operator; device kernels; an empty range.
ROWS = [
    ("aten::mm", "cpu_op", "cpu:1:1", False, "compute", 0.0, 10.0),
    ("aten::add", "cpu_op", "cpu:1:1", False, "compute", 10.0, 20.0),
    ("cudaLaunchKernel", "cuda_runtime", "cpu:1:1", False, "other", 30.0, 35.0),
    ("aten::mul", "cpu_op", "cpu:1:1", False, "compute", 15.0, 40.0),
    ("cudaStreamSynchronize", "cuda_runtime", "cpu:1:1", False, "other", 50.0, 60.0),
    ("aten::linear", "cpu_op", "cpu:1:1", False, "compute", 45.0, 70.0),
    ("aten::zeros", "cpu_op", "cpu:1:2", False, "compute", 5.0, 6.0),
    ("aten::empty", "cpu_op", "cpu:1:2", False, "compute", 8.0, 8.0),
    ("gemm_kernel", "kernel", "gpu:0:7", True, "compute", 12.0, 30.0),
    ("ncclKernel_AllReduce", "kernel", "gpu:0:9", True, "communication", 25.0, 45.0),
    ("gemm_kernel", "kernel", "gpu:0:7", True, "compute", 30.0, 31.0),
]


def test_thread_sets_over_blocks_are_the_whole_frames_sets():
    host = _frame([r for r in ROWS if not r[3]])
    whole = host_activity.thread_sets(host)
    # By construction: the main thread's operators [0, 10), [10, 20), [15, 40), [45, 70) are
    # one cpu set [0, 40) ∪ [45, 70); its sync [50, 60); the runtime call [30, 35).
    assert np.array_equal(whole["cpu:1:1"]["cpu"], [[0.0, 40.0], [45.0, 70.0]])
    assert np.array_equal(whole["cpu:1:1"]["sync"], [[50.0, 60.0]])
    assert np.array_equal(whole["cpu:1:1"]["runtime"], [[30.0, 35.0]])
    assert np.array_equal(whole["cpu:1:2"]["cpu"], [[5.0, 6.0]])
    for block_rows in (1, 2, 3, len(host) - 1, len(host), timeline.BLOCK_ROWS):
        assert _same(timeline.sets_in_blocks(host_activity.thread_sets, host, block_rows),
                     whole), block_rows


def test_role_sets_over_blocks_are_the_whole_frames_sets():
    ev = _frame(ROWS)
    whole = step_categories.role_sets(ev)
    assert np.array_equal(whole["kernel"], [[12.0, 31.0]])
    assert np.array_equal(whole["communication"], [[25.0, 45.0]])
    assert np.array_equal(whole["cpu_exec"], [[0.0, 40.0], [45.0, 70.0]])
    for block_rows in (1, 2, 4, 5, len(ev), timeline.BLOCK_ROWS):
        assert _same(timeline.sets_in_blocks(step_categories.role_sets, ev, block_rows),
                     whole), block_rows


def test_an_empty_frame_gives_the_builders_empty_sets():
    ev = _frame([])
    assert _same(timeline.sets_in_blocks(step_categories.role_sets, ev, 4),
                 step_categories.role_sets(ev))
    assert timeline.sets_in_blocks(host_activity.thread_sets, ev, 4) == {}
