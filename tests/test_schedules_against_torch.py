"""The bubble of the schedules ``test_plan.py`` does not reach — looped BFS, zero-bubble (ZB1P,
``ScheduleInterleavedZeroBubble``), ZB-V (``ScheduleZBVZeroBubble``) and DualPipeV
(``ScheduleDualPipeV``) — against torch's own action orders (issue 52 item 3).

torch 2.13's ``torch.distributed.pipelining`` computes each rank's order in
``_calculate_single_rank_operations`` from a few attributes its ``__init__`` sets from the
stages (the group size, the microbatches, the stages per rank); the objects are made without
``__init__`` and those attributes given, so no process starts. The orders are replayed with
each action as soon as its rank is free and its input is there — a forward after the previous
stage's forward of the microbatch, an input-gradient backward (``I``, or a full ``B``) after
the next stage's, the last stage's after its own forward, a weight-gradient backward (``W``)
after its ``I``; DualPipeV's overlapped forward-backward pairs run as their two actions — with
a forward, an input-gradient and a weight-gradient backward of one chunk all equal (1/v of a
stage's: the balanced case the closed form speaks of, ``theory/schedules.py``).

What torch's orders say:

- looped BFS: the bubble is ``(p−1)/(v·m+p−1)``, meshscope's closed form, in every case;
- ZB1P, ZB-V and DualPipeV: the bubble is not 0: torch's orders leave p − 1 chunk-forward
  slots idle — ``(p−1)/(3·v·m+p−1)`` (a third of what interleaving alone leaves: ZB-H1's,
  Qi et al. 2024) for ZB1P from m = p, for DualPipeV (meshscope's layout check asks m ≥ 2p,
  its stages) and for ZB-V from m = ⌈(3p−1)/2⌉; ZB-V below that leaves 4p − 2m − 2 slots
  (its warm-up does not fill), ZB1P with m < p more than p − 1. The closed form
  (``theory/schedules.idle_microbatches``) gives all of these but the last, where its p − 1 is
  a lower bound; ``test_the_zero_bubble_closed_form_is_torchs`` holds it to torch's."""
from __future__ import annotations

import pytest

from meshscope.analysis.pipeline.bubble import theory_fraction as analysis_theory
from meshscope.theory.schedules import bubble_fraction
from pipeline_replay import replayed_bubble


def _torch_order(schedule: str, p: int, m: int, v: int) -> dict:
    from torch.distributed.pipelining import schedules as ts

    if schedule == "looped-bfs":
        s = ts.ScheduleLoopedBFS.__new__(ts.ScheduleLoopedBFS)
        s.pp_group_size, s._n_microbatches, s._stages = p, m, [None] * v   # len(): v
    elif schedule == "zero-bubble":
        s = ts.ScheduleInterleavedZeroBubble.__new__(ts.ScheduleInterleavedZeroBubble)
        s.pp_group_size, s.n_local_stages, s._n_microbatches = p, v, m
        s.microbatches_per_round = m // max(1, m // p)     # as its __init__ sets it
    elif schedule == "zbv":
        s = ts.ScheduleZBVZeroBubble.__new__(ts.ScheduleZBVZeroBubble)
        s.pp_group_size, s._n_microbatches, s.num_stages = p, m, 2 * p
    else:
        s = ts.ScheduleDualPipeV.__new__(ts.ScheduleDualPipeV)
        s.pp_group_size, s._n_microbatches = p, m
    return {rank: s._calculate_single_rank_operations(rank) for rank in range(p)}


def test_looped_bfs_closed_form_is_torchs():
    for p in (2, 3, 4):
        for m in (p, 2 * p, 3 * p):
            for v in (2, 3):
                torch_says = replayed_bubble(_torch_order("looped-bfs", p, m, v), p * v,
                                             1 / v, 1 / v, 1 / v)
                assert torch_says > 0
                assert bubble_fraction("looped-bfs", p, m, v) == pytest.approx(torch_says)
                assert analysis_theory("looped-bfs", p, m, v) == pytest.approx(torch_says)


def _zero_bubble_cases():
    for p in (2, 3, 4):
        for m in (p, 2 * p, 3 * p):
            yield "zero-bubble", p, m
        for m in (2 * p, 3 * p, 4 * p):
            yield "zbv", p, m
            yield "dualpipev", p, m


def _zbv_short_cases():
    """ZB-V with fewer microbatches than 2p: from one microbatch up."""
    for p in (2, 3, 4):
        for m in range(1, 2 * p):
            yield "zbv", p, m


def test_torchs_zero_bubble_orders_leave_p_minus_1_forward_slots():
    """What torch's orders give (module docstring), for the record the closed form is held
    to below; ZB-V with m = p leaves more than p − 1 slots."""
    for schedule, p, m in _zero_bubble_cases():
        v = 2
        torch_says = replayed_bubble(_torch_order(schedule, p, m, v), p * v,
                                     1 / v, 1 / v, 1 / v)
        idle_chunks = torch_says / (1 - torch_says) * 3 * m * v     # busy: 3·m·v chunks
        assert idle_chunks == pytest.approx(p - 1), (schedule, p, m)
    short = replayed_bubble(_torch_order("zbv", 2, 2, 2), 4, 0.5, 0.5, 0.5)
    assert short / (1 - short) * 3 * 2 * 2 > 1 + 1e-9


def test_the_zero_bubble_closed_form_is_torchs():
    for schedule, p, m in [*_zero_bubble_cases(), *_zbv_short_cases()]:
        torch_says = replayed_bubble(_torch_order(schedule, p, m, 2), p * 2, 0.5, 0.5, 0.5)
        assert bubble_fraction(schedule, p, m, 2) == pytest.approx(torch_says), (schedule, p, m)
        assert analysis_theory(schedule, p, m, 2) == pytest.approx(torch_says), (schedule, p, m)
    # ZB-V with m = p = 4 idles 6 chunk slots (4p − 2m − 2), twice p − 1
    assert bubble_fraction("zbv", 4, 4, 2) == pytest.approx(6 / (3 * 2 * 4 + 6))


def test_zb1p_with_fewer_microbatches_than_ranks_is_a_lower_bound():
    """ZB1P with m < p: torch's warm-up leaves more than p − 1 slots; the closed form's p − 1
    is below it (the module docstring), never above."""
    for p in (3, 4):
        for m in range(1, p):
            torch_says = replayed_bubble(_torch_order("zero-bubble", p, m, 2), p * 2,
                                         0.5, 0.5, 0.5)
            assert 0 < bubble_fraction("zero-bubble", p, m, 2) < torch_says, (p, m)
