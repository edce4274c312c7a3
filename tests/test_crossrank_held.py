"""What the cross-rank stage holds at once (issue 51 item 1): the instance rows as Python dicts
of a bounded number of rows (whole ranks, ``analyze.ROWS_PER_TABLE``), never of 64 ranks; one
step's dependency graph at a time (``program.StepGraphs``), never every step's; one or two ranks'
aligned timelines at a time, never every rank's (``rank_order.in_rank_order``). Counted on a
small synthetic pipeline run (dp=2 × pp=2, 5 profiled steps), the report compared with the one
made with every rank's rows in a table of their own."""
import gc
import sys
import weakref

import pandas as pd
import pytest

from conftest import ROOT
from meshscope.analysis.comm import instances
from meshscope.analysis.crossrank import program
from meshscope.analysis.report import analyze as analyze_mod
from meshscope.analysis.report import spill

STEPS = 5
RANKS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from bench.synth import make_run

    return make_run(tmp_path_factory.mktemp("held") / "run", ranks=RANKS, steps=STEPS,
                    events_per_step=400, layout="dp=2,pp=2", workers=1)


def _analysed(run, rows_per_table: int, count_timelines: bool = False):
    """The report with ``rows_per_table``; the row counts of the instance tables made, the
    step graphs built and the most of them alive at once; with ``count_timelines``, the
    aligned timelines read back from the rank store (with no read cache) and the most of them
    alive at once (a timeline holds no reference cycle: it goes when its last name does)."""
    made: list[int] = []
    alive: weakref.WeakSet = weakref.WeakSet()
    timelines: list[weakref.ref] = []        # (a timeline is a dataclass: not hashable)
    seen = {"built": 0, "most_alive": 0, "timelines_read": 0, "timelines_alive": 0}

    class Counted(program.StepGraph):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            gc.collect()
            alive.add(self)
            seen["built"] += 1
            seen["most_alive"] = max(seen["most_alive"], len(alive))

    make = instances.table_of
    read = spill.RankStore.read

    def counted_read(store, key):
        value = read(store, key)
        if key[0] == "aligned":
            timelines.append(weakref.ref(value))
            seen["timelines_read"] += 1
            seen["timelines_alive"] = max(seen["timelines_alive"],
                                          sum(t() is not None for t in timelines))
        return value

    def table_of(rows):
        made.append(len(rows))
        return make(rows)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analyze_mod, "ROWS_PER_TABLE", rows_per_table)
        mp.setattr(analyze_mod.instances, "table_of", table_of)
        mp.setattr(program, "StepGraph", Counted)
        if count_timelines:
            mp.setattr(spill, "CACHE_BYTES", 0)        # every read a new object: none kept
            mp.setattr(spill.RankStore, "read", counted_read)
        report = analyze_mod.analyze(run, workers=1)
    return report, made, seen


@pytest.fixture(scope="module")
def default(run):
    return _analysed(run, analyze_mod.ROWS_PER_TABLE, count_timelines=True)


@pytest.fixture(scope="module")
def per_rank(run):
    return _analysed(run, 1)


def test_one_step_graph_at_a_time(default):
    report, _, seen = default
    steps = report.graph.whatif["step"].nunique()
    assert steps == STEPS
    # Each step built for the what-ifs, and again for the pipeline's stage balance (pp=2)...
    assert seen["built"] == 2 * STEPS
    # ...the next built while the one before is let go: never more than two at once.
    assert seen["most_alive"] <= 2


def test_one_or_two_aligned_timelines_at_a_time(default):
    # The step tables, the pipeline's tables, the timeline segments and each step's graph read
    # every rank's timeline in rank order; the one before is let go when the next is read
    # (``sorted(timelines.items())`` held all four).
    _, _, seen = default
    assert seen["timelines_read"] >= 5 * RANKS
    assert seen["timelines_alive"] <= 2


def test_instance_rows_made_into_tables_of_whole_ranks(default, per_rank):
    report, made, _ = default
    rows = len(report.comm.instances)
    assert rows > RANKS and made == [rows]             # a small run: one table
    one, made_one, _ = per_rank
    per = one.comm.instances.groupby("rank").size()
    assert made_one == per.sort_index().tolist()       # a table per rank, in rank order
    for name in ("instances", "collectives", "bandwidth"):
        pd.testing.assert_frame_equal(getattr(report.comm, name),
                                      getattr(one.comm, name))
    pd.testing.assert_frame_equal(report.graph.whatif, one.graph.whatif)
