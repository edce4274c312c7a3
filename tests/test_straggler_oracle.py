"""The straggler verdict against a rank slowed by a known amount (issue 52 item 2: the
mutation that drops the noise gate — ``top["saving_us"] >= gate`` → ``>= 0`` in
``crossrank/whatif._straggler`` — passed every fast test).

Hand-made step graphs of three data-parallel ranks that do their own work, meet at one
all-reduce (2 ms) and work 5 ms more: rank 2 works ``slow_ms`` longer than its peers, so
fixing it saves exactly ``slow_ms`` (its peers wait that long at the all-reduce) — the answer
known by construction. The run's noise is given; the straggler must be named when the saving
stands above ``NOISE_FACTOR`` × noise / √steps, and not below it, even where the saving is a
large share of the step."""
from __future__ import annotations

import pytest

from meshscope.analysis.crossrank import whatif
from meshscope.analysis.crossrank.graph import CALL, END, WAIT, Operation, Point, RankStep, \
    StepGraph

WORK_US = 10_000.0


def _step(step: int, slow_us: dict[int, float]) -> StepGraph:
    work = {r: WORK_US + slow_us.get(r, 0.0) for r in (0, 1, 2)}
    t0 = step * 100_000.0
    done = t0 + max(work.values()) + 2_000.0
    ranks = {r: RankStep(r, t0, [Point(CALL, t0 + w, w, "ar"), Point(WAIT, done, 0.0, "ar"),
                                 Point(END, done + 5_000.0, 5_000.0)])
             for r, w in work.items()}
    return StepGraph(step, ranks, {"ar": Operation("ar", "all_reduce", "dp", [], 2_000.0,
                                                   done)})


def _analyse(slow_per_step: list[dict[int, float]], noise_us: float):
    graphs = {s: _step(s, slow) for s, slow in enumerate(slow_per_step)}
    return whatif.analyse(graphs, None, {"ar": "all_reduce"}, {}, noise_us=noise_us)


def test_a_rank_slowed_above_the_noise_is_the_straggler_with_its_delay():
    res = _analyse([{2: 3_000.0}] * 3, noise_us=1_000.0)     # gate 2 × 1000 / √3 = 1155 µs
    assert res.straggler is not None and res.straggler["rank"] == 2
    assert res.straggler["saving_us"] == pytest.approx(3_000.0)
    # of the replayed step: 13 ms of work, 2 ms all-reduce, 5 ms after
    assert res.straggler["saving_pct"] == pytest.approx(100 * 3_000.0 / 20_000.0)
    assert res.straggler["gate_us"] == pytest.approx(2 * 1_000.0 / 3 ** 0.5)


def test_the_same_delay_inside_the_noise_names_nobody():
    """3 ms is 15% of the step — far above ``MIN_SAVING_PCT`` — but the run's noise is 4 ms a
    step: over three steps the gate is 2 × 4000 / √3 = 4.6 ms."""
    res = _analyse([{2: 3_000.0}] * 3, noise_us=4_000.0)
    assert res.savings.set_index("rank")["saving_us"][2] == pytest.approx(3_000.0)
    assert res.straggler is None


def test_a_rank_slowed_in_one_step_of_three_is_not_a_straggler():
    """Its median saving over the steps is 0: one disturbed step does not decide it."""
    res = _analyse([{2: 6_000.0}, {}, {}], noise_us=0.0)
    assert res.straggler is None
    # slowed in two steps of three: steady enough, and its median saving is the delay
    res = _analyse([{2: 6_000.0}, {2: 6_000.0}, {}], noise_us=0.0)
    assert res.straggler["rank"] == 2 and res.straggler["saving_us"] == pytest.approx(6_000.0)


def test_the_slowest_rank_not_the_first_is_named():
    res = _analyse([{0: 1_000.0, 1: 4_000.0}] * 3, noise_us=0.0)
    assert res.straggler["rank"] == 1
    # fixing rank 1 leaves rank 0's 1 ms: the saving is the difference, 3 ms
    assert res.straggler["saving_us"] == pytest.approx(3_000.0)


def test_a_straggler_must_be_the_slowest_in_two_steps_of_three():
    """Rank 2 slowed 5 ms in three steps of five, rank 1 8 ms in the other two: rank 2's median
    saving (5 ms) is the largest, but it is the slowest in 3 of 5 steps, fewer than two
    thirds — nobody is named; in four of five it is."""
    res = _analyse([{2: 5_000.0}] * 3 + [{1: 8_000.0}] * 2, noise_us=0.0)
    assert res.savings.set_index("rank")["saving_us"][2] == pytest.approx(5_000.0)
    assert res.straggler is None
    res = _analyse([{2: 5_000.0}] * 4 + [{1: 8_000.0}], noise_us=0.0)
    assert res.straggler["rank"] == 2 and res.straggler["saving_us"] == pytest.approx(5_000.0)
