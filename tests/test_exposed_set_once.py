"""The drawn timeline and the breakdown share one exposed-communication set (issue 44): on
hand-made ranks whose sets are known by construction, the time the timeline's segments
(``timeline/segments.py``) draw as communication and bubble in a step is the breakdown's
``exposed_comm_<dim>_us`` and ``bubble_us`` of that rank and step
(``timeline/breakdown.py``)."""
import numpy as np
import pandas as pd
import pytest

from meshscope.analysis.timeline import breakdown, segments
from meshscope.analysis.timeline.rank_timeline import RankTimeline


def _iv(*pairs):
    return np.array(pairs, dtype=np.float64).reshape(-1, 2)


def _rank(rank, step, compute, comm_by_dim, waits=_iv()):
    comm = np.concatenate([x for x in comm_by_dim.values()])
    comm = comm[np.argsort(comm[:, 0])]
    return RankTimeline(rank=rank, on_gpu=False, compute=compute, comm=comm,
                        comm_by_dim=comm_by_dim, other=_iv(), steps={4: step}, pipeline=_iv(),
                        microbatches=pd.DataFrame(columns=["ts_us", "end_us"]), span=step,
                        scopes=(np.zeros(0), np.zeros(0), []), trace_compute=compute,
                        trace_comm=comm, waits=waits, wait_until=waits[:, 1].copy())


# Rank 0, a pipeline stage, step 4 on [0, 100): compute [0, 30) and [50, 60); dp
# communication [20, 45), pp [70, 80), tp [85, 95); its pipeline window [60, 75); it waits
# in [40, 45) (for the dp all-reduce) and in [72, 78) (for its neighbour's pp send).
# P = window ∪ pp = [60, 80). Exposed M \ C \ P = dp [30, 45) + tp [85, 95): 15 + 10 µs;
# the pp wait is bubble, not transfer: bubble P \ C = [60, 80), 20 µs.
# Rank 1, no pipeline window, step 4 on [10, 110): compute [10, 50), dp [40, 70):
# exposed dp [50, 70), 20 µs; no bubble.
RANK0 = _rank(0, (0.0, 100.0), _iv((0, 30), (50, 60)),
              {"pp": _iv((70, 80)), "tp": _iv((85, 95)), "dp": _iv((20, 45))},
              waits=_iv((40, 45), (72, 78)))
RANK1 = _rank(1, (10.0, 110.0), _iv((10, 50)), {"dp": _iv((40, 70))})
WINDOWS = {0: {4: _iv((60, 75))}}
EXPECTED = {  # (rank, kind) -> µs drawn in step 4, known by construction
    (0, "comm dp"): 15.0, (0, "comm tp"): 10.0, (0, "bubble"): 20.0, (0, "compute"): 40.0,
    (1, "comm dp"): 20.0, (1, "compute"): 40.0}


def _drawn(table: pd.DataFrame) -> dict:
    kind = table["kind"].where(table["kind"] != "comm", "comm " + table["dim"])
    length = table["end_us"] - table["start_us"]
    drawn = length.groupby([table["rank"], kind]).sum()
    return {(int(r), k): float(v) for (r, k), v in drawn.items() if k != "wait"}


def test_the_timeline_draws_the_breakdowns_exposed_set():
    table = segments.segments({0: RANK0, 1: RANK1}, WINDOWS, [])
    drawn = _drawn(table)
    assert drawn == pytest.approx(EXPECTED)
    rows = {r["rank"]: r for tl in (RANK0, RANK1)
            for r in breakdown.step_rows(tl, WINDOWS.get(tl.rank))}
    for rank, row in rows.items():
        comm = sum(v for (r, k), v in drawn.items() if r == rank and k.startswith("comm "))
        assert comm == pytest.approx(row["exposed_comm_us"])
        for dim in breakdown.DIM_ORDER:
            assert drawn.get((rank, f"comm {dim}"), 0.0) == \
                pytest.approx(row[f"exposed_comm_{dim}_us"])
        assert drawn.get((rank, "bubble"), 0.0) == pytest.approx(row["bubble_us"])
    assert rows[0]["exposed_comm_us"] == pytest.approx(25.0)
    assert rows[0]["bubble_us"] == pytest.approx(20.0)
    assert rows[1]["exposed_comm_us"] == pytest.approx(20.0)


def test_waits_are_drawn_over_the_communication_and_bubble_they_lie_in():
    """The waits keep their own rows (the whole wait), over the comm and bubble stretches the
    breakdown counts them in: the dp wait inside exposed dp, the pp wait inside bubble."""
    table = segments.segments({0: RANK0}, WINDOWS, [])
    waits = table[table["kind"] == "wait"]
    assert waits[["start_us", "end_us"]].to_numpy().tolist() == [[40.0, 45.0], [72.0, 78.0]]
    assert waits["dim"].tolist() == ["dp", "pp"]
    comm = table[(table["kind"] == "comm") & (table["dim"] == "dp")]
    bubble = table[table["kind"] == "bubble"]
    assert comm[["start_us", "end_us"]].to_numpy().tolist() == [[30.0, 45.0]]
    assert bubble[["start_us", "end_us"]].to_numpy().tolist() == [[60.0, 80.0]]


def test_segments_come_a_few_ranks_at_a_time_in_the_whole_table_s_order():
    """The report keeps the segments on disk as they are made (issue 51): in frames of whole
    ranks' steps once their rows reach the frame size, which put together are the table."""
    whole = segments.segments({0: RANK0, 1: RANK1}, WINDOWS, [])
    frames = list(segments.segment_frames({0: RANK0, 1: RANK1}, WINDOWS, [],
                                          rows_per_frame=1))
    assert [f["rank"].unique().tolist() for f in frames] == [[0], [1]]
    pd.testing.assert_frame_equal(pd.concat(frames, ignore_index=True), whole)
    big = list(segments.segment_frames({0: RANK0, 1: RANK1}, WINDOWS, [],
                                       rows_per_frame=len(whole) + 1))
    assert len(big) == 1
    pd.testing.assert_frame_equal(big[0], whole)
    assert list(segments.segment_frames({}, WINDOWS, [])) == []
    assert segments.segments({}, WINDOWS, []).columns.tolist() == segments.COLUMNS
