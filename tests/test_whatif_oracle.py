"""``analysis/crossrank/whatif.py``'s other answers — each stage's work content, the reference
of a rank whose peers' calls differ or that has no peers, the savings table's other columns
and the stage balance — against hand-made inputs whose answer is known by construction
(issue 52 item 1: the mutants of those parts survived every fast test; the straggler itself is
``test_straggler_oracle.py``'s).

Work content: a model of identical dense layers, so a stage of two layers holds twice one of
one, and the last stage holds the output head too, 6·h·V FLOPs a token (forward 2·h·V,
backward twice that). Pipelines: one microbatch through two stages runs the stages one after
another, so balancing the stages moves work without shortening the step."""
from __future__ import annotations

import numpy as np
import pytest

from meshscope.analysis.crossrank import whatif
from meshscope.analysis.crossrank.graph import CALL, END, WAIT, Operation, Point, RankStep, \
    StepGraph
from meshscope.collectors.run_json import from_dict

DIM, VOCAB = 64, 1000


def _pp_run(p: int, *, stage_layers=None, virtual: int = 1, schedule: str = "1f1b",
            model: dict | None = None):
    pipeline: dict = {"stages": p, "virtual_stages": virtual}
    if stage_layers is not None:
        pipeline["stage_layers"] = stage_layers
    d = {"world_size": p, "layout": {"pp": p}, "schedule": schedule, "microbatches": 1,
         "mesh": {"coordinates": {str(r): {"pp": r} for r in range(p)}},
         "process_groups": [{"dimension": "pp", "ranks": list(range(p))}],
         "pipeline": pipeline}
    if model is not None:
        d["model"] = model
    return from_dict(d, "run.json")


def _dense(n_layers: int, **kw) -> dict:
    return {"dim": DIM, "n_layers": n_layers, "n_heads": 4, "ffn_hidden": 4 * DIM,
            "seq_len": 32, "vocab_size": VOCAB, **kw}


# -- stage_work_units ------------------------------------------------------------------------

def test_without_a_model_a_stages_work_is_its_layer_count():
    assert whatif.stage_work_units(_pp_run(2, stage_layers=[[0, 1], [2, 3, 4]])) == \
        {0: 2.0, 1: 3.0}
    # no layer placement either: one unit a stage
    assert whatif.stage_work_units(_pp_run(2)) == {0: 1.0, 1: 1.0}
    # a model that names its sequence but not its width is no model to count FLOPs of
    assert whatif.stage_work_units(_pp_run(2, stage_layers=[[0], [1, 2]],
                                           model={"seq_len": 32, "n_layers": 3})) == \
        {0: 1.0, 1: 2.0}
    assert whatif.stage_work_units(None) == {}
    assert whatif.stage_work_units(_pp_run(1)) == {}


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_a_v_schedule_holds_global_stages_s_and_2p_minus_1_minus_s(schedule):
    """p=2, two chunks a rank: in a V rank-stage 0 holds global stages 0 and 3 (1 + 8 layers),
    rank-stage 1 stages 1 and 2 (2 + 4); in the loop placement 0 and 2 (1 + 4), 1 and 3
    (2 + 8)."""
    layers = [[0], [1, 2], [3, 4, 5, 6], list(range(7, 15))]
    assert whatif.stage_work_units(_pp_run(2, stage_layers=layers, virtual=2,
                                           schedule=schedule)) == {0: 9.0, 1: 6.0}
    assert whatif.stage_work_units(_pp_run(2, stage_layers=layers, virtual=2,
                                           schedule="interleaved-1f1b")) == {0: 5.0, 1: 10.0}


def test_the_last_stage_holds_the_output_head():
    """Identical dense layers: two layers are twice one; the last stage's excess over the same
    layers elsewhere is the head, 6·h·V a token."""
    head = 6 * DIM * VOCAB
    placed = whatif.stage_work_units(_pp_run(2, stage_layers=[[0, 1], [2, 3]],
                                             model=_dense(4)))
    assert placed[0] > 0
    assert placed[1] - placed[0] == pytest.approx(head)
    one = whatif.stage_work_units(_pp_run(3, stage_layers=[[0], [1, 2], [3]],
                                          model=_dense(4)))
    assert one[1] == pytest.approx(2 * one[0])
    assert one[2] - one[0] == pytest.approx(head)
    # layers unknown: each stage one average layer, the head still on the last
    unplaced = whatif.stage_work_units(_pp_run(2, model=_dense(4)))
    assert 2 * unplaced[0] == pytest.approx(placed[0])
    assert unplaced[1] - unplaced[0] == pytest.approx(head)
    # no vocabulary given: no head anywhere
    novocab = whatif.stage_work_units(_pp_run(2, stage_layers=[[0, 1], [2, 3]],
                                              model={**_dense(4), "vocab_size": None}))
    assert novocab[0] == pytest.approx(placed[0]) and novocab[1] == pytest.approx(placed[0])
    # key/value heads without query heads say nothing: one head, as many key/value heads
    headless = {**_dense(4), "n_heads": None}
    assert whatif.stage_work_units(_pp_run(2, stage_layers=[[0, 1], [2, 3]],
                                           model={**headless, "n_kv_heads": 2})) == \
        pytest.approx(whatif.stage_work_units(_pp_run(2, stage_layers=[[0, 1], [2, 3]],
                                                      model=headless)))


def test_an_moe_model_without_top_k_or_period_counts_top_2_every_layer():
    """run.json without ``moe_top_k`` nor ``moe_every``: the runner's defaults, top-2 experts
    on every layer — the same work as a model that says so, and more than a top-1 one."""
    moe = {**_dense(2), "moe_experts": 4, "moe_hidden": 2 * DIM}

    def units(m: dict) -> dict[int, float]:
        return whatif.stage_work_units(_pp_run(2, stage_layers=[[0], [1]], model=m))

    implicit = units(moe)
    assert implicit == pytest.approx(units({**moe, "moe_top_k": 2, "moe_every": 1}))
    assert implicit[0] > units({**moe, "moe_top_k": 1, "moe_every": 1})[0]
    assert implicit[0] > units({**moe, "moe_top_k": 2, "moe_every": 2})[0]


# -- reference_scales ------------------------------------------------------------------------

def _ar_rank(r: int, work_us: float, extra_call: bool = False) -> RankStep:
    pts = [Point(CALL, work_us, work_us, "ar"), Point(WAIT, 20_000.0, 0.0, "ar")]
    if extra_call:
        pts += [Point(CALL, 21_000.0, 1_000.0, "x"), Point(WAIT, 22_000.0, 0.0, "x")]
    pts.append(Point(END, 25_000.0, 3_000.0))
    return RankStep(r, 0.0, pts)


def test_a_rank_whose_calls_differ_is_held_to_its_peers_whole_step():
    """Rank 0 makes one more call than ranks 1 and 2 (its own work 8 + 1 + 3 = 12 ms; theirs
    10 + 3 = 13 and 6 + 3 = 9 ms): it is scaled whole to their median own work, 11 ms; ranks
    1 and 2 are held against each other segment by segment."""
    ranks = {0: _ar_rank(0, 8_000.0, extra_call=True), 1: _ar_rank(1, 10_000.0),
             2: _ar_rank(2, 6_000.0)}
    ops = {"ar": Operation("ar", "all_reduce", "dp", [], 1_000.0, 20_000.0),
           "x": Operation("x", "all_gather", "dp", [], 1_000.0, 22_000.0)}
    got = whatif.reference_scales(StepGraph(0, ranks, ops), None,
                                  {"ar": "all_reduce", "x": "all_gather"}, {})
    assert sorted(got) == [0, 1, 2]
    scale0, ref0, peers0 = got[0]
    assert scale0.tolist() == pytest.approx([11_000.0 / 12_000.0] * 5)
    assert ref0 == "stage peers [1, 2] (whole step: their calls differ)" and peers0 == [1, 2]
    scale1, ref1, peers1 = got[1]
    assert peers1 == [2] and ref1 == "stage peers [2]"
    # its 10 ms up to the all-reduce held to rank 2's 6 ms; the wait and the 3 ms after to
    # rank 2's 3 ms
    assert scale1.tolist() == pytest.approx([0.6, 1.0, 1.0])
    assert got[2][0].tolist() == pytest.approx([10_000.0 / 6_000.0, 1.0, 1.0])


def test_every_stage_without_peers_is_held_to_the_other_stages_per_unit():
    """pp=3, stage layers 1, 2, 1; own work 10, 20, 13 ms — 10, 10, 13 ms a layer: each stage's
    reference is the median of the other stages' per-layer pace × its layers."""
    run = _pp_run(3, stage_layers=[[0], [1, 2], [3]])
    ranks = {r: RankStep(r, 0.0, [Point(END, w, w)])
             for r, w in ((0, 10_000.0), (1, 20_000.0), (2, 13_000.0))}
    got = whatif.reference_scales(StepGraph(0, ranks, {}), run, {}, {})
    assert {r: ref for r, (_, ref, _) in got.items()} == {
        r: "other stages, per unit of work" for r in (0, 1, 2)}
    assert got[0][0].tolist() == pytest.approx([11_500.0 / 10_000.0])
    assert got[1][0].tolist() == pytest.approx([23_000.0 / 20_000.0])
    assert got[2][0].tolist() == pytest.approx([10_000.0 / 13_000.0])
    # a stage whose rank did no work of its own has nothing to scale: no reference
    idle = {0: RankStep(0, 0.0, [Point(END, 10_000.0, 10_000.0)]),
            1: RankStep(1, 0.0, [Point(END, 10_000.0, 0.0)])}
    got = whatif.reference_scales(StepGraph(0, idle, {}), _pp_run(2), {}, {})
    assert got[1][1] == "none" and got[1][0].tolist() == [1.0]


# -- the savings table and the stage balance --------------------------------------------------

def _pipeline_step(step: int, f0: float, f1: float, backward: float = 4_000.0,
                   hop: float = 100.0) -> StepGraph:
    """Two stages, one microbatch: F0 → send → F1 B1 → send → B0 (own work: stage 0 f0 + b,
    stage 1 f1 + b); every step starts 100 ms after the last."""
    t0 = step * 100_000.0
    t_send = t0 + f0
    t_recv0 = t_send + hop
    t_b1_end = t_recv0 + f1 + backward
    t_back = t_b1_end + hop
    s0 = RankStep(0, t0, [Point(CALL, t_send, f0, "a"), Point(CALL, t_send, 0.0, "g"),
                          Point(WAIT, t_back, 0.0, "g"),
                          Point(END, t_back + backward, backward)])
    s1 = RankStep(1, t0, [Point(CALL, t0, 0.0, "a"), Point(WAIT, t_recv0, 0.0, "a"),
                          Point(CALL, t_b1_end, f1 + backward, "g"), Point(END, t_b1_end, 0.0)])
    ops = {"a": Operation("a", "send/recv", "pp", [0, 1], hop, t_recv0),
           "g": Operation("g", "send/recv", "pp", [1, 0], hop, t_back)}
    return StepGraph(step, {0: s0, 1: s1}, ops)


OPS = {"a": "send", "g": "send"}


def test_the_stage_balance_of_a_serial_pipeline_saves_nothing():
    """Stage 0 owns 24 ms a step, stage 1 9 ms; the noise hides any straggler. One microbatch
    runs the stages one after the other: balancing them (16.5 ms each) moves work without
    shortening the step."""
    run = _pp_run(2, stage_layers=[[0], [1]])
    graphs = {s: _pipeline_step(s, 20_000.0, 5_000.0) for s in range(2)}
    res = whatif.analyse(graphs, run, OPS, {}, noise_us=1e9)
    assert res.straggler is None
    imb = res.imbalance
    assert imb is not None
    assert imb["stage_work_us"] == pytest.approx({0: 24_000.0, 1: 9_000.0})
    assert imb["slowest_stage"] == 0
    assert imb["max_over_mean"] == pytest.approx(24_000.0 / 16_500.0)
    assert imb["saving_us"] == pytest.approx(0.0, abs=1e-6)
    # the savings table's stage column is the rank's pipeline stage
    assert res.savings.set_index("rank")["stage"].to_dict() == {0: 0, 1: 1}
    # the slowest stage is the one of the most work, not the highest number
    flipped = whatif.analyse({0: _pipeline_step(0, 1_000.0, 20_000.0)}, run, OPS, {},
                             noise_us=1e9)
    assert flipped.imbalance["slowest_stage"] == 1
    assert flipped.imbalance["stage_work_us"] == pytest.approx({0: 5_000.0, 1: 24_000.0})


def test_the_stage_balance_holds_the_straggler_at_its_reference_pace():
    """Stage 0 (one layer, 24 ms) against stage 1 (one layer, 9 ms), no noise: stage 0 is the
    straggler, and with it at stage 1's pace both stages own 9 ms — balanced."""
    run = _pp_run(2, stage_layers=[[0], [1]])
    res = whatif.analyse({0: _pipeline_step(0, 20_000.0, 5_000.0)}, run, OPS, {}, noise_us=0.0)
    assert res.straggler["rank"] == 0 and res.straggler["stage"] == 0
    assert res.imbalance["stage_work_us"] == pytest.approx({0: 9_000.0, 1: 9_000.0})
    assert res.imbalance["max_over_mean"] == pytest.approx(1.0)


def test_the_savings_tables_other_columns():
    """Two steps of the serial pipeline (33.2 ms each: 20 + 0.1 + 9 + 0.1 + 4): the critical
    path is all of it; stage 0's own work is 24 ms of it, stage 1's 9. Each step stage 1
    waits for stage 0's 20 ms forward at "a" (called at 0 and 20 ms: 20 ms charged to stage
    0), and stage 0 for stage 1 at "g": stage 1 calls it 9.1 ms after stage 0 does (the hop
    of "a", then its 9 ms), charged to stage 1."""
    run = _pp_run(2, stage_layers=[[0], [1]])
    graphs = {s: _pipeline_step(s, 20_000.0, 5_000.0) for s in range(2)}
    res = whatif.analyse(graphs, run, OPS, {}, noise_us=1e9)
    sav = res.savings.set_index("rank")
    assert list(res.savings.columns) == whatif.SAVINGS_COLUMNS
    assert sav["critical_path_share"][0] == pytest.approx(24_000.0 / 33_200.0)
    assert sav["critical_path_share"][1] == pytest.approx(9_000.0 / 33_200.0)
    assert sav["reference"].tolist() == ["other stages, per unit of work"] * 2
    # charged per step: stage 1's lateness at "g", 9.1 ms, the same each of the two steps
    assert sav["wait_caused_us"][1] == pytest.approx(9_100.0)
    assert sav["wait_caused_us"][0] == pytest.approx(20_000.0)
    assert sav["wait_us"].to_dict() == pytest.approx({0: 9_100.0, 1: 20_000.0})
    assert res.step_time_us == pytest.approx(33_200.0)
    # the resolution: the given noise over √2 steps, above the floor
    assert res.resolution_us == pytest.approx(max(1e9 / np.sqrt(2), res.floor_us))
    # every wait charged, per step: stage 1's 20 ms at "a" to stage 0, stage 0's 9.1 ms at "g"
    # to stage 1
    assert sorted((st, w, c, round(us, 6)) for st, w, c, us, _ in res.charged) == [
        (0, 0, 1, 9_100.0), (0, 1, 0, 20_000.0), (1, 0, 1, 9_100.0), (1, 1, 0, 20_000.0)]
    # one critical path of both steps, numbered afresh
    assert res.critical_path.index.tolist() == list(range(len(res.critical_path)))
    assert set(res.critical_path["step"]) == {0, 1}


def test_without_a_given_noise_it_is_the_replayed_steps_spread():
    """Three steps whose rank 2 is 0, 1 and 3 ms slower: makespans m, m + 1, m + 3 ms, their
    median absolute deviation 1 ms — noise 1.4826 ms (a normal's σ from its MAD)."""
    from test_straggler_oracle import _step

    graphs = {s: _step(s, {2: slow}) for s, slow in enumerate((0.0, 1_000.0, 3_000.0))}
    res = whatif.analyse(graphs, None, {"ar": "all_reduce"}, {}, noise_us=None)
    assert res.noise_us == pytest.approx(1.4826 * 1_000.0)


def test_no_steps_give_the_documented_empty_tables():
    res = whatif.analyse({}, None, {}, {}, noise_us=None)
    assert list(res.table.columns) == whatif.WHATIF_COLUMNS
    assert list(res.savings.columns) == whatif.SAVINGS_COLUMNS
    assert res.critical_path.empty and res.straggler is None and res.imbalance is None
