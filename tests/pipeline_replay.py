"""A pipeline schedule's action order (torch's own, ``torch.distributed.pipelining``) replayed
with known times, for the bubble tests of tests/test_plan.py and
tests/test_schedules_against_torch.py.

Each rank runs its actions in torch's order, each as soon as its rank is free and its input is
there: a forward after the previous stage's forward of that microbatch; an input gradient (a
full backward, or its input half) after the next stage's, the last stage's after its own
forward; a weight gradient after its own input gradient. An overlapped forward-backward runs
as its two parts. The answer is the share of the makespan rank 0 waits."""
from __future__ import annotations


def replayed_bubble(order: dict, stages: int, fwd: float, bwd_input: float,
                    bwd_weight: float) -> float:
    """``order``: rank → torch's actions (None for an idle slot); ``stages``: the pipeline's
    stages (p·v); the times of a chunk's forward, input gradient and weight gradient (a full
    backward takes both). Fails if the order deadlocks or the ranks' work differs."""
    from torch.distributed.pipelining.schedules import _ComputationType as kind

    runs = (kind.FORWARD, kind.FULL_BACKWARD, kind.BACKWARD_INPUT, kind.BACKWARD_WEIGHT)

    def actions(a):
        return list(a.sub_actions) if a.computation_type == kind.OVERLAP_F_B else [a]
    todo = {r: [x for a in ops if a is not None for x in actions(a)
                if x.computation_type in runs] for r, ops in order.items()}
    done: dict[tuple, float] = {}
    free = dict.fromkeys(todo, 0.0)
    busy = dict.fromkeys(todo, 0.0)
    moved = True
    while moved:
        moved = False
        for r, queue in todo.items():
            while queue:
                a = queue[0]
                st, mb, c = a.stage_index, a.microbatch_index, a.computation_type
                if c == kind.FORWARD:
                    key, need, took = ("F", st, mb), [("F", st - 1, mb)] if st else [], fwd
                elif c == kind.BACKWARD_WEIGHT:
                    key, need, took = ("W", st, mb), [("I", st, mb)], bwd_weight
                else:
                    key = ("I", st, mb)
                    took = bwd_input + bwd_weight if c == kind.FULL_BACKWARD else bwd_input
                    need = [("I", st + 1, mb)] if st < stages - 1 else [("F", st, mb)]
                if any(n not in done for n in need):
                    break
                done[key] = free[r] = max([free[r], *(done[n] for n in need)]) + took
                busy[r] += took
                queue.pop(0)
                moved = True
    assert not any(todo.values()), "torch's order deadlocks"
    assert max(busy.values()) - min(busy.values()) < 1e-9      # every rank: the same work
    return 1 - busy[0] / max(free.values())
