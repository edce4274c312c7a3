"""The instance table read a step at a time (``report/instance_blocks``, issue 51 item 1): the
matching, the clock offsets, the aligned table and the collective and point-to-point tables
made block by block are the ones the whole-table functions (``comm/matching``,
``crossrank/clocks``) make of the table put together — on hand-made tables whose answer is
known by construction (rank 2's clock 5 ms ahead; a sequence number one rank saw a step later),
held in memory and on disk, and on a real run's report."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from conftest import ROOT
from meshscope.analysis.comm import instances, matching
from meshscope.analysis.crossrank import clocks
from meshscope.analysis.report import analyze as analyze_mod
from meshscope.analysis.report import instance_blocks

GROUP = "0,1,2"
SKEW_US = 5_000.0          # rank 2's clock runs this far ahead of the others


def _row(rank, step, op, k, t_us, **kw):
    """One instance row: an operation that every rank ends at ``t_us`` on the common clock
    (rank 2's trace says ``SKEW_US`` later), arriving 10 µs per rank apart."""
    skew = SKEW_US if rank == 2 else 0.0
    arrival = t_us - 100.0 + 10.0 * rank + skew
    end = t_us + skew
    row = {"rank": rank, "step": step, "op": op, "backend_op": None, "p2p": False,
           "peer": None, "pg_name": "0", "pg_desc": "default_pg", "pg_ranks": GROUP,
           "group_size": 3, "dim": "dp", "dim_source": "run.json", "seq": None, "k": k,
           "call_ts_us": arrival, "call_end_us": end, "exec_ts_us": arrival,
           "exec_end_us": end, "arrival_us": arrival, "end_us": end, "msg_bytes": 4096,
           "in_bytes": 4096, "out_bytes": 4096, "dtype": "float", "source": "gloo"}
    return row | kw


def _tables(seq: bool, late_seq_on_rank: int | None = None) -> list[pd.DataFrame]:
    """Three ranks, three steps of four all-reduces, one all-to-all and a send 0 → 1 a step;
    one instance table per rank. ``seq``: the collectives carry sequence numbers;
    ``late_seq_on_rank``: that rank saw step 1's last all-reduce in step 2 (its sequence
    number in two steps)."""
    out = []
    for rank in range(3):
        rows = []
        n = 0
        for step in (1, 2, 3):
            for k in range(4):
                n += 1
                t = step * 100_000.0 + k * 1_000.0
                late = rank == late_seq_on_rank and step == 1 and k == 3
                rows.append(_row(rank, 2 if late else step, "all_reduce", k, t,
                                 seq=n if seq else None))
            n += 1
            rows.append(_row(rank, step, "all_to_all", 0, step * 100_000.0 + 9_000.0,
                             seq=n if seq else None, out_bytes=1000 + rank))
            if rank in (0, 1):
                t = step * 100_000.0 + 20_000.0
                rows.append(_row(rank, step, "send" if rank == 0 else "recv", 0,
                                 t + (50.0 if rank == 1 else 0.0), p2p=True,
                                 peer=1 - rank, pg_ranks="0,1", group_size=2, dim="pp",
                                 source="nccl"))
        out.append(instances.table_of(rows))
    return out


def _whole(tables, ranks, **kw):
    """The whole-table answer: matched, offsets, aligned, collective and p2p tables."""
    m = matching.match(pd.concat(tables, ignore_index=True), ranks, **kw)
    offsets = clocks.clock_offsets(m.instances, matching.p2p_table(m.instances), ranks, {})
    aligned = clocks.align_instances(m.instances, offsets)
    return m, offsets, aligned, matching.collective_table(aligned), matching.p2p_table(aligned)


def _blocked(tables, ranks, **kw):
    b = instance_blocks.InstanceBlocks.collect(tables)
    plan = b.plan(ranks, world_size=kw.get("world_size"), trace_world=kw.get("trace_world"))
    offsets = b.clock_offsets(ranks, {})
    colls, p2p = b.align(offsets)
    return b, plan, offsets, colls, p2p


@pytest.fixture(params=["memory", "disk"])
def where(request, monkeypatch):
    if request.param == "disk":
        monkeypatch.setattr(instance_blocks, "IN_MEMORY_ROWS", 0)
    return request.param


@pytest.mark.parametrize("seq", [True, False], ids=["by-seq", "by-order"])
def test_blocks_give_what_the_whole_table_gives(seq, where):
    tables = _tables(seq)
    ranks = [0, 1, 2]
    m, offsets, aligned, colls, p2p = _whole(tables, ranks, world_size=3)
    b, plan, b_offsets, b_colls, b_p2p = _blocked(tables, ranks, world_size=3)
    assert (plan.matched_on, plan.why_not) == (m.matched_on, m.why_not) == \
        ("group_seq" if seq else "group_order", [])
    assert b._blocks == [[1], [2], [3]]                 # a step at a time
    # Known by construction: rank 2 is 5 ms ahead, and the shift is applied.
    assert b_offsets.set_index("rank").loc[2, "applied_us"] == pytest.approx(SKEW_US)
    pd.testing.assert_frame_equal(b_offsets, offsets)
    pd.testing.assert_frame_equal(pd.concat(list(b.frames()), ignore_index=True), aligned)
    pd.testing.assert_frame_equal(b_colls, colls)
    pd.testing.assert_frame_equal(b_p2p, p2p)
    assert len(b_colls) == 15 and len(b_p2p) == 3
    assert b_colls["skew_us"].tolist() == pytest.approx([20.0] * 15)  # 10 µs a rank, aligned
    whole_ops = dict(zip(aligned["match_id"], aligned["op"]))
    assert b.ops == whole_ops
    a2a = aligned[aligned["op"] == "all_to_all"]
    assert b.a2a_bytes == {(int(r), m): float(x) for r, m, x in
                           zip(a2a["rank"], a2a["match_id"], a2a["out_bytes"])}
    cc, whole_cc = b.counts(), matching.CollectiveCounts.of(aligned)
    pd.testing.assert_series_equal(cc.counts, whole_cc.counts)
    assert (cc.present, cc.rows) == (whole_cc.present, whole_cc.rows) == ({0, 1, 2}, 51)
    b.close()


def test_a_sequence_number_seen_in_two_steps_reads_every_step_as_one_block(where):
    # Rank 1 put step 1's last all-reduce (its sequence number 4) in step 2: matched by
    # sequence number, its rows are one operation across two steps.
    tables = _tables(seq=True, late_seq_on_rank=1)
    ranks = [0, 1, 2]
    _, _, aligned, colls, p2p = _whole(tables, ranks, world_size=3)
    b, plan, _, b_colls, b_p2p = _blocked(tables, ranks, world_size=3)
    assert b.stats.seq_in_two_steps and b._blocks == [[1, 2, 3]]
    assert plan.matched_on == "group_seq"
    late = b_colls[b_colls["match_id"] == f"{GROUP}|seq=4"]
    assert late["n_ranks"].tolist() == [3]              # one operation, all three ranks
    pd.testing.assert_frame_equal(pd.concat(list(b.frames()), ignore_index=True), aligned)
    pd.testing.assert_frame_equal(b_colls, colls)
    pd.testing.assert_frame_equal(b_p2p, p2p)
    b.close()


def test_the_world_group_fallback_and_its_counts(where):
    # No group anywhere, every rank of the trace's world present, the same sequence: the
    # collectives go on the world group, block by block as in the whole table.
    tables = [t.assign(pg_ranks="", pg_name=None, pg_desc=None, group_size=pd.NA,
                       dim="unknown", dim_source="none")[~t["p2p"]].reset_index(drop=True)
              for t in _tables(seq=False)]
    for t in tables:
        instances._shared_text(t)
    ranks = [0, 1, 2]
    m, _, aligned, colls, _ = _whole(tables, ranks, trace_world=3)
    b, plan, _, b_colls, _ = _blocked(tables, ranks, trace_world=3)
    assert plan.matched_on == m.matched_on == "world" and plan.notes == m.notes
    pd.testing.assert_frame_equal(pd.concat(list(b.frames()), ignore_index=True), aligned)
    pd.testing.assert_frame_equal(b_colls, colls)
    counts = b.counts().counts
    assert set(counts.index.get_level_values("pg_ranks")) == {GROUP}
    pd.testing.assert_series_equal(counts, matching.CollectiveCounts.of(aligned).counts)
    b.close()


def test_why_not_from_the_sums_names_what_the_whole_table_does():
    # Rank 2 lost one all-reduce of step 3 (order matching): the same reason either way.
    tables = _tables(seq=False)
    tables[2] = tables[2].drop(index=11).reset_index(drop=True)
    ranks = [0, 1, 2]
    whole = matching.match(pd.concat(tables, ignore_index=True), ranks, world_size=4)
    b = instance_blocks.InstanceBlocks.collect(tables)
    plan = b.plan(ranks, world_size=4, trace_world=None)
    assert plan.why_not == whole.why_not
    assert len(plan.why_not) == 2 and "only 3 of the job's 4 ranks" in plan.why_not[0]
    assert "all_reduce in step 3 (4 on ranks 0–1; 3 on rank 2)" in plan.why_not[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from bench.synth import make_run

    return make_run(tmp_path_factory.mktemp("blocks") / "run", ranks=4, steps=4,
                    events_per_step=300, layout="dp=2,pp=2", workers=1)


def test_a_run_analysed_with_its_pieces_on_disk_gives_the_same_report(run, tmp_path):
    in_memory = analyze_mod.analyze(run, workers=1)
    seen: list[int] = []             # the rows of each table the collective table is made of
    whole_table = matching.collective_table

    def counted(inst):
        seen.append(len(inst))
        return whole_table(inst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(instance_blocks, "IN_MEMORY_ROWS", 0)
        mp.setattr(instance_blocks.matching, "collective_table", counted)
        on_disk = analyze_mod.analyze(run, workers=1)
    # Never the whole table: each step's rows of every rank, one step after another.
    per_step = on_disk.comm.instances.groupby("step").size()
    assert seen == per_step.tolist() and max(seen) < per_step.sum()
    for name in ("instances", "collectives", "clock_offsets", "bandwidth"):
        pd.testing.assert_frame_equal(getattr(on_disk.comm, name),
                                      getattr(in_memory.comm, name), obj=name)
    pd.testing.assert_frame_equal(on_disk.graph.whatif, in_memory.graph.whatif)
    inst = in_memory.comm.instances
    assert inst["p2p"].any() and (~inst["p2p"]).any() and inst["step"].nunique() == 4
    # The collective table of the run, made a step at a time, is the whole table's.
    pd.testing.assert_frame_equal(in_memory.comm.collectives, matching.collective_table(inst))
    assert np.isfinite(in_memory.comm.collectives["completion_us"]).all()


def test_clock_pairs_made_a_few_ranks_at_a_time_equal_all_at_once(monkeypatch):
    # Eight ranks whose clocks run r × 1 ms ahead (known by construction), the pairs' medians
    # made one partner rank at a time (``PAIR_BYTES`` of one column) and all at once.
    rng = np.random.default_rng(7)
    rows = []
    for r in range(8):
        for k in range(40):
            t = 10_000.0 * k + rng.normal(0.0, 5.0)
            rows.append(_row(r, 1, "all_reduce", k, t, pg_ranks=",".join(map(str, range(8))),
                             group_size=8, call_ts_us=t + 1_000.0 * r,
                             arrival_us=t - 50.0 + 1_000.0 * r,
                             end_us=t + 1_000.0 * r + rng.normal(0.0, 2.0)))
    m = matching.match(instances.table_of(rows), list(range(8)), world_size=8)
    at_once = clocks.clock_offsets(m.instances, None, list(range(8)), {})
    monkeypatch.setattr(clocks, "PAIR_BYTES", 1)
    one_by_one = clocks.clock_offsets(m.instances, None, list(range(8)), {})
    pd.testing.assert_frame_equal(one_by_one, at_once)
    assert at_once["offset_us"].tolist() == pytest.approx([1_000.0 * r for r in range(8)],
                                                          abs=20.0)


def test_no_rank_table_is_kept_once_cut_into_pieces_on_disk(monkeypatch):
    # The tables are let go as they are cut: once every piece is on disk, nothing of the
    # collect step holds their columns — Python's and numpy's memory, nor Arrow's (the text
    # columns). Twenty copies of the hand-made ranks, 40 times their rows each.
    import gc
    import tracemalloc

    monkeypatch.setattr(instance_blocks, "IN_MEMORY_ROWS", 0)
    sizes = []

    def tables():
        for copy in range(20):
            for t in _tables(seq=False):
                t = pd.concat([t] * 40, ignore_index=True)
                t["rank"] += 3 * copy
                sizes.append(int(t.memory_usage(deep=True).sum()))
                yield t
                del t

    gc.collect()
    tracemalloc.start()
    # Python's and numpy's memory (traced), and Arrow's (the text columns: not traced).
    before = tracemalloc.get_traced_memory()[0], pa.total_allocated_bytes()
    b = instance_blocks.InstanceBlocks.collect(tables())
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before[0]
    kept_arrow = pa.total_allocated_bytes() - before[1]
    tracemalloc.stop()
    assert b.rows == 20 * 51 * 40 and len(sizes) == 60
    assert kept < 0.1 * sum(sizes), (kept, sum(sizes))
    assert kept_arrow < 0.02 * sum(sizes), (kept_arrow, sum(sizes))
    b.close()
