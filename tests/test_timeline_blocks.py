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


def _points(ivs) -> set:
    return {x for a, b in ivs for x in np.arange(a, b, 0.5).tolist()}


def test_innermost_in_pieces_gives_the_latest_started_open_range_at_every_point():
    """``innermost`` taken a few ranges at a time (``block`` 1, 2, 3: cut wherever no earlier
    range is still open): at each half-microsecond point, found by scanning every range, the
    one covering it that started last (the later-listed of equal starts) owns it — ranges that
    touch, nest and tie across the cuts included."""
    import random

    from meshscope.analysis import intervals as iv

    rng = random.Random(5)
    for _ in range(400):
        n = rng.randint(1, 16)
        starts = [rng.randint(0, 40) for _ in range(n)]
        ends = [s + rng.randint(0, 6) for s in starts]
        labels = [rng.choice("abc") for _ in range(n)]
        expected = {lab: set() for lab in labels}
        for x in (i * 0.5 for i in range(100)):
            covering = [i for i in range(n) if starts[i] <= x < ends[i]]
            if covering:
                last = max(covering, key=lambda i: (starts[i], i))
                expected[labels[last]].add(x)
        for block in (1, 2, 3):
            owned = iv.innermost(starts, ends, labels, block=block)
            assert {lab: _points(v.tolist()) for lab, v in owned.items()} == expected


def test_innermost_in_pieces_is_the_whole_to_the_bit():
    """200,000 ranges in 50 steps, each step a range over its operators (so cuts fall between
    steps only): the sets taken 65,536 ranges at a time are the ones taken all at once."""
    from meshscope.analysis import intervals as iv

    rng = np.random.default_rng(7)
    steps = np.repeat(np.arange(50) * 1e5, 4000)
    starts = steps + rng.uniform(0, 9e4, steps.size)
    ends = starts + rng.exponential(30, starts.size)
    labels = rng.choice(["op", "comm", "recv"], starts.size)
    starts = np.concatenate([np.arange(50) * 1e5, starts])
    ends = np.concatenate([np.arange(50) * 1e5 + 9.5e4, ends])
    labels = np.concatenate([np.full(50, "ann"), labels])
    s, e = np.sort(starts), ends[np.argsort(starts, kind="stable")]
    assert len(iv._cuts(s, e, iv.INNERMOST_BLOCK)) > 2          # the premise: it is cut
    whole = iv.innermost(starts, ends, labels, block=starts.size)
    pieces = iv.innermost(starts, ends, labels)
    assert list(whole) == list(pieces)
    assert _same(pieces, whole)


def test_union_of_sorted_or_shuffled_ranges_is_one_set():
    """``union`` skips its sort when the starts are already in order (the sets the interval
    operations make): the same set either way, and the caller's arrays are left as they
    were. By construction: [0, 1) and [1, 2) touch, [3, 5) and [4, 6) overlap, [4, 4) is
    empty: {[0, 2), [3, 6)}."""
    from meshscope.analysis import intervals as iv

    starts = np.array([0.0, 1.0, 3.0, 4.0, 4.0])
    ends = np.array([1.0, 2.0, 5.0, 4.0, 6.0])
    expected = [[0.0, 2.0], [3.0, 6.0]]
    assert iv.union(starts, ends).tolist() == expected
    shuffled = np.array([3, 0, 4, 2, 1])
    s, e = starts[shuffled], ends[shuffled]
    assert iv.union(s, e).tolist() == expected
    assert s.tolist() == [4.0, 0.0, 4.0, 3.0, 1.0] and e.tolist() == [4.0, 1.0, 6.0, 5.0, 2.0]
