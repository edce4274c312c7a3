"""The Flight Recorder verdict rules (``analysis/records/flight_recorder.py``) one by one, on
hand-made entries whose verdict follows from torchfrtrace's rules as the module docstring
states them (issue 52 item 1: the module had not been mutation-scored), each with the healthy
twin it must pass, and the rows' words said whole."""
from __future__ import annotations

import msgspec
import pandas as pd

from meshscope.analysis.records import flight_recorder as fr
from meshscope.analysis.records.fr_table import FlightRecords, Signature
from meshscope.collectors.flight_recorder import Dump
from meshscope.collectors.run_json import from_dict


def _sig(op, inp, out, in_dt=("Float",), out_dt=("Float",), backend="nccl"):
    return Signature(f"{backend}:{op}", inp, out, list(in_dt), list(out_dt))


def test_the_op_itself_must_agree():
    why = fr.mismatch({0: _sig("all_reduce", [[4]], [[4]]),
                       2: _sig("all_gather", [[4]], [[8]])}, 2)
    assert why == "ranks issued different ops: rank 0: nccl:all_reduce, rank 2: nccl:all_gather"
    # the backend prefix and a p2p suffix are not the op
    assert fr.mismatch({0: _sig("all_reduce", [[4]], [[4]]),
                        1: _sig("all_reduce", [[4]], [[4]], backend="gloo")}, 2) is None


def test_sizes_each_op_allows_to_differ():
    # all_to_all and scatter: inputs may differ; all_to_all and gather: outputs may
    assert fr.mismatch({0: _sig("scatter", [[2, 8]], [[8]]), 1: _sig("scatter", [[]], [[8]])},
                       2) is None
    assert fr.mismatch({0: _sig("gather", [[8]], [[2, 8]]), 1: _sig("gather", [[8]], [[]])},
                       2) is None
    assert fr.mismatch({0: _sig("scatter", [[8]], [[8]]), 1: _sig("scatter", [[8]], [[9]])},
                       2) == "scatter output sizes differ: rank 0 [[8]], rank 1 [[9]]"
    assert fr.mismatch({0: _sig("gather", [[8]], [[8]]), 1: _sig("gather", [[9]], [[8]])},
                       2) == "gather input sizes differ: rank 0 [[8]], rank 1 [[9]]"
    assert fr.mismatch({0: _sig("broadcast", [[8]], [[8]]),
                        1: _sig("broadcast", [[8]], [[9]])}, 2) == \
        "broadcast output sizes differ: rank 0 [[8]], rank 1 [[9]]"
    # the reference is the first rank given, whatever its number
    assert fr.mismatch({3: _sig("reduce_scatter", [[8]], [[4]]),
                        1: _sig("reduce_scatter", [[8]], [[4]]),
                        5: _sig("reduce_scatter", [[6]], [[4]])}, 3) == \
        "reduce_scatter input sizes differ: rank 3 [[8]], rank 5 [[6]]"


def test_an_all_reduce_must_output_its_input():
    assert fr.mismatch({0: _sig("allreduce_coalesced", [[4], [2]], [[4], [3]]),
                        1: _sig("allreduce_coalesced", [[4], [2]], [[4], [3]])}, 2) == \
        "all_reduce on rank 0: input [[4], [2]] ≠ output [[4], [3]]"
    assert fr.mismatch({0: _sig("all_reduce", [[4]], [[4]])}, 1) is None
    # an all_gather's output is not its input, by design
    assert fr.mismatch({0: _sig("all_gather", [[4]], [[8]])}, 1) is None


def test_dtypes_must_agree_except_where_a_root_differs():
    f32, bf16 = ("Float",), ("BFloat16",)
    assert fr.mismatch({0: _sig("all_reduce", [[4]], [[4]], f32, f32),
                        1: _sig("all_reduce", [[4]], [[4]], bf16, bf16)}, 2) == \
        ("all_reduce: ranks disagree on dtypes [(('BFloat16',), ('BFloat16',)), "
         "(('Float',), ('Float',))]")
    # the outputs alone
    assert fr.mismatch({0: _sig("all_gather", [[4]], [[8]], f32, f32),
                        1: _sig("all_gather", [[4]], [[8]], f32, bf16)}, 2) is not None
    for op in ("scatter", "gather", "broadcast"):
        assert fr.mismatch({0: _sig(op, [[4]], [[4]], f32, f32),
                            1: _sig(op, [[4]], [[4]], bf16, bf16)}, 2) is None, op
    # an entry without tensors on one side says no dtype
    assert fr.mismatch({0: _sig("all_gather", [[4]], [[8]], f32, f32),
                        1: Signature("nccl:all_gather", [[4]], [], [], [])}, 2) is not None
    assert fr.mismatch({0: _sig("reduce_scatter", [[4]], [[2]], f32, f32),
                        1: Signature("nccl:reduce_scatter", [[4]], [[2]], None, None)},
                       2) is not None


def test_an_all_to_all_sends_what_it_receives_when_the_whole_group_is_there():
    """Rank 0 sends 4×8, rank 1 4×8 (64 in all); they receive 4×8 and 5×8 (72)."""
    bad = {0: _sig("all_to_all", [[4, 8]], [[4, 8]]), 1: _sig("all_to_all", [[4, 8]], [[5, 8]])}
    assert fr.mismatch(bad, 2) == (
        "all_to_all: the ranks send 64 elements in all but receive 72 — their split sizes "
        "disagree (rank 0: in 32, out 32, rank 1: in 32, out 40)")
    # one rank of a group of three missing: what the absent one receives is unknown
    assert fr.mismatch(bad, 3) is None
    # uneven splits that add up
    assert fr.mismatch({0: _sig("all_to_all", [[3, 8]], [[5, 8]]),
                        1: _sig("all_to_all", [[5, 8]], [[3, 8]])}, 2) is None
    # sizes that are not lists of ints are not added up (a 0-d tensor, [[]], is one element)
    for odd in ([], [[4, True]], [["4", 8]], None, [4, 8]):
        assert fr.mismatch({0: _sig("all_to_all", odd, [[4, 8]]),
                            1: _sig("all_to_all", [[4, 8]], [[5, 8]])}, 2) is None, odd


def _entry(op, seq, size, pg=("0", "default_pg"), state="completed", created=None):
    e = {"profiling_name": f"nccl:{op}", "process_group": list(pg), "collective_seq_id": seq,
         "p2p_seq_id": 0, "is_p2p": False, "input_sizes": [[size]], "output_sizes": [[size]],
         "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": state}
    if created is not None:
        e["time_created_ns"] = created
    return e


def _records(per_rank) -> FlightRecords:
    return FlightRecords.of(msgspec.convert(
        {"schema_version": 1, "rank": r, "flight_recorder": {"entries": e}}, Dump)
        for r, e in per_rank.items())


def test_a_missing_rank_is_named_with_its_last_step_and_operation():
    """Ranks 0 and 1 reached all_reduce #2 of group 0; rank 2 stopped at #1; its step timers
    last finished step 7."""
    per = {r: [_entry("all_reduce", 1, 8)] + ([_entry("all_reduce", 2, 8)] if r < 2 else [])
           for r in range(3)}
    steps = pd.DataFrame({"rank": [0, 1, 2, 2], "step": [9, 9, 6, 7]})
    v = fr.diagnose(_records(per), None, steps)
    assert list(v.columns) == fr.COLUMNS
    row = v.iloc[0].to_dict()
    assert {k: row[k] for k in ("process_group", "group_desc", "seq", "kind", "op",
                                "verdict", "ranks_present", "ranks_missing",
                                "last_seq_of_missing")} == {
        "process_group": "0", "group_desc": "default_pg", "seq": 2, "kind": "collective",
        "op": "nccl:all_reduce", "verdict": "missing", "ranks_present": [0, 1],
        "ranks_missing": [2], "last_seq_of_missing": {2: 1}}
    assert row["detail"] == (
        "ranks [2] of group 0 (default_pg) never reached sequence number 2 (nccl:all_reduce); "
        "rank 2 last finished step 7, its last operation nccl:all_reduce #1 in group 0 "
        "(default_pg), completed")
    # without step timers: the operation only
    v = fr.diagnose(_records(per), None, pd.DataFrame())
    assert v["detail"].iloc[0].endswith(
        "; rank 2's last operation nccl:all_reduce #1 in group 0 (default_pg), completed")
    # timers of the others only: rank 2 finished no step
    v2 = fr.diagnose(_records(per), None, steps[steps["rank"] < 2])
    assert "rank 2 last finished step none, its last operation" in v2["detail"].iloc[0]
    h = fr.hang(v)
    assert h.hung_ranks == [2] and h.waiting_ranks == [] and h.count == 1
    assert h.first == [fr.FirstMissed("0", "default_pg", 2, "nccl:all_reduce", [2])]


def test_run_json_names_the_groups_members():
    """Group "5" of run.json is ranks 0 and 2: rank 1, which holds none of it, is not missing
    from it; rank 2, in it and stopped short, is. The default group is every rank of the
    world, so rank 3, which left no dump, is judged in none."""
    run = from_dict({"world_size": 4, "layout": {"dp": 4},
                     "process_groups": [{"dimension": "dp", "ranks": [0, 2], "name": "5"}]},
                    "run.json")
    dp = ("5", "mesh_dp")
    per = {0: [_entry("all_reduce", 1, 8, dp), _entry("all_reduce", 2, 8, dp)],
           1: [_entry("broadcast", 1, 8)],
           2: [_entry("all_reduce", 1, 8, dp)]}
    per[0].append(_entry("broadcast", 1, 8))
    per[2].append(_entry("broadcast", 1, 8))
    v = fr.diagnose(_records(per), run, pd.DataFrame())
    assert v["verdict"].tolist() == ["missing"]
    assert v["process_group"].tolist() == ["5"] and v["ranks_missing"].tolist() == [[2]]


def test_the_state_and_mismatch_rows_and_their_order():
    """Group 0's #1: rank 1 still started while rank 0 completed (a state row); #2: the ranks
    reduce different sizes (a mismatch) and were issued first (created earlier)."""
    per = {0: [_entry("all_reduce", 1, 8, created=2_000), _entry("all_reduce", 2, 8,
                                                                 created=1_000)],
           1: [_entry("all_reduce", 1, 8, state="started", created=2_500),
               _entry("all_reduce", 2, 6, created=1_500)]}
    v = fr.diagnose(_records(per), None, pd.DataFrame())
    assert v[["seq", "verdict"]].values.tolist() == [[2, "mismatch"], [1, "state"]]
    assert v["detail"].tolist() == [
        "group 0 (default_pg) sequence number 2: all_reduce input sizes differ: rank 0 [[8]], "
        "rank 1 [[6]]",
        "states rank 0: completed, rank 1: started"]
    assert v["ranks_missing"].tolist() == [[], []]
    assert v["last_seq_of_missing"].tolist() == [{}, {}]
    assert fr.hang(v) is None
    healthy = {r: [_entry("all_reduce", 1, 8), _entry("all_reduce", 2, 8)] for r in (0, 1)}
    assert fr.diagnose(_records(healthy), None, pd.DataFrame()).empty
    assert fr.hang(None) is None


def test_the_hang_keeps_each_groups_earliest_missed_collective():
    """Rank 2 misses group a's #4 and then #3 (the verdicts' order is by issue time, the
    sequence numbers decide each group's first); rank 5 waits in a's #3 — issued by it —
    and so misses b's #1."""
    def row(group, seq, present, missing):
        return {"process_group": group, "group_desc": f"mesh_{group}", "seq": seq,
                "kind": "collective", "op": f"nccl:op{seq}", "verdict": "missing",
                "ranks_present": present, "ranks_missing": missing,
                "last_seq_of_missing": {}, "detail": ""}
    v = pd.DataFrame([row("a", 4, [0, 5], [2]), row("a", 3, [0, 5], [2]),
                      row("b", 1, [2], [5])])
    h = fr.hang(v)
    assert h.hung_ranks == [2] and h.waiting_ranks == [5] and h.count == 3
    assert h.first == [fr.FirstMissed("a", "mesh_a", 3, "nccl:op3", [2])]


def test_a_rank_that_never_issued_in_the_group_reached_no_sequence_number():
    v = fr.diagnose(_records({0: [_entry("all_reduce", 1, 8)], 1: []}), None, pd.DataFrame())
    assert v["ranks_missing"].tolist() == [[1]]
    assert v["last_seq_of_missing"].tolist() == [{1: -1}]
