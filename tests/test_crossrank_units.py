"""The cross-rank analysers on small hand-made inputs whose answer is known by construction:
the dependency graph and its what-if replay, wait regions, clock offsets, matching on the
world group, the layout map of foreign traces."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from meshscope.analysis import codes
from meshscope.analysis.comm import dims, matching
from meshscope.analysis.crossrank import clocks, whatif
from meshscope.analysis.crossrank.graph import (CALL, END, WAIT, Operation, Point, RankStep,
                                                StepGraph, waits_charged)
from meshscope.analysis.timeline import waits as wt


def _allreduce_step(work_us: dict[int, float], transfer_us: float = 2000.0,
                    tail_us: float = 5000.0) -> StepGraph:
    """Data-parallel ranks: own work, one all_reduce they all wait for, more own work."""
    done = max(work_us.values()) + transfer_us
    ranks = {r: RankStep(r, 0.0, [Point(CALL, w, w, "ar"), Point(WAIT, done, 0.0, "ar"),
                                  Point(END, done + tail_us, tail_us)])
             for r, w in work_us.items()}
    return StepGraph(0, ranks, {"ar": Operation("ar", "all_reduce", "dp", [], transfer_us, done)})


def test_three_ranks_one_ten_ms_slower_saves_ten_ms():
    g = _allreduce_step({0: 10_000.0, 1: 10_000.0, 2: 20_000.0})
    assert g.replay()[0] == pytest.approx(g.measured_makespan_us())       # the model is exact
    res = whatif.analyse({0: g}, None, {"ar": "all_reduce"}, {}, noise_us=0.0)
    saving = res.savings.set_index("rank")["saving_us"]
    assert saving[2] == pytest.approx(10_000.0)
    assert saving[0] == pytest.approx(0.0) and saving[1] == pytest.approx(0.0)
    assert res.straggler["rank"] == 2
    path = res.critical_path
    assert path.loc[path["kind"] == "work", "rank"].iloc[0] == 2          # through rank 2's work
    charged = {(w, c): us for w, c, us, _ in waits_charged(g)}
    assert charged == {(0, 2): pytest.approx(10_000.0), (1, 2): pytest.approx(10_000.0)}


def test_no_straggler_when_the_saving_is_within_the_noise():
    g = _allreduce_step({0: 10_000.0, 1: 10_200.0, 2: 10_000.0})
    res = whatif.analyse({0: g}, None, {"ar": "all_reduce"}, {}, noise_us=500.0)
    assert res.straggler is None
    assert res.savings["saving_us"].max() == pytest.approx(200.0)


def test_exposed_dimension_saving_is_its_transfer_on_the_critical_path():
    g = _allreduce_step({0: 10_000.0, 1: 10_000.0}, transfer_us=3000.0)
    res = whatif.analyse({0: g}, None, {"ar": "all_reduce"}, {}, noise_us=0.0)
    assert res.dim_savings == {"dp": pytest.approx(3000.0)}


def _pipeline_step(forward_us: tuple[float, float], backward_us: float = 4000.0,
                   hop_us: float = 100.0) -> StepGraph:
    """Two stages, one microbatch: F0 → send → F1, B1 → send → B0."""
    f0, f1 = forward_us
    t_send = f0
    t_recv0 = t_send + hop_us
    t_b1_end = t_recv0 + f1 + backward_us
    t_back = t_b1_end + hop_us
    s0 = RankStep(0, 0.0, [Point(CALL, t_send, f0, "a"), Point(CALL, t_send, 0.0, "g"),
                           Point(WAIT, t_back, 0.0, "g"), Point(END, t_back + backward_us,
                                                                 backward_us)])
    s1 = RankStep(1, 0.0, [Point(CALL, 0.0, 0.0, "a"), Point(WAIT, t_recv0, 0.0, "a"),
                           Point(CALL, t_b1_end, f1 + backward_us, "g"),
                           Point(END, t_b1_end, 0.0)])
    ops = {"a": Operation("a", "send/recv", "pp", [0, 1], hop_us, t_recv0),
           "g": Operation("g", "send/recv", "pp", [1, 0], hop_us, t_back)}
    return StepGraph(0, {0: s0, 1: s1}, ops)


def test_replay_each_runs_every_rank_s_what_if_at_once():
    """``replay_each`` gives, per rank, the makespan of replaying with that rank alone scaled:
    by construction stage 0's forward at a quarter (20 → 5 ms) saves 15 ms; stage 1 at half
    its work saves half of it (4.5 ms); and each equals ``replay`` with that rank alone
    scaled, also per point and when a wait's operation lacks a caller (released at its
    measured time, which is what a deadlocked replay does)."""
    g = _pipeline_step((20_000.0, 5_000.0))
    base = g.replay()[0]
    each = g.replay_each({0: np.array([0.25, 1.0, 1.0, 1.0]), 1: 0.5})
    assert base - each[0] == pytest.approx(15_000.0)
    assert base - each[1] == pytest.approx(4_500.0)
    lonely = _pipeline_step((20_000.0, 5_000.0))
    # Stage 1 waits for "g" before it calls it: both ranks block on "g" until the replay
    # releases it at its measured time.
    lonely.ranks[1].points.insert(2, Point(WAIT, 9_000.0, 1_000.0, "g"))
    lonely = StepGraph(0, lonely.ranks, lonely.ops)
    assert np.isfinite(lonely.replay()[0])
    for graph in (g, lonely):
        scales = {0: np.array([0.5, 1.0, 1.0, 2.0]), 1: 3.0}
        each = graph.replay_each(scales)
        for r, f in scales.items():
            assert each[r] == graph.replay({r: f})[0], r


def test_replay_each_in_several_passes_equals_one_replay_per_rank(monkeypatch):
    """Six data-parallel ranks, each one's what-if its own scale, replayed two ranks to a pass
    (three passes): each rank's makespan is that of ``replay`` with that rank alone scaled,
    to the bit, and by construction halving the slowest rank (30 ms → 15 ms, the next
    slowest at 25 ms) saves 5 ms."""
    g = _allreduce_step({0: 10_000.0, 1: 25_000.0, 2: 12_000.0, 3: 30_000.0, 4: 8_000.0,
                         5: 11_000.0})
    scales = {r: 0.5 for r in g.ranks}
    monkeypatch.setattr(StepGraph, "WHATIFS_PER_PASS", 2)
    each = g.replay_each(scales)
    assert sorted(each) == sorted(g.ranks)
    for r, f in scales.items():
        assert each[r] == g.replay({r: f})[0], r
    assert g.replay()[0] - each[3] == pytest.approx(5_000.0)


def test_a_stage_without_peers_is_held_against_the_other_stage():
    """pp=2, dp=1: stage 0's forward is 15 ms slower than stage 1's; with both stages of equal
    work content the saving of stage 0 at stage 1's pace is those 15 ms."""
    from meshscope.collectors.run_json import from_dict

    run = from_dict({"world_size": 2, "layout": {"pp": 2}, "schedule": "1f1b",
                     "microbatches": 1, "mesh": {"coordinates": {"0": {"pp": 0},
                                                                 "1": {"pp": 1}}},
                     "process_groups": [{"dimension": "pp", "ranks": [0, 1]}],
                     "pipeline": {"stages": 2, "virtual_stages": 1,
                                  "stage_layers": [[0, 1], [2, 3]]}}, "run.json")
    g = _pipeline_step((20_000.0, 5_000.0))
    assert g.replay()[0] == pytest.approx(g.measured_makespan_us())
    res = whatif.analyse({0: g}, run, {"a": "send", "g": "send"}, {}, noise_us=0.0)
    saving = res.savings.set_index("rank")["saving_us"]
    assert saving[0] == pytest.approx(15_000.0)
    assert res.straggler["rank"] == 0


def test_each_rank_is_held_against_its_stage_peers_present_in_the_step():
    """dp=3 × pp=2 with the stages interleaved over the ranks (stage 0: ranks 0, 2, 4; stage 1:
    ranks 1, 3, 5) and rank 4's trace missing from the step: each rank's peers are the other
    ranks of its stage that the step has, in rank order."""
    from meshscope.collectors.run_json import from_dict

    coords = {str(r): {"pp": r % 2, "dp": r // 2} for r in range(6)}
    run = from_dict({"world_size": 6, "layout": {"dp": 3, "pp": 2}, "schedule": "1f1b",
                     "microbatches": 1, "mesh": {"coordinates": coords},
                     "process_groups": [{"dimension": "pp", "ranks": [2 * d, 2 * d + 1]}
                                        for d in range(3)]}, "run.json")
    ranks = {r: RankStep(r, 0.0, [Point(END, 1_000.0 + r, 1_000.0 + r)]) for r in (0, 1, 2, 3, 5)}
    scales = whatif.reference_scales(StepGraph(0, ranks, {}), run, {}, {})
    assert {r: peers for r, (_, _, peers) in scales.items()} == {
        0: [2], 2: [0], 1: [3, 5], 3: [1, 5], 5: [1, 3]}
    # Held against its one present peer, rank 0 (1,000 µs) is scaled to rank 2's 1,002 µs.
    assert scales[0][0].tolist() == pytest.approx([1_002.0 / 1_000.0])


def test_expert_work_is_held_against_the_tokens_each_rank_received():
    """Two ep ranks: rank 1 received twice the tokens and computes twice as long after the
    dispatch all_to_all — that is its share of the work, not slowness."""
    from meshscope.collectors.run_json import from_dict

    run = from_dict({"world_size": 2, "layout": {"dp": 2, "ep": 2},
                     "mesh": {"coordinates": {"0": {"pp": 0, "dp": 0},
                                              "1": {"pp": 0, "dp": 1}}},
                     "process_groups": [{"dimension": "ep", "ranks": [0, 1], "name": "3"}]},
                    "run.json")
    expert = {0: 5_000.0, 1: 10_000.0}
    d_done = 1_000.0 + 500.0
    c_done = d_done + max(expert.values()) + 500.0
    ranks = {r: RankStep(r, 0.0, [Point(CALL, 1_000.0, 1_000.0, "dispatch"),
                                  Point(WAIT, d_done, 0.0, "dispatch"),
                                  Point(CALL, d_done + e, e, "combine"),
                                  Point(WAIT, c_done, 0.0, "combine"),
                                  Point(END, c_done + 1_000.0, 1_000.0)])
             for r, e in expert.items()}
    ops = {m: Operation(m, "all_to_all", "ep", [], 500.0, t)
           for m, t in (("dispatch", d_done), ("combine", c_done))}
    g = StepGraph(0, ranks, ops)
    received = {(0, "dispatch"): 1000.0, (1, "dispatch"): 2000.0}
    res = whatif.analyse({0: g}, run, {"dispatch": "all_to_all", "combine": "all_to_all"},
                         received, noise_us=0.0)
    assert res.savings["saving_us"].abs().max() == pytest.approx(0.0, abs=1e-6)
    assert res.straggler is None
    # The same step without the token counts: rank 1 looks 5 ms slow.
    res = whatif.analyse({0: g}, run, {"dispatch": "all_to_all", "combine": "all_to_all"}, {},
                         noise_us=0.0)
    assert res.straggler["rank"] == 1 and res.straggler["saving_us"] == pytest.approx(5_000.0)


def test_wait_regions():
    iv = lambda *pairs: np.array(pairs, dtype=np.float64)          # noqa: E731
    # A 70 ms stretch whose collective's range closes 1.7 ms after the thread went on.
    w, u = wt.wait_regions(iv((0.0, 70_000.0)), np.array([71_700.0]))
    assert w.tolist() == [[0.0, 70_000.0]] and u.tolist() == [71_700.0]
    # A 20 ms sleep with an operation completing in its middle is not a wait.
    w, _ = wt.wait_regions(iv((0.0, 20_000.0)), np.array([10_000.0]))
    assert len(w) == 0
    # One completion, a long stretch and a short gap both near it: the long stretch wins.
    w, u = wt.wait_regions(iv((0.0, 50_000.0), (51_000.0, 51_100.0)), np.array([51_500.0]))
    assert w.tolist() == [[0.0, 50_000.0]]
    # A range of the thread itself ends its stretch exactly, or not at all.
    assert len(wt.wait_regions(iv((0.0, 5_000.0)), np.array([5_400.0]),
                               late_us=wt.SAME_THREAD_US)[0]) == 0


def test_clock_offsets_from_collectives_and_messages():
    inst = pd.DataFrame({
        "rank": [0, 1, 0, 1], "p2p": [False] * 4, "match_id": ["a", "a", "b", "b"],
        "end_us": [100.0, 10_000_100.0, 200.0, 10_000_203.0]})
    off = clocks.clock_offsets(inst, None, [0, 1]).set_index("rank")
    assert off.loc[1, "offset_us"] == pytest.approx(10_000_001.5)   # the median of 10 s + 0, + 3 µs
    assert off.loc[1, "applied_us"] == off.loc[1, "offset_us"]
    # Messages both ways bound the offset: 0 → 1 received 4 µs "after" sending on rank 1's
    # clock, 1 → 0 received 2 µs after: offset(1) − offset(0) in [−2, 4], estimate 1 ± 3.
    p2p = pd.DataFrame({"src": [0, 1], "dst": [1, 0], "send_us": [0.0, 10.0],
                        "completion_us": [4.0, 12.0]})
    empty = inst.iloc[:0]
    off = clocks.clock_offsets(empty, p2p, [0, 1]).set_index("rank")
    assert off.loc[1, "offset_us"] == pytest.approx(1.0)
    assert off.loc[1, "uncertainty_us"] == pytest.approx(3.0)
    assert off.loc[1, "applied_us"] == 0.0                   # cannot be told from zero


def _bare_instances(rank_ops: dict[int, list[str]]) -> pd.DataFrame:
    rows = []
    for r, ops in rank_ops.items():
        for k, op in enumerate(ops):
            rows.append({"rank": r, "step": 0, "op": op, "p2p": False, "peer": pd.NA,
                         "pg_name": None, "pg_ranks": "", "group_size": pd.NA, "dim": "unknown",
                         "dim_source": "unknown", "seq": pd.NA, "k": k})
    df = pd.DataFrame(rows)
    df["seq"] = df["seq"].astype("Int64")
    return df


def test_no_group_information_matches_on_the_world_group():
    inst = _bare_instances({0: ["all_reduce", "broadcast"], 1: ["all_reduce", "broadcast"]})
    m = matching.match(inst, [0, 1], world_size=None, trace_world=2)
    assert m.matched_on == "world" and not m.why_not and m.notes
    assert set(m.instances["pg_ranks"]) == {"0,1"}
    assert m.instances.groupby("match_id")["rank"].nunique().eq(2).all()
    # A different sequence on one rank, or a world size that is not the number of traces:
    # nothing is invented.
    odd = _bare_instances({0: ["all_reduce"], 1: ["broadcast"]})
    assert matching.match(odd, [0, 1], trace_world=2).matched_on != "world"
    assert matching.match(inst, [0, 1], trace_world=8).why_not
    # The first match left its table as it was (the second, on it, found no group); matched
    # in place, the table given is the one returned, the same as a new one.
    assert set(inst["pg_ranks"]) == {""} and "match_id" not in inst
    own = matching.match(inst, [0, 1], trace_world=2, in_place=True)
    assert own.instances is inst
    pd.testing.assert_frame_equal(own.instances, m.instances)


def test_a_group_with_one_rank_missing_seq_matches_on_order():
    """Ranks 2 and 3 share two all-reduces; rank 3's have no seq (its Flight Recorder dump was
    not joined): both ranks are matched by order, so each all-reduce still meets its partner;
    the group {0, 1}, with seq everywhere, keeps seq."""
    inst = _bare_instances({r: ["all_reduce", "all_reduce"] for r in range(4)})
    inst["pg_ranks"] = inst["rank"].map({0: "0,1", 1: "0,1", 2: "2,3", 3: "2,3"})
    inst["seq"] = pd.array([11, 12, 11, 12, 11, 12, None, None], dtype="Int64")
    m = matching.match(inst, [0, 1, 2, 3], world_size=4)
    assert m.instances.groupby("match_id")["rank"].apply(sorted).tolist() == \
        [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert m.matched_on == "group_order"
    assert sum("seq=" in i for i in m.instances["match_id"]) == 4


def test_clock_offsets_chain_through_the_tightest_evidence():
    """Rank 2 is reached from rank 0 by messages (± 10 µs) or from rank 1 by loose messages
    (± 5 ms); rank 1 by collectives with rank 0 (± 0). The chain goes 0 → 2 directly."""
    inst = pd.DataFrame({"rank": [0, 1] * 3, "p2p": [False] * 6,
                         "match_id": ["a", "a", "b", "b", "c", "c"],
                         "end_us": [100.0, 100.0, 200.0, 200.0, 300.0, 300.0]})
    p2p = pd.DataFrame({"src": [0, 2, 1, 2, 1, 2], "dst": [2, 0, 2, 1, 2, 1],
                        "send_us": [0.0, 100.0, 0.0, 100.0, 0.0, 100.0],
                        # 0 <-> 2: 20 µs each way; 1 <-> 2: 10 ms each way (in both, 10 of them)
                        "completion_us": [20.0, 120.0, 10_000.0, 10_100.0, 10_000.0, 10_100.0]})
    p2p = pd.concat([p2p] * 5, ignore_index=True)
    off = clocks.clock_offsets(inst, p2p, [0, 1, 2]).set_index("rank")
    assert off.loc[1, "source"] == "collectives"
    assert off.loc[2, "source"] == "send/recv"
    assert off.loc[2, "uncertainty_us"] == pytest.approx(20.0)    # (20 + 20) / 2, not 10 ms


def test_clock_offsets_use_the_collectives_each_pair_shares():
    """Rank 1 is in all five collectives of rank 0, 5 ms ahead with one outlier; rank 2 in three
    of them, 2 ms behind rank 0 give or take 1 µs. Medians by hand: 5,000 µs (the outlier, +9 ms,
    moves no median) and −2,000 µs (of −2,001, −2,000, −1,999)."""
    ends_0 = [1_000.0, 2_000.0, 3_000.0, 4_000.0, 5_000.0]
    rows = [(0, f"c{i}", t) for i, t in enumerate(ends_0)]
    rows += [(1, f"c{i}", t + 5_000 + (9_000 if i == 3 else 0)) for i, t in enumerate(ends_0)]
    rows += [(2, f"c{i}", ends_0[i] - 2_000 + d) for i, d in ((0, -1.0), (2, 0.0), (4, 1.0))]
    inst = pd.DataFrame(rows, columns=["rank", "match_id", "end_us"]).assign(p2p=False)
    off = clocks.clock_offsets(inst, None, [0, 1, 2]).set_index("rank")
    assert off.loc[1, "offset_us"] == 5_000.0 and off.loc[1, "n"] == 5
    assert off.loc[1, "uncertainty_us"] == 0.0          # four of five differences agree
    assert off.loc[2, "offset_us"] == pytest.approx(-2_000.0) and off.loc[2, "n"] == 3
    assert off.loc[2, "source"] == "collectives"


def _offsets_by_brute_force(inst: pd.DataFrame, ranks: list[int]) -> dict[int, float]:
    """The chaining of clocks.py's docstring done the plain way, as a reference: every pair
    of ranks' median end difference over the collectives both took part in, and Dijkstra on
    the combined uncertainty, one heap entry per pair, smallest key first."""
    import heapq

    ends = inst.pivot_table(index="match_id", columns="rank", values="end_us")
    pair = {}
    for r in ranks:
        for q in ranks:
            if r != q:
                d = (ends[r] - ends[q]).dropna().to_numpy()
                if len(d):
                    med = float(np.median(d))
                    pair[(q, r)] = (med, float(np.median(np.abs(d - med))) * 1.4826, len(d))
    known, heap = {}, [((False, 0.0), ranks[0], 0.0, 0.0)]
    while heap:
        _, r, off, unc = heapq.heappop(heap)
        if r in known:
            continue
        known[r] = off
        for (giver, other), (est, e_unc, n) in pair.items():
            if giver == r and other not in known:
                combined = float(np.hypot(unc, e_unc))
                heapq.heappush(heap, ((n < 2, combined), other, off + est, combined))
    return known


def test_clock_offsets_of_overlapping_groups_equal_a_plain_chaining():
    """Twelve ranks on clocks set apart by known amounts, in a data-parallel group of the even
    ranks, one of the odd ranks and pairs {2k, 2k+1}, each collective's ends jittered by a
    few µs: the offsets found are the clocks' own (within the jitter) and those of a plain
    all-pairs Dijkstra written here (``clock_offsets`` keeps the evidence as rank × rank
    matrices and pushes only improving entries; the answers must not move)."""
    rng = np.random.default_rng(7)
    ranks = list(range(12))
    clock = {r: float(rng.uniform(-5e6, 5e6)) if r else 0.0 for r in ranks}
    groups = [list(range(0, 12, 2)), list(range(1, 12, 2))] + \
        [[2 * k, 2 * k + 1] for k in range(6)]
    rows, t = [], 0.0
    for g, members in enumerate(groups):
        for c in range(5):
            t += 1_000.0
            for r in members:
                rows.append((r, f"g{g}c{c}", t + clock[r] + float(rng.normal(0, 3.0))))
    inst = pd.DataFrame(rows, columns=["rank", "match_id", "end_us"]).assign(p2p=False)
    off = clocks.clock_offsets(inst, None, ranks).set_index("rank")
    plain = _offsets_by_brute_force(inst, ranks)
    for r in ranks:
        assert off.loc[r, "offset_us"] == pytest.approx(plain[r], abs=1e-6), r
        assert off.loc[r, "offset_us"] == pytest.approx(clock[r], abs=30.0), r


def test_a_large_group_is_named_in_match_ids_by_a_short_token():
    """A data-parallel group of 512 ranks: its ``pg_ranks`` is 2 kB of text. Match ids name it
    by a token of a few dozen characters (the text was repeated in every row's id, ranks ×
    rows × group size bytes in all), two groups of the same size get different tokens, and a
    group of a few ranks keeps its ranks as its name."""
    even, odd = ",".join(map(str, range(0, 1024, 2))), ",".join(map(str, range(1, 1024, 2)))
    assert len(even) > 2000
    token = matching.group_token(even)
    assert len(token) < 40 and token.startswith("0..1022/512#")
    assert matching.group_token(odd) != token
    assert matching.group_token(odd).startswith("1..1023/512#")
    assert matching.group_token("0,1") == "0,1"
    inst = _bare_instances({r: ["all_reduce", "all_reduce"] for r in range(0, 1024, 2)})
    inst["pg_ranks"] = even
    m = matching.match(inst, list(range(0, 1024, 2)), world_size=1024)
    ids = m.instances["match_id"]
    assert ids.nunique() == 2 and ids.str.len().max() < 60
    assert m.instances.groupby("match_id")["rank"].nunique().eq(512).all()


def test_why_a_large_group_was_not_matched_names_its_ranks_as_ranges():
    """A 128-rank group without sequence numbers where rank 4 saw two all-reduces and the
    others three, and a group of which ranks 130-131 have no trace: each reason names its
    group and its ranks by ranges — one line a reader can take in, not every rank's count
    (about 1,500 characters at 128 ranks before)."""
    ops = {r: ["all_reduce"] * (2 if r == 4 else 3) for r in range(130)}
    inst = _bare_instances(ops)
    inst["pg_ranks"] = np.where(inst["rank"] < 128, ",".join(map(str, range(128))),
                                ",".join(map(str, range(128, 132))))
    why = matching.match(inst, list(range(130)), world_size=132).why_not
    assert "group {0–127}: ranks saw different numbers of all_reduce in step 0 (3 on ranks " \
           "0–3, 5–127; 2 on rank 4); the traces are incomplete or subsampled" in why
    assert "group {128–131}: 2 of its 4 ranks have no trace" in why
    assert max(map(len, why)) < 150


def test_collective_table_of_known_arrivals():
    """Collective b: ranks 0, 2, 1 arrive at 10, 20, 30 µs; their kernels run 15–50, 25–51 and
    30–52 (the last rank's, 22 µs, is the operation); rank 0's row has no seq and no bytes.
    Collective a: ranks 1 and 0 arrive together at 5 µs, without executing spans; the tie keeps
    the table's order, so rank 0 (the later row) is last. Left out: c (one rank), a send/recv
    row that carries b's id, and a row without an id."""
    nan = float("nan")
    inst = pd.DataFrame({
        "match_id": ["b", "a", "c", "b", "a", "b", "b", ""],
        "rank": [1, 1, 0, 0, 0, 0, 2, 2],
        "p2p": [False, False, False, False, False, True, False, False],
        "arrival_us": [30.0, 5.0, 1.0, 10.0, 5.0, 0.0, 20.0, 0.0],
        "end_us": [52.0, 11.0, 2.0, 50.0, 9.0, 1.0, 51.0, 1.0],
        "exec_ts_us": [30.0, nan, nan, 15.0, nan, nan, 25.0, nan],
        "exec_end_us": [52.0, nan, nan, 50.0, nan, nan, 51.0, nan],
        "msg_bytes": pd.array([1024, 64, 8, None, 64, 8, 1024, 8], dtype="Int64"),
        "seq": pd.array([7, None, None, None, None, None, 7, None], dtype="Int64"),
        "pg_ranks": ["0,1,2", "0,1", "0", "0,1,2", "0,1", "", "0,1,2", ""],
        "dim": ["dp", "tp", "dp", "dp", "tp", "pp", "dp", "dp"],
        "step": [3, 3, 3, 3, 3, 3, 3, 3], "op": ["all_reduce"] * 8,
        "k": [0, 1, 2, 0, 1, 0, 0, 0]})
    out = matching.collective_table(inst).set_index("match_id")
    assert out.index.tolist() == ["a", "b"]
    b = out.loc["b"]
    assert (b["n_ranks"], b["first_arrival_us"], b["last_arrival_us"]) == (3, 10.0, 30.0)
    assert (b["skew_us"], b["holdup_us"], b["last_rank"]) == (20.0, 10.0, 1)
    assert (b["completion_us"], b["after_last_us"], b["transfer_us"]) == (51.0, 21.0, 22.0)
    assert (b["seq"], b["msg_bytes"], b["pg_ranks"], b["dim"], b["k"]) == \
        (7, 1024, "0,1,2", "dp", 0)
    a = out.loc["a"]
    assert (a["n_ranks"], a["skew_us"], a["holdup_us"], a["last_rank"]) == (2, 0.0, 0.0, 0)
    assert (a["completion_us"], a["after_last_us"], a["transfer_us"]) == (10.0, 5.0, 5.0)
    assert pd.isna(a["seq"]) and a["msg_bytes"] == 64 and a["dim"] == "tp"
    assert str(out["seq"].dtype) == "Int64" and str(out["msg_bytes"].dtype) == "Int64"
    # No id that two ranks share: an empty table of the same columns.
    assert matching.collective_table(inst[inst["match_id"] == "c"]).columns.tolist() == \
        matching.COLLECTIVE_COLUMNS


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["b|seq=2", "a|0|all_reduce|1", "0>1|0|0", "a|0|all_reduce|0",
                                 "é|1", "Z"]), max_size=40),
       st.integers(min_value=1, max_value=7))
def test_match_id_codes_are_pandas_factorize_in_chunks(ids, chunk):
    """``id_codes`` factorizes a few rows at a time; its answer is ``pd.factorize``'s, in the
    order of first appearance and sorted, whatever the chunk."""
    values = np.array(ids, dtype=object)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(codes, "ID_CHUNK_ROWS", chunk)
        for sort in (False, True):
            found, uniques = codes.id_codes(values, sort=sort)
            theirs, their_uniques = pd.factorize(values, sort=sort)
            assert found.tolist() == theirs.tolist()
            assert list(uniques) == list(their_uniques)


def test_clock_offsets_read_a_rank_s_known_end_of_a_collective():
    """Rank 1 has two rows of collective a, the first without an end: its known end (10 s
    late, like its end of b) is the evidence; rank 0's send/recv row before its row of a is
    not."""
    nan = float("nan")
    inst = pd.DataFrame({
        "rank": [0, 0, 1, 1, 0, 1], "p2p": [True, False, False, False, False, False],
        "match_id": ["a", "a", "a", "a", "b", "b"],
        "end_us": [5.0, 100.0, nan, 10_000_100.0, 200.0, 10_000_202.0]})
    off = clocks.clock_offsets(inst, None, [0, 1]).set_index("rank")
    assert off.loc[1, "offset_us"] == pytest.approx(10_000_001.0)     # median of 0 and 2 µs
    assert off.loc[1, "n"] == 2


def test_p2p_table_pairs_one_send_with_one_recv():
    """m1: a send (bytes unknown on the sender) and its recv; m2: two sends and a recv (not a
    pair); m3: a send alone. Only m1 becomes a row, its bytes from the receiver."""
    inst = pd.DataFrame({
        "rank": [0, 1, 0, 0, 1, 2], "step": [3] * 6, "k": [0, 0, 1, 1, 1, 2],
        "op": ["send", "recv", "send", "send", "recv", "send"], "p2p": [True] * 6,
        "match_id": ["m1", "m1", "m2", "m2", "m2", "m3"], "dim": ["pp"] * 6,
        "arrival_us": [100.0, 40.0, 0.0, 0.0, 0.0, 0.0],
        "end_us": [110.0, 130.0, 1.0, 1.0, 1.0, 1.0],
        "msg_bytes": pd.array([None, 4096, 8, 8, 8, 8], dtype="Int64")})
    pairs = matching.p2p_table(inst)
    assert pairs[["match_id", "src", "dst", "step", "k"]].values.tolist() == [["m1", 0, 1, 3, 0]]
    row = pairs.iloc[0]
    assert (row["send_us"], row["recv_us"], row["completion_us"]) == (100.0, 40.0, 130.0)
    assert row["after_last_us"] == 30.0        # from the later of the two arrivals to the end
    assert pd.isna(row["transfer_us"])          # no executing spans: transfer not separable
    assert row["msg_bytes"] == 4096
    assert matching.p2p_table(inst[inst["match_id"] != "m1"]).empty


@pytest.mark.parametrize("order,tp_group,dp_group", [
    ("tp-dp-pp", "0,1", "0,2"),          # tp fastest: Megatron/torchtitan style
    ("dp-tp-pp", "0,2", "0,1"),
    ("megatron", "0,1", "0,2"),
])
def test_layout_map_of_a_foreign_job(order, tp_group, dp_group):
    groups = dims.LayoutMap.parse("dp=2,tp=2,pp=2", order).groups()
    assert groups[tp_group] == "tp" and groups[dp_group] == "dp"
    assert groups["0,4"] == "pp"
    assert len([g for g, d in groups.items() if d == "tp"]) == 4


def test_layout_map_refuses_what_it_cannot_place():
    with pytest.raises(ValueError, match="--rank-order"):
        dims.LayoutMap.parse("dp=2,tp=2", "dp-pp")
    with pytest.raises(ValueError, match="--layout part"):
        dims.LayoutMap.parse("dp=two", None)


def test_each_wait_of_the_timeline_table_names_the_dimension_it_overlaps():
    """The aligned timeline's wait rows (``timeline/segments.py``) on one hand-made rank: a
    wait takes the first dimension, in the rank's order, whose communication overlaps it; one
    that only touches a dimension's interval at an end, or overlaps none, is "unknown"; the
    cause is the rank the graph charged for the wait that ends there."""
    from meshscope.analysis.timeline import segments
    from meshscope.analysis.timeline.rank_timeline import RankTimeline

    iv = lambda *pairs: np.array(pairs, dtype=np.float64).reshape(-1, 2)  # noqa: E731
    waits = iv((10, 20), (20, 25), (30, 40), (45, 50), (60, 70), (80, 90))
    tl = RankTimeline(rank=3, on_gpu=False, compute=iv(), comm=iv(),
                      comm_by_dim={"tp": iv((15, 18), (40, 45)), "dp": iv((25, 30), (39, 41),
                                                                          (81, 82)),
                                   "pp": iv((85, 86))},
                      other=iv(), steps={7: (0.0, 100.0)}, pipeline=iv(),
                      microbatches=pd.DataFrame(columns=["ts_us", "end_us"]), span=(0.0, 100.0),
                      scopes=(np.zeros(0), np.zeros(0), []), trace_compute=iv(), trace_comm=iv(),
                      waits=waits, wait_until=waits[:, 1].copy())
    table = segments.segments({3: tl}, {}, [(7, 3, 5, 4.0, 70.0)])
    got = table[table["kind"] == "wait"]
    assert got[["start_us", "end_us"]].to_numpy().tolist() == waits.tolist()
    assert got["dim"].tolist() == ["tp", "unknown", "dp", "unknown", "unknown", "dp"]
    assert got["cause"].tolist() == [-1, -1, -1, -1, 5, -1]
