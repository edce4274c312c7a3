"""The always-on records' analysers on hand-made inputs: Flight Recorder verdicts judged by
each op's semantics (the rules of PyTorch's torchfrtrace), warm-up and slow steps."""
import msgspec
import pandas as pd
import pytest

from meshscope.analysis.records import flight_recorder as fr
from meshscope.analysis.records.fr_table import FlightRecords
from meshscope.analysis.records import steps
from meshscope.collectors.flight_recorder import Dump


def _entry(op, seq, inp, out, pg=("0", "default_pg"), dtype="Float"):
    return {"profiling_name": f"gloo:{op}", "process_group": list(pg),
            "collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False,
            "input_sizes": inp, "output_sizes": out, "input_dtypes": [dtype] if inp[0] else [],
            "output_dtypes": [dtype] if out[0] else [], "state": "scheduled"}


def _dumps(per_rank: dict[int, list[dict]]) -> FlightRecords:
    """The records of hand-made dumps, each checked as ``read_dump`` checks a file."""
    return FlightRecords.of(msgspec.convert(
        {"schema_version": 1, "rank": r, "flight_recorder": {"entries": e}}, Dump)
        for r, e in per_rank.items())


def _verdicts(per_rank):
    return fr.diagnose(_dumps(per_rank), None, pd.DataFrame())


def test_what_each_op_allows_is_no_desync():
    healthy = {
        # dropless MoE: uneven splits, but what is sent in all is received in all
        0: [_entry("all_to_all", 1, [[252, 64]], [[260, 64]]),
            _entry("scatter", 2, [[2, 128, 64]], [[128, 64]]),        # the root
            _entry("all_gather", 3, [[4]], [[8]]),
            _entry("reduce_scatter", 4, [[8]], [[4]]),
            _entry("broadcast", 5, [[68]], [[68]]),
            # gloo records a coalesced all_gather's output as one [1, …] tensor
            _entry("all_gather", 6, [[4, 32, 64]], [[1, 4, 32, 64]])],
        1: [_entry("all_to_all", 1, [[260, 64]], [[252, 64]]),
            _entry("scatter", 2, [[]], [[128, 64]]),                   # no input off the root
            _entry("all_gather", 3, [[4]], [[8]]),
            _entry("reduce_scatter", 4, [[8]], [[4]]),
            _entry("broadcast", 5, [[68]], [[68]]),
            _entry("all_gather", 6, [[4, 32, 64]], [[1, 4, 32, 64]])],
    }
    assert _verdicts(healthy).empty


def test_a_true_desync_is_named():
    # Rank 1 expects 3 rows from rank 0 that sends 2: 4 + 4 rows sent, 4 + 5 received.
    v = _verdicts({0: [_entry("all_to_all", 1, [[4, 8]], [[4, 8]])],
                   1: [_entry("all_to_all", 1, [[4, 8]], [[5, 8]])]})
    assert v["verdict"].tolist() == ["mismatch"]
    assert "split sizes disagree" in v["detail"].iloc[0]
    v = _verdicts({0: [_entry("all_reduce", 1, [[10]], [[10]])],
                   1: [_entry("all_reduce", 1, [[12]], [[12]])]})
    assert v["verdict"].tolist() == ["mismatch"] and "input sizes differ" in v["detail"].iloc[0]
    v = _verdicts({0: [_entry("all_gather", 1, [[4]], [[8]])],
                   1: [_entry("all_gather", 1, [[6]], [[12]])]})
    assert v["verdict"].tolist() == ["mismatch"] and "all_gather input sizes differ" in \
        v["detail"].iloc[0]


def test_missing_rank_is_a_hang_but_a_wrapped_buffer_is_not():
    entries = lambda seqs: [_entry("all_reduce", s, [[1]], [[1]]) for s in seqs]  # noqa: E731
    v = _verdicts({0: entries([1, 2, 3]), 1: entries([1, 2])})
    assert v["verdict"].tolist() == ["missing"] and v["ranks_missing"].iloc[0] == [1]
    assert v["seq"].iloc[0] == 3
    # Rank 1's ring buffer no longer holds seq 1 (it kept the newest entries): not missing.
    assert _verdicts({0: entries([1, 2, 3]), 1: entries([2, 3])}).empty


def test_verdicts_among_twelve_ranks_name_the_right_ones():
    """Twelve ranks (rank 10 sorts before rank 2 by file name; verdicts go by rank): rank 11
    never reached seq 3; rank 10 sent a different size at seq 2; rank 4 still had seq 1
    scheduled when the others had completed it."""
    def entries(rank):
        out = []
        for s in (1, 2, 3):
            e = _entry("all_reduce", s, [[10 if (rank, s) == (10, 2) else 8]],
                       [[10 if (rank, s) == (10, 2) else 8]])
            e["state"] = "scheduled" if (rank, s) == (4, 1) else "completed"
            out.append(e)
        return out[:2] if rank == 11 else out
    v = _verdicts({r: entries(r) for r in range(12)})
    assert v["verdict"].tolist() == ["state", "mismatch", "missing"]
    assert v["seq"].tolist() == [1, 2, 3]
    assert "rank 4: scheduled" in v["detail"].iloc[0] and "rank 0: completed" in \
        v["detail"].iloc[0]
    assert "rank 0 [[8]], rank 10 [[10]]" in v["detail"].iloc[1]
    assert v["ranks_missing"].iloc[2] == [11] and v["ranks_present"].iloc[2] == \
        list(range(11))
    assert v["last_seq_of_missing"].iloc[2] == {11: 2}
    assert "gloo:all_reduce #2 in group 0 (default_pg), completed" in v["detail"].iloc[2]


def _at(entry, created_ns):
    return {**entry, "time_created_ns": created_ns}


def test_a_group_no_record_describes_is_the_ranks_that_issued_its_collectives():
    """gloo leaves a dump's pg_config empty and a folder of PyTorch's dumps has no run.json:
    a group named by no record is made of the ranks whose buffers hold its collectives — rank
    1 stopped short of rank 0 in it is missing; a group only rank 2 ever used has nobody else
    to miss."""
    dp = ("5", "mesh_dp")
    entries = lambda seqs, pg=dp: [_entry("all_reduce", s, [[1]], [[1]], pg)  # noqa: E731
                                   for s in seqs]
    v = _verdicts({0: entries([1, 2, 3]), 1: entries([1, 2]),
                   2: entries([1], ("7", "mesh_ep"))})
    assert v["verdict"].tolist() == ["missing"] and v["process_group"].tolist() == ["5"]
    assert v["ranks_missing"].iloc[0] == [1] and v["ranks_present"].iloc[0] == [0]


def test_verdicts_come_earliest_issued_first_whatever_the_groups_are_called():
    """Group "1" (tp) sorts before group "9" (ep), but the ep collective rank 1 never reached
    was issued a millisecond earlier (by the ranks that issued it): it comes first, and the
    hang names it."""
    tp, ep = ("1", "mesh_tp"), ("9", "mesh_ep")
    t0 = 10**18
    ranks = {0: [_at(_entry("all_to_all", 1, [[4]], [[4]], ep), t0),
                 _at(_entry("reduce_scatter", 1, [[4]], [[2]], tp), t0 + 10**6)],
             1: [],
             2: [_at(_entry("all_to_all", 1, [[4]], [[4]], ep), t0 + 5)],
             3: [_at(_entry("reduce_scatter", 1, [[4]], [[2]], tp), t0 + 10**6)]}
    run_groups = {"9": [0, 1, 2], "1": [0, 1, 3]}
    records = _dumps(ranks)
    records.pg_ranks.update(run_groups)
    v = fr.diagnose(records, None, pd.DataFrame())
    assert v["process_group"].tolist() == ["9", "1"]
    h = fr.hang(v)
    assert h.hung_ranks == [1] and h.first[0].op == "gloo:all_to_all"
    # Without creation times the order is the groups' and the sequence numbers'.
    for entries in ranks.values():
        for e in entries:
            e.pop("time_created_ns")
    records = _dumps(ranks)
    records.pg_ranks.update(run_groups)
    assert fr.diagnose(records, None, pd.DataFrame())["process_group"].tolist() == ["1", "9"]


def _row(group, seq, present, missing):
    return {"process_group": group, "group_desc": f"mesh_{group}", "seq": seq,
            "kind": "collective", "op": f"gloo:op_{group}", "verdict": "missing",
            "ranks_present": present, "ranks_missing": missing, "last_seq_of_missing": {},
            "detail": ""}


def test_a_rank_waiting_in_an_earlier_collective_is_not_hung():
    """The runner's hang (``--inject hang=2:3`` on dp=2,pp=2): ranks 0, 1, 3 issue an extra
    world all_reduce that rank 2 never reaches; rank 2 goes on to its dp all_reduce, which
    rank 0 — waiting in the world one — never reaches. Each misses a collective of the other,
    but rank 0 issued the earlier one: rank 2 is hung, rank 0 waits."""
    v = pd.DataFrame([_row("world", 1, [0, 1, 3], [2]), _row("dp", 9, [2], [0])])
    h = fr.hang(v)
    assert h.hung_ranks == [2] and h.waiting_ranks == [0] and h.count == 2
    assert [(f.process_group, f.ranks_missing) for f in h.first] == [("world", [2])]


def test_two_ranks_stuck_in_different_groups_are_both_hung():
    """Ranks 5 and 13 each miss the all_to_all of their own ep group (issued together) and
    then the reduce_scatter of their tp pair: both are hung, the first missed collective is
    the all_to_all of each group; nobody waits in an earlier collective."""
    v = pd.DataFrame([_row("ep1", 3, [1, 3, 7], [5]), _row("ep3", 3, [9, 11, 15], [13]),
                      _row("tp2", 6, [4], [5]), _row("tp6", 6, [12], [13])])
    h = fr.hang(v)
    assert h.hung_ranks == [5, 13] and h.waiting_ranks == []
    assert [f.process_group for f in h.first] == ["ep1", "ep3", "tp2", "tp6"]
    assert fr.hang(pd.DataFrame([{**_row("ep1", 3, [1, 3, 5, 7], []),
                                  "verdict": "mismatch"}])) is None


def test_entries_every_rank_holds_alike_can_still_disagree_with_themselves():
    """The same entry on every rank is judged too: an all_reduce whose output is not its
    input, an all_to_all whose ranks receive more than they send in all."""
    v = _verdicts({r: [_entry("all_reduce", 1, [[10]], [[12]])] for r in range(3)})
    assert v["verdict"].tolist() == ["mismatch"] and "all_reduce on rank 0" in \
        v["detail"].iloc[0]
    v = _verdicts({r: [_entry("all_to_all", 1, [[4, 8]], [[5, 8]])] for r in range(2)})
    assert v["verdict"].tolist() == ["mismatch"] and "send 64 elements in all but receive 80" \
        in v["detail"].iloc[0]


def test_a_rank_whose_buffer_holds_no_collective():
    """A middle pipeline stage on gloo records only sends and receives (no collective) in its
    buffer: no verdict among the pipeline's point-to-point ranks; beside a data-parallel pair
    it is simply not in their group. A rank whose buffer is empty while the default group's
    others went on is missing from each of their collectives."""
    send = {**_entry("send", 0, [[4]], [[4]]), "is_p2p": True, "p2p_seq_id": 1}
    dp = ("3", "mesh_dp")
    assert _verdicts({0: [send], 1: [send]}).empty
    assert _verdicts({0: [_entry("all_reduce", 1, [[8]], [[8]], pg=dp)],
                      1: [_entry("all_reduce", 1, [[8]], [[8]], pg=dp)], 2: [send]}).empty
    v = _verdicts({0: [_entry("all_reduce", 1, [[8]], [[8]])], 1: []})
    assert v["verdict"].tolist() == ["missing"] and v["ranks_missing"].iloc[0] == [1]
    assert "no recorded operation" in v["detail"].iloc[0]


def test_a_rank_holding_one_sequence_number_twice_is_judged_by_the_newer_entry():
    older, newer = _entry("all_reduce", 1, [[6]], [[6]]), _entry("all_reduce", 1, [[8]], [[8]])
    assert _verdicts({0: [older, newer], 1: [_entry("all_reduce", 1, [[8]], [[8]])]}).empty
    v = _verdicts({0: [newer, older], 1: [_entry("all_reduce", 1, [[8]], [[8]])]})
    assert v["verdict"].tolist() == ["mismatch"]


def test_long_buffers_are_held_as_a_few_bytes_an_entry():
    """64 ranks of 2,000 entries, the buffer of a long job: DDP's four bucket all-reduces step
    after step. Each entry is held as seven numbers, its op, sizes and dtypes once per distinct
    kind; the verdicts are those of the dicts: none, then rank 37 missing the last two."""
    buckets = [[[4096]], [[1 << 20]], [[3 << 18]], [[17]]]

    def buffer(n):
        return [_entry("all_reduce", s, buckets[s % 4], buckets[s % 4]) for s in range(1, n + 1)]
    full = buffer(2000)
    records = _dumps({r: full for r in range(64)})
    assert len(records) == 64 * 2000 and len(records.signatures) == 4
    assert records.nbytes <= 32 * len(records)
    assert fr.diagnose(records, None, pd.DataFrame()).empty
    short = _dumps({r: full if r != 37 else buffer(1998) for r in range(64)})
    v = fr.diagnose(short, None, pd.DataFrame())
    assert v["verdict"].tolist() == ["missing", "missing"] and v["seq"].tolist() == [1999, 2000]
    assert v["ranks_missing"].tolist() == [[37], [37]]


def test_warm_up_is_marked_and_never_slow():
    # Step 0 twice the others (warm-up), step 4 slow beyond the noise, the rest even.
    times = {0: 400.0, 1: 200.0, 2: 204.0, 3: 198.0, 4: 320.0, 5: 201.0, 6: 199.0}
    rows = [{"rank": r, "step": s, "wall_time_us": t * (1.0 if r == 0 else 0.97)}
            for s, t in times.items() for r in (0, 1)]
    rec = steps.analyse(pd.DataFrame(rows))
    assert rec.warmup_steps == [0] and rec.slow_steps == [4]
    assert rec.median_step_us == pytest.approx(200.5)
    heat = rec.heatmap
    assert heat.loc[heat["step"] == 0, "warmup"].all() and not heat.loc[heat["step"] == 0,
                                                                          "slow"].any()
    # Named warm-up steps are warm-up whatever their time.
    assert steps.analyse(pd.DataFrame(rows), named_warmup=2).warmup_steps == [0, 1]


def test_each_step_takes_its_slowest_ranks_time():
    """T(s), the slowest rank's wall time of each step (``steps.slowest_rank_per_step``), on
    three ranks whose slowest differs from step to step, the rows out of step order: step 3's
    slowest is rank 2, step 1's rank 0, step 2's rank 1 (ranks 0 and 1 tie on step 1). The
    optimizer column goes the same way (the planner's calibration reads it), NaN where no rank
    timed it; without step timers, an empty float Series."""
    walls = pd.DataFrame({
        "rank": [0, 1, 2, 0, 1, 2, 0, 1, 2],
        "step": [3, 3, 3, 1, 1, 1, 2, 2, 2],
        "wall_time_us": [100.0, 110.0, 130.0, 250.0, 250.0, 240.0, 90.0, 95.0, 80.0],
        "optimizer_us": [5.0, 7.0, 6.0, None, None, None, 3.0, None, 4.0]})
    got = steps.slowest_rank_per_step(walls)
    assert got.index.tolist() == [1, 2, 3]
    assert got.tolist() == [250.0, 95.0, 130.0]
    opt = steps.slowest_rank_per_step(walls, "optimizer_us")
    assert opt.index.tolist() == [1, 2, 3] and opt.isna().tolist() == [True, False, False]
    assert opt.loc[[2, 3]].tolist() == [4.0, 7.0]
    empty = steps.slowest_rank_per_step(pd.DataFrame(columns=["rank", "step", "wall_time_us"]))
    assert empty.empty and empty.dtype == float
    # throughput's step time is T of each step
    table = steps.throughput(walls.assign(loss=1.0), None)
    assert table["step"].tolist() == [1, 2, 3]
    assert table["step_time_us"].tolist() == [250.0, 95.0, 130.0]


def test_a_few_percent_is_not_a_slow_step():
    times = {0: 200.0, 1: 200.0, 2: 201.0, 3: 200.5, 4: 212.0, 5: 200.0}   # 4: +6%
    rows = [{"rank": 0, "step": s, "wall_time_us": t} for s, t in times.items()]
    assert steps.analyse(pd.DataFrame(rows)).slow_steps == []


def test_step_timers_are_read_as_the_columns_the_report_needs(tmp_path):
    """A long run's timers are millions of rows: the report reads four columns of them. A rank
    whose file lacks a column (a loss never written: a middle pipeline stage, or another tool)
    keeps its rows, and a loss written as nulls joins the others' as a number column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from meshscope.analysis.report.inputs import STEP_COLUMNS
    from meshscope.collectors import step_timer

    folder = tmp_path / "steps"
    folder.mkdir()
    full = {"rank": [0, 0], "step": [0, 1], "start_unix_s": [1.0, 2.0],
            "wall_time_us": [900.0, 400.0], "fwd_bwd_us": [1.0, 1.0], "optimizer_us": [1.0, 1.0],
            "tokens": [64, 64], "loss": [5.0, 4.5], "peak_memory_bytes": [10, 10]}
    pq.write_table(pa.table(full, schema=step_timer.SCHEMA), folder / "rank0.parquet")
    nulls = {**full, "rank": [1, 1], "loss": [None, None]}
    pq.write_table(pa.table(nulls, schema=step_timer.SCHEMA.set(
        step_timer.SCHEMA.get_field_index("loss"), pa.field("loss", pa.null()))),
        folder / "rank1.parquet")
    lacking = {k: v for k, v in {**full, "rank": [2, 2]}.items() if k != "loss"}
    pq.write_table(pa.table(lacking), folder / "rank2.parquet")
    steps_read, problems = step_timer.read_all(tmp_path, STEP_COLUMNS)
    assert problems == [] and list(steps_read.columns) == STEP_COLUMNS
    assert steps_read["rank"].tolist() == [0, 0, 1, 1, 2, 2]
    assert steps_read["loss"].dtype == "float64"
    assert steps_read["loss"].tolist()[:2] == [5.0, 4.5] and steps_read["loss"][2:].isna().all()
    assert steps.throughput(steps_read, None)["loss"].tolist() == [5.0, 4.5]
    everything, _ = step_timer.read_all(tmp_path)
    assert list(everything.columns) == list(step_timer.SCHEMA.names)


def test_a_long_run_is_shown_in_runs_of_steps_that_keep_the_worst():
    """3 ranks × 1,000 steps in at most 50 columns: the warm-up step and the three profiled
    steps keep their own columns; the others are cut into runs of equal length, every step in
    exactly one; rank 1's 9 ms step 333 shows in its run, and the run holding slow step 700 is
    flagged."""
    rows = []
    for r in range(3):
        for s in range(1000):
            rows.append({"rank": r, "step": s, "wall_time_us": 9000.0 if (r, s) == (1, 333)
                         else 2000.0 + s, "warmup": s == 0, "profiled": 500 <= s <= 502,
                         "slow": s == 700})
    runs = steps.heatmap_columns(pd.DataFrame(rows), max_columns=50)
    cols = runs.drop_duplicates("column").sort_values("column")
    assert len(cols) <= 50 and len(runs) == 3 * len(cols)
    covered = [s for a, b in zip(cols["first_step"], cols["last_step"]) for s in range(a, b + 1)]
    assert covered == list(range(1000))
    alone = cols[cols["first_step"] == cols["last_step"]]
    assert {0, 500, 501, 502} <= set(alone["first_step"])
    assert cols.loc[cols["warmup"], "first_step"].tolist() == [0]
    assert cols.loc[cols["profiled"], "first_step"].tolist() == [500, 501, 502]
    # Steps 1-499 and 503-999 in runs of 22 are 23 + 23 columns, 50 with the four alone; runs
    # of 21 would take 24 + 24.
    lengths = (cols["last_step"] - cols["first_step"] + 1)[~(cols["warmup"] | cols["profiled"])]
    assert len(cols) == 50 and lengths.max() == 22
    hit = runs[(runs["first_step"] <= 333) & (runs["last_step"] >= 333)]
    assert hit.set_index("rank")["wall_time_us"].to_dict() == {
        0: 2000.0 + hit["last_step"].iloc[0], 1: 9000.0, 2: 2000.0 + hit["last_step"].iloc[0]}
    flagged = cols[cols["slow"]]
    assert len(flagged) == 1 and flagged["first_step"].iloc[0] <= 700 <= \
        flagged["last_step"].iloc[0]
    short = pd.DataFrame(rows)[lambda d: d["step"] < 10]
    assert steps.heatmap_columns(short, max_columns=50)["last_step"].drop_duplicates() \
        .tolist() == list(range(10))
