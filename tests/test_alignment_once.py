"""One alignment: a rank's timeline (``RankTimeline.shifted``) and its collective instances
(``clocks.align_instances``) move onto the reference clock by the same function,
``clocks.to_aligned_us``, with the offset the clock table says was applied — so an operation's
interval in the timeline and its row in the instance table stay together. Hand-made: rank 1's
clock 10 s ahead (applied 10,000,000 µs), one all-reduce at 10,000,100–10,000,150 µs on its own
clock, which on the reference clock is 100–150 µs."""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.crossrank import clocks
from meshscope.analysis.timeline.rank_timeline import RankTimeline

AHEAD_US = 10_000_000.0


def _timeline() -> RankTimeline:
    """Rank 1 on its own clock: compute 0–100 and 150–300 µs after its clock's 10 s, the
    all-reduce between, one step over all of it."""
    t0 = AHEAD_US
    iv = np.array([[t0, t0 + 100.0], [t0 + 150.0, t0 + 300.0]])
    comm = np.array([[t0 + 100.0, t0 + 150.0]])
    return RankTimeline(
        rank=1, on_gpu=False, compute=iv, comm=comm, comm_by_dim={"dp": comm},
        other=np.zeros((0, 2)), steps={5: (t0, t0 + 300.0)}, pipeline=np.zeros((0, 2)),
        microbatches=pd.DataFrame({"ts_us": [t0], "end_us": [t0 + 300.0]}),
        span=(t0, t0 + 300.0), scopes=(np.array([t0 + 100.0]), np.array([t0 + 150.0]), ["dp"]),
        trace_compute=iv, trace_comm=comm)


def test_the_timeline_and_the_instances_land_on_the_same_reference_times():
    offsets = pd.DataFrame({"rank": [0, 1], "offset_us": [0.0, AHEAD_US],
                            "uncertainty_us": [0.0, 3.0], "n": [0, 4],
                            "source": ["reference", "collectives"],
                            "applied_us": [0.0, AHEAD_US]}, columns=clocks.COLUMNS)
    applied = clocks.applied_by_rank(offsets)
    assert applied == {0: 0.0, 1: AHEAD_US}
    inst = pd.DataFrame({"rank": [1], **{c: [AHEAD_US + (150.0 if "end" in c else 100.0)]
                                          for c in clocks.TIME_COLUMNS}})
    aligned = clocks.align_instances(inst, offsets)
    tl = _timeline().shifted(applied[1])
    assert aligned.loc[0, "call_ts_us"] == 100.0 and aligned.loc[0, "end_us"] == 150.0
    # The table on the rank's own clock is left as it is; shifted in place (what the analysis
    # does with a table nobody else holds) it becomes the aligned one.
    assert inst.loc[0, "call_ts_us"] == AHEAD_US + 100.0
    clocks.shift_instances(inst, offsets)
    pd.testing.assert_frame_equal(inst, aligned)
    assert tl.comm.tolist() == [[100.0, 150.0]]                 # where the instance is
    assert tl.comm_by_dim["dp"].tolist() == [[100.0, 150.0]]
    assert tl.compute.tolist() == [[0.0, 100.0], [150.0, 300.0]]
    assert tl.steps == {5: (0.0, 300.0)} and tl.span == (0.0, 300.0)
    assert tl.microbatches[["ts_us", "end_us"]].values.tolist() == [[0.0, 300.0]]
    assert tl.scopes[0].tolist() == [100.0] and tl.scopes[1].tolist() == [150.0]


def test_no_offset_leaves_the_timeline_as_it_is():
    tl = _timeline()
    assert tl.shifted(0.0) is tl
