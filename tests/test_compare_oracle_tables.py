"""compare's oracle by construction, the report tables beyond the breakdown (issue 52 item 1:
the survivors of ``make mutate`` in ``quantities.measure`` and ``diff``'s kernels,
collectives, operators, bandwidth, memory and findings were the GPU families, held only by the
corpus tests, blind under mutation).

Two GPU runs of two ranks and three profiled steps, every table written here, each number
chosen so that the quantity compare reports is known by construction and differs from what
a neighbouring column, a wrong divisor or a wrong filter would give:

- ``idle.<cause>``: each cause moves by its own amount (1…8 ms), rank 1 one ms more;
- ``kernels.<category>``: two gemm kernels (one grows +2 ms), an attention kernel unchanged, a
  kernel gone, one new, NCCL's all-reduce under two generations' names (paired), a copy;
- ``exposed_comm.<dim>.<op>``: a dp all-gather on rank 0 only and not on step 2 (a rank or a
  step without a row counts 0);
- ``busbw.*``: three instances per step of known bus bandwidth per dimension (medians by hand);
- the step timers (a warm-up step with an outlying peak), the allocator peaks (a rank's CPU rows
  larger than its GPU's, which must not count), collectives (an instance outside the profiled
  steps, one of unknown bytes), operators, bandwidth buckets and findings."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from meshscope.analysis.compare import diff, gate, open_side
from meshscope.analysis.compare import quantities as Q
from meshscope.analysis.report import tables
from meshscope.vocabulary import IDLE_CAUSES

RANKS = (0, 1)
STEPS = (0, 1, 2)
JITTER = (-0.1, 0.0, 0.1)           # ms, step by step
GIB = 1 << 30
MIB = 1 << 20

IDLE_BEFORE = {c: 1.0 + i for i, c in enumerate(IDLE_CAUSES)}        # ms, rank 0
IDLE_MOVED = {c: 1.0 + i for i, c in enumerate(IDLE_CAUSES)}         # 1 … 8 ms


def _df(name: str, rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for c in tables.COLUMNS[name]:
        if c not in df:
            df[c] = math.nan
    return df[tables.COLUMNS[name]]


def _kernels(after: bool) -> list[dict]:
    """(name, category, count, ms) per rank and step; rank 1's gemm_a one ms longer."""
    k = [("gemm_a", "gemm", 3 if after else 2, 6.0 if after else 4.0),
         ("gemm_b", "gemm", 1, 1.0),
         ("attn_fwd", "attention", 1, 3.0),
         ("ncclDevKernel_AllReduce_Sum_f32_RING_LL" if after else
          "ncclKernel_AllReduce_RING_LL_Sum_float", "communication", 2, 2.5 if after else 2.0),
         ("Memcpy DtoD (Device -> Device)", "memcpy/memset", 4, 1.3 if after else 0.3)]
    k.append(("new_reduce", "reduction", 1, 0.7) if after else ("old_kernel", "other", 1, 0.5))
    rows = []
    for r in RANKS:
        for s, j in zip(STEPS, JITTER):
            for name, cat, count, ms in k:
                extra = (r + j) if name == "gemm_a" else 0.0
                rows.append({"rank": r, "step": s, "name": name, "category": cat,
                             "count": count, "total_us": (ms + extra) * 1e3})
    return rows


def _exposed(after: bool) -> list[dict]:
    rows = []
    for s in STEPS:
        for r in RANKS:
            rows.append({"rank": r, "step": s, "dim": "dp", "op": "all_reduce",
                         "exposed_us": (2.0 + r + (2.0 if after else 0.0)) * 1e3})
        if s != 2:
            rows.append({"rank": 0, "step": s, "dim": "dp", "op": "all_gather",
                         "exposed_us": 1.0e3})
        rows.append({"rank": 1, "step": s, "dim": "tp", "op": "all_reduce",
                     "exposed_us": 0.8e3})
    return rows


def _bandwidth(after: bool) -> list[dict]:
    rows = []
    for s in STEPS:
        for dim, base in (("dp", (10.0, 20.0, 90.0)), ("tp", (100.0, 200.0, 300.0))):
            for i, b in enumerate(base):
                bw = b + s + (5.0 if after and dim == "dp" else 0.0)
                rows.append({"rank": i % 2, "step": s, "dim": dim, "op": "all_reduce",
                             "msg_bytes": MIB, "busbw_gbps": bw})
        if s == 2:          # a fourth dp instance: step 2's median 57, not the middle of all
            rows.append({"rank": 1, "step": s, "dim": "dp", "op": "all_reduce",
                         "msg_bytes": MIB, "busbw_gbps": 95.0 + (5.0 if after else 0.0)})
        # an instance of unknown bytes: no bus bandwidth, left out of every median
        rows.append({"rank": 0, "step": s, "dim": "dp", "op": "all_reduce",
                     "msg_bytes": math.nan, "busbw_gbps": math.nan})
    return rows


def _instances(after: bool) -> list[dict]:
    rows = []
    n = 6 if after else 4
    for r in RANKS:
        for s in STEPS:
            rows += [{"rank": r, "step": s, "op": "all_reduce", "dim": "dp",
                      "msg_bytes": MIB} for _ in range(n)]
            rows.append({"rank": r, "step": s, "op": "all_gather", "dim": "dp",
                         "msg_bytes": math.nan})
            if not after:           # a tp broadcast the second run no longer makes
                rows.append({"rank": r, "step": s, "op": "broadcast", "dim": "tp",
                             "msg_bytes": 64})
        # outside the profiled steps: not counted
        rows += [{"rank": r, "step": 9, "op": "all_reduce", "dim": "dp", "msg_bytes": MIB}] * 5
    return rows


def _operators(after: bool) -> list[dict]:
    rows = []
    for r in RANKS:
        for s in STEPS:
            rows.append({"rank": r, "step": s, "name": "aten::mm", "count": 5 if after else 3,
                         "total_us": 900.0})
            rows.append({"rank": r, "step": s, "name": "aten::add", "count": 2,
                         "total_us": 100.0})
            if not after:           # gone after
                rows.append({"rank": r, "step": s, "name": "aten::old", "count": 1,
                             "total_us": 50.0})
    return rows


def _memory_steps(after: bool) -> list[dict]:
    grow = GIB if after else 0
    rows = []
    for s, (g0, c1) in enumerate(zip((3, 4, 5), (1, 1, 6))):
        # rank 0: its GPU (the main device) and its CPU, whose peaks are larger
        rows.append({"rank": 0, "device": "cuda:0", "step": s,
                     "peak_allocated_bytes": g0 * GIB + grow,
                     "peak_reserved_bytes": (g0 + 2) * GIB + grow})
        rows.append({"rank": 0, "device": "cpu", "step": s, "peak_allocated_bytes": 9 * GIB,
                     "peak_reserved_bytes": 12 * GIB})
        # rank 1 recorded no GPU: its CPU is its main device
        rows.append({"rank": 1, "device": "cpu", "step": s, "peak_allocated_bytes": c1 * GIB,
                     "peak_reserved_bytes": c1 * GIB})
    return rows


def _breakdown(after: bool) -> list[dict]:
    rows = []
    for r in RANKS:
        for s, j in zip(STEPS, JITTER):
            dp = (2.0 + r + (2.0 if after else 0.0)) + (1.0 if r == 0 and s != 2 else 0.0)
            tp = 0.8 if r == 1 else 0.0
            compute = 20.0 + r + j + (2.0 if after else 0.0)
            idle = sum(IDLE_BEFORE[c] + r + j + (IDLE_MOVED[c] if after else 0.0)
                       for c in IDLE_CAUSES)
            row = {c: 0.0 for c in tables.COLUMNS["breakdown"]}
            row.update({"rank": r, "step": s, "compute_us": compute * 1e3,
                        "exposed_comm_dp_us": dp * 1e3, "exposed_comm_tp_us": tp * 1e3,
                        "exposed_comm_us": (dp + tp) * 1e3, "idle_us": idle * 1e3,
                        "overlap_pct": math.nan})
            row["window_us"] = row["compute_us"] + row["exposed_comm_us"] + row["idle_us"]
            rows.append(row)
    return rows


def _idle(after: bool) -> list[dict]:
    rows = []
    for r in RANKS:
        for s, j in zip(STEPS, JITTER):
            row = {"rank": r, "step": s}
            for c in IDLE_CAUSES:
                row[f"idle_{c}_us"] = (IDLE_BEFORE[c] + r + j
                                       + (IDLE_MOVED[c] if after else 0.0)) * 1e3
            row["idle_us"] = sum(row[f"idle_{c}_us"] for c in IDLE_CAUSES)
            rows.append(row)
    return rows


def _throughput(after: bool) -> list[dict]:
    """Five timer steps, step 0 the warm-up (slow, and the largest peak of all)."""
    tokens = (100.0, 1000.0, 1010.0, 990.0, 1040.0)
    peaks = (5, 2, 2, 3, 2)
    times = (90.0, 40.0, 41.0, 39.0, 40.0)
    more = 1.0 if after else 0.0
    return [{"step": s, "loss": math.nan, "step_time_us": (t + more) * 1e3,
             "tokens_per_s": tok - 10 * more, "mfu_pct": 30.0 + s * s - more,
             "peak_memory_bytes": (p + more) * GIB}
            for s, (tok, p, t) in enumerate(zip(tokens, peaks, times))]


def _finding(fid: str, title: str, cost_ms: float) -> dict:
    return {"id": fid, "severity": "medium", "dimension": None, "cost_us": cost_ms * 1e3,
            "cost_pct": cost_ms, "title": title, "evidence": {}, "remedy": "-"}


def _run(folder, after: bool):
    folder.mkdir(parents=True)
    writers = {"breakdown": _breakdown, "idle": _idle, "kernel_totals": _kernels,
               "exposed_comm": _exposed, "bandwidth": _bandwidth, "instances": _instances,
               "operator_totals": _operators, "memory_steps": _memory_steps,
               "throughput": _throughput}
    for name, rows in writers.items():
        df = _df(name, rows(after))
        if name == "throughput":
            df["peak_memory_bytes"] = df["peak_memory_bytes"].astype("Int64")
        df.to_parquet(folder / f"{name}.parquet")
    buckets = [{"dim": "dp", "op": "all_reduce", "group_size": 2, "size_bucket": MIB,
                "busbw_gbps": 26.0 if after else 21.0, "transfer_us": 50.0}]
    if after:
        buckets.append({"dim": "tp", "op": "all_gather", "group_size": 2, "size_bucket": 4096,
                        "busbw_gbps": 3.0, "transfer_us": 7.0})
    _df("bandwidth_summary", buckets).to_parquet(folder / "bandwidth_summary.parquet")
    findings = [_finding("gpu-idle", "GPU idle", 9.0 if after else 4.0)]
    findings.append(_finding("straggler", "A straggler", 3.0) if after else
                    _finding("host-bound", "Host bound", 2.0))
    more = 1.0 if after else 0.0
    (folder / "summary.json").write_text(json.dumps({
        "schema_version": 3, "device": "gpu", "ranks": list(RANKS), "steps": list(STEPS),
        "step_time_us": (40.0 + more) * 1e3, "step_time_source": "timer",
        "step_time_timer_us": (40.0 + more) * 1e3, "step_time_replayed_us": None,
        "window_us": 50e3,
        "throughput": {"step_time_us": (40.0 + more) * 1e3,
                       "tokens_per_s": 1005.0 - 10 * more, "mfu_pct": 36.5 - more,
                       "steps": [1, 2, 3, 4]},
        "cross_rank": {"noise_us": 250.0}, "warmup_steps": [0], "findings": findings}))
    return open_side(folder)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    return _run(root / "before", False), _run(root / "after", True)


@pytest.fixture
def run_diff(pair):
    """The diff, made in each test that reads it (not once a module): ``make mutate`` runs
    for a mutant only the tests during which the mutated function ran."""
    return diff(*pair)


def _value(side, name):
    m = Q.measure(side, name)
    return None if m is None else m.value


def test_each_idle_cause_moves_by_what_was_built(pair, run_diff):
    before, after = pair
    parts = {p.name: p for p in run_diff.parts}
    for cause in IDLE_CAUSES:
        name = f"idle.{cause}"
        # the mean of rank 0's and rank 1's (one ms more) over the steps, whose jitter cancels
        assert _value(before, name) == pytest.approx((IDLE_BEFORE[cause] + 0.5) * 1e3), name
        assert parts[name].delta_us == pytest.approx(IDLE_MOVED[cause] * 1e3), name
        # noise: 1.4826 × MAD of the per-step means (0.1 ms) on each side
        assert parts[name].change.noise == pytest.approx(math.hypot(148.26, 148.26)), name
    # both runs on GPUs with an idle table: idle is split by cause, not one part
    assert "idle" not in parts
    assert parts["idle.dataloader"].label == "GPU idle: data loader"
    assert parts["idle.wait_rank"].label == "GPU idle: waiting for another rank"
    # the parts add up to the window's change
    assert sum(p.delta_us for p in run_diff.parts) == pytest.approx(run_diff.window.delta)


def test_kernel_categories_are_their_kernels_per_rank_and_step(pair):
    before, after = pair
    # gemm: gemm_a 4 ms (rank 1: 5) + gemm_b 1 ms → 5.5 ms; after gemm_a 6 (7) → 7.5 ms
    assert _value(before, "kernels.gemm") == pytest.approx(5.5e3)
    assert _value(after, "kernels.gemm") == pytest.approx(7.5e3)
    assert Q.measure(before, "kernels.gemm").noise == pytest.approx(148.26)
    assert _value(before, "kernels.attention") == pytest.approx(3e3)
    assert _value(after, "kernels.attention") == pytest.approx(3e3)
    assert _value(before, "kernels.communication") == pytest.approx(2e3)
    assert _value(after, "kernels.communication") == pytest.approx(2.5e3)
    assert _value(before, "kernels.memcpy/memset") == pytest.approx(0.3e3)
    # a category with no kernel on a side is 0 there, not unmeasured
    assert _value(before, "kernels.reduction") == 0.0
    assert _value(after, "kernels.reduction") == pytest.approx(0.7e3)
    assert _value(after, "kernels.other") == 0.0
    assert Q.measure(before, "kernels.reduction").per_step == (0.0, 0.0, 0.0)


def test_the_kernel_differences_pair_kernels_and_count_per_rank_and_step(run_diff):
    k = {x.key: x for x in run_diff.kernels}
    a = k["gemm_a"]
    assert (a.count_before, a.count_after) == (2.0, 3.0)
    assert (a.total_before_us, a.total_after_us) == pytest.approx((4.5e3, 6.5e3))
    assert a.category == "gemm" and a.names_before == ("gemm_a",)
    # NCCL's all-reduce under two generations' names is one kernel
    nccl = k["nccl:all_reduce"]
    assert nccl.names_before == ("ncclKernel_AllReduce_RING_LL_Sum_float",)
    assert nccl.names_after == ("ncclDevKernel_AllReduce_Sum_f32_RING_LL",)
    assert (nccl.total_before_us, nccl.total_after_us) == pytest.approx((2e3, 2.5e3))
    gone, new = k["old_kernel"], k["new_reduce"]
    assert (gone.count_before, gone.count_after, gone.total_after_us) == (1.0, 0.0, 0.0)
    assert (new.count_before, new.count_after, new.total_before_us) == (0.0, 1.0, 0.0)
    assert new.category == "reduction" and gone.category == "other"
    assert new.names_before == () and new.names_after == ("new_reduce",)
    assert gone.names_after == () and gone.names_before == ("old_kernel",)
    # largest change first
    assert [x.key for x in run_diff.kernels][:3] == [
        "gemm_a", "Memcpy DtoD (Device -> Device)", "new_reduce"]
    parts = {p.name: p for p in run_diff.parts}
    # compute's items: kernels, neither communication nor copies, largest change first
    assert parts["compute"].items_are == "kernels"
    assert [i.name for i in parts["compute"].items] == [
        "gemm_a", "new_reduce", "old_kernel", "attn_fwd", "gemm_b"]
    assert [(i.count_before, i.count_after) for i in parts["compute"].items[:3]] == [
        (2.0, 3.0), (0.0, 1.0), (1.0, 0.0)]
    # other device work's items: the copies
    assert parts["other"].items_are == "copies"
    (copy,) = parts["other"].items
    assert (copy.before_us, copy.after_us, copy.count_before, copy.count_after) == \
        pytest.approx((300, 1300, 4, 4))


def test_exposed_communication_of_one_operation(pair, run_diff):
    before, after = pair
    # all-reduce: rank 0 2 ms, rank 1 3 ms → 2.5 ms; after 4.5 ms
    assert _value(before, "exposed_comm.dp.all_reduce") == pytest.approx(2.5e3)
    assert _value(after, "exposed_comm.dp.all_reduce") == pytest.approx(4.5e3)
    # all-gather: rank 0 only (rank 1 counts 0), steps 0 and 1 only (step 2 counts 0)
    m = Q.measure(before, "exposed_comm.dp.all_gather")
    assert m.per_step == pytest.approx((500.0, 500.0, 0.0))
    assert m.value == pytest.approx(1e3 / 3)
    assert _value(before, "exposed_comm.tp.all_reduce") == pytest.approx(0.4e3)
    assert _value(before, "exposed_comm.dp.send") == 0.0
    parts = {p.name: p for p in run_diff.parts}
    dp = parts["exposed_comm.dp"]
    assert dp.label == "exposed dp communication"
    assert [s.name for s in dp.sub] == ["exposed_comm.dp.all_gather", "exposed_comm.dp.all_reduce"]
    assert [s.delta_us for s in dp.sub] == pytest.approx([0.0, 2e3])
    assert [s.label for s in dp.sub] == ["all_gather", "all_reduce"]
    # each operation's share of the window's change
    assert dp.sub[1].share == pytest.approx(2e3 / run_diff.window.delta)
    assert dp.delta_us == pytest.approx(2e3)
    assert parts["exposed_comm.tp"].delta_us == pytest.approx(0.0)
    assert "exposed_comm.pp" not in parts         # no run has any
    # the collectives whose count changed: dp all-reduce, 4 → 6 per rank and step
    assert dp.items_are == "collectives"
    assert [(i.name, i.count_before, i.count_after) for i in dp.items] == [
        ("all_reduce", 4.0, 6.0)]


def test_bus_bandwidth_is_the_median_of_the_instances(pair):
    before, after = pair
    # dp: 10, 20, 90 (+ step), and 95 on step 2 → per step medians 20, 21, 57; the median of
    # all ten instances (not of the steps' medians, 21, nor their mean, 32.7) → 21.5
    m = Q.measure(before, "busbw.dp.all_reduce")
    assert m.value == pytest.approx(21.5)
    assert m.per_step == pytest.approx((20.0, 21.0, 57.0))
    assert _value(after, "busbw.dp.all_reduce") == pytest.approx(26.5)
    assert _value(before, "busbw.tp.all_reduce") == pytest.approx(201.0)
    # every dimension's nineteen instances: the tenth is 95
    assert _value(before, "busbw.all_reduce") == pytest.approx(95.0)
    assert Q.measure(before, "busbw.all_gather") is None
    assert Q.measure(before, "busbw.pp.all_reduce") is None


def test_the_step_timers_leave_out_the_warm_up_step(pair):
    before, after = pair
    t = Q.measure(before, "tokens_per_s")
    # the summary's median (1005), not the mean of the steps (1010)
    assert t.value == 1005.0
    assert t.per_step == (1000.0, 1010.0, 990.0, 1040.0)
    assert Q.measure(after, "mfu_pct").value == 35.5            # the steps' mean: 36.5
    assert Q.measure(before, "mfu_pct").per_step == (31.0, 34.0, 39.0, 46.0)
    p = Q.measure(before, "peak_memory")
    # the largest step of all (the warm-up's 5 GiB); the noise from the others
    assert p.value == 5 * GIB
    assert p.per_step == (2 * GIB, 2 * GIB, 3 * GIB, 2 * GIB)
    st = Q.measure(before, "step_time")
    assert st.value == 40e3 and st.noise == 250.0          # the report's noise_us
    assert st.per_step == (40e3, 41e3, 39e3, 40e3)


def test_allocator_peaks_are_each_ranks_main_device(pair, run_diff):
    before, after = pair
    # rank 0's GPU 3, 4, 5 GiB; rank 1's CPU (it has no GPU) 1, 1, 6 GiB; rank 0's CPU
    # (9 GiB) is not its main device
    a = Q.measure(before, "peak_allocated")
    assert a.per_step == (3 * GIB, 4 * GIB, 6 * GIB) and a.value == 6 * GIB
    r = Q.measure(before, "peak_reserved")
    assert r.per_step == (5 * GIB, 6 * GIB, 7 * GIB) and r.value == 7 * GIB
    assert _value(after, "peak_allocated") == 6 * GIB       # rank 1's 6 GiB still the max
    mem = {m.rank_before: m for m in run_diff.memory}
    assert mem[0].device == "cuda:0"
    assert (mem[0].allocated_before_bytes, mem[0].allocated_after_bytes) == (5 * GIB, 6 * GIB)
    assert (mem[0].reserved_before_bytes, mem[0].reserved_after_bytes) == (7 * GIB, 8 * GIB)
    assert (mem[0].rank_before, mem[0].rank_after) == (0, 0)
    assert mem[1].device == "cpu"
    assert (mem[1].allocated_before_bytes, mem[1].reserved_after_bytes) == (6 * GIB, 6 * GIB)


def test_collectives_operators_buckets_and_findings(run_diff):
    c = {(x.dim, x.op): x for x in run_diff.collectives}
    ar = c[("dp", "all_reduce")]
    # per rank and profiled step; step 9's instances are outside the profiled steps
    assert (ar.count_before, ar.count_after) == (4.0, 6.0)
    assert (ar.bytes_before, ar.bytes_after) == (4.0 * MIB, 6.0 * MIB)
    ag = c[("dp", "all_gather")]
    assert (ag.count_before, ag.count_after) == (1.0, 1.0)
    assert ag.bytes_before is None                       # its bytes are unknown
    bc = c[("tp", "broadcast")]
    assert (bc.count_before, bc.count_after, bc.bytes_before, bc.bytes_after) == \
        (1.0, 0.0, 64.0, None)
    assert [(o.name, o.count_before, o.count_after) for o in run_diff.operators] == [
        ("aten::mm", 3.0, 5.0), ("aten::old", 1.0, 0.0)]   # aten::add's count did not change
    b = {(x.dim, x.op, x.size_bucket): x for x in run_diff.bandwidth}
    assert (b[("dp", "all_reduce", MIB)].busbw_before_gbps,
            b[("dp", "all_reduce", MIB)].busbw_after_gbps) == (21.0, 26.0)
    new = b[("tp", "all_gather", 4096)]
    assert (new.busbw_before_gbps, new.busbw_after_gbps, new.transfer_after_us) == \
        (None, 3.0, 7.0)
    f = {x.id: x for x in run_diff.findings}
    assert (f["gpu-idle"].status, f["gpu-idle"].cost_before_us, f["gpu-idle"].cost_after_us) \
        == ("both", 4e3, 9e3)
    assert (f["gpu-idle"].cost_before_pct, f["gpu-idle"].cost_after_pct) == (4.0, 9.0)
    assert (f["straggler"].status, f["straggler"].cost_before_us) == ("new", None)
    assert (f["host-bound"].status, f["host-bound"].cost_after_pct,
            f["host-bound"].cost_before_pct, f["host-bound"].title) == \
        ("gone", None, 2.0, "Host bound")
    assert [x.id for x in run_diff.findings] == ["gpu-idle", "straggler", "host-bound"]


def test_ranks_are_matched_by_id_with_their_means(run_diff):
    assert run_diff.rank_match == "id"
    r1 = next(r for r in run_diff.ranks if r.rank_before == 1)
    # rank 1's compute: 21 ms → 23 ms (mean over steps; the jitter cancels)
    assert (r1.before["compute"], r1.after["compute"]) == pytest.approx((21e3, 23e3))
    assert r1.delta("compute") == pytest.approx(2e3)
    assert r1.after["exposed_comm"] == pytest.approx((5.0 + 0.8) * 1e3)


def test_the_gate_judges_the_table_families(pair):
    before, after = pair
    for cond, failed in (("idle.queued>+6.5ms", True), ("idle.queued>+7.5ms", False),
                         ("kernels.gemm>+1.5ms", True), ("kernels.attention>+0.1ms", False),
                         ("exposed_comm.dp.all_reduce>+1.5ms", True),
                         ("busbw.dp.all_reduce>+2GB/s", True),
                         ("busbw.dp.all_reduce>20GB/s", True),
                         ("busbw.dp.all_reduce>25GB/s", False),    # holds, within the noise
                         ("busbw.tp.all_reduce<-1GB/s", False),
                         ("peak_allocated>5.5GiB", False),     # holds, within ±1.48 GiB
                         ("peak_reserved>1GiB", True)):
        v = gate.evaluate(gate.parse(cond), before, after)
        assert v.failed is failed, (cond, v.message)


# -- what the diff notes, and CPU runs' compute by operator ----------------------------------

def _cpu(folder, ranks, compute_ms, steps=3, timer=None, ops=None):
    from test_compare_diff import _report, _steps

    n = steps
    _report(folder, _steps([compute_ms + i for i in range(n)], [compute_ms + 10 + i
                                                                 for i in range(n)]),
            ranks=ranks, timer=timer)
    if ops:
        _df("operator_totals", [{"rank": r, "step": s, "name": name, "count": c,
                                 "total_us": us} for r in ranks for s in range(n)
                                for name, c, us in ops]).to_parquet(
            folder / "operator_totals.parquet")
    return open_side(folder)


def test_the_notes_say_how_the_runs_differ(tmp_path, pair):
    gpu_before, _ = pair
    one = _cpu(tmp_path / "one", (0,), 10)
    three = _cpu(tmp_path / "three", (3,), 12)
    two = _cpu(tmp_path / "two", (0, 1), 10, steps=2)
    timed = _cpu(tmp_path / "timed", (5, 6), 10, timer=[20, 21, 22, 21])
    d = diff(one, three)
    assert d.rank_match == "position"
    assert [(r.rank_before, r.rank_after) for r in d.ranks] == [(0, 3)]
    assert d.ranks[0].delta("compute") == pytest.approx(2e3)
    assert d.notes == ["the runs share no rank id: ranks matched by position (0→3)"]
    d = diff(three, timed)
    assert d.rank_match == "none" and d.ranks == []
    assert d.notes[:3] == [
        "the runs share no rank id and have different rank counts: no per-rank deltas",
        "the runs have different rank counts (1 and 2): their parts are means over each run's "
        "own ranks",
        f"the step times come from different sources ({three.summary.step_time.short} and "
        f"{timed.summary.step_time.short})"]
    d = diff(gpu_before, two)
    assert "one run is on gpu, the other on cpu" in d.notes
    assert d.notes[-1] == ("two: 2 profiled step(s): the noise of its profiled-step figures "
                           "is unknown (it needs three)")
    # a run against itself is noted once
    assert sum("profiled step(s)" in n for n in diff(two, two).notes) == 1


def test_a_cpu_runs_compute_items_are_its_operators_without_communication(tmp_path):
    ops_a = [("aten::mm", 3, 900.0), ("gloo:all_reduce", 1, 500.0), ("aten::add", 2, 100.0)]
    ops_b = [("aten::mm", 3, 1900.0), ("gloo:all_reduce", 1, 5500.0), ("aten::add", 2, 400.0)]
    a = _cpu(tmp_path / "a", (0, 1), 10, ops=ops_a)
    b = _cpu(tmp_path / "b", (0, 1), 12, ops=ops_b)
    d = diff(a, b)
    compute = next(p for p in d.parts if p.name == "compute")
    assert compute.items_are == "operators"
    assert [(i.name, i.before_us, i.after_us) for i in compute.items] == [
        ("aten::mm", 900.0, 1900.0), ("aten::add", 100.0, 400.0)]
    # its share of the window's change (+2 ms): all of it
    assert compute.share == pytest.approx(1.0)
    assert d.operators == []                   # no operator's count changed
    # both CPU runs: idle is one part, not split by cause
    assert [p.name for p in d.parts][-1] == "idle"


def test_each_measure_carries_its_name_and_documented_unit(pair):
    """The units of the module docstring's table of ``quantities``, written here."""
    before, _ = pair
    documented = {"step_time": "us", "window": "us", "compute": "us", "idle.sync": "us",
                  "exposed_comm.dp": "us", "exposed_comm.dp.all_reduce": "us",
                  "kernels.gemm": "us", "busbw.all_reduce": "gbps",
                  "busbw.dp.all_reduce": "gbps", "tokens_per_s": "per_s", "mfu_pct": "pct",
                  "peak_memory": "bytes", "peak_allocated": "bytes", "peak_reserved": "bytes"}
    for name, unit in documented.items():
        m = Q.measure(before, name)
        assert (m.name, m.unit) == (name, unit), name


def test_the_step_time_per_step_is_its_sources(tmp_path):
    """Each headline's per-step values and noise: the replayed makespan of each step (the
    what-if table's, one per step whatever the rank), the longest rank's window of each
    profiled step, the timer's non-warm-up steps (noise from them when the report states
    none: 1.4826 × MAD)."""
    from test_compare_diff import _report, _steps

    folder = _report(tmp_path / "replayed", _steps([10, 11, 12], [20, 21, 22]), ranks=(0, 1))
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(step_time_source="replayed", step_time_us=33e3, step_time_replayed_us=33e3)
    (folder / "summary.json").write_text(json.dumps(summary))
    _df("whatif", [{"rank": r, "step": s, "makespan_us": ms * 1e3, "whatif_us": 0.0,
                    "saving_us": 0.0} for r in (0, 1)
                   for s, ms in enumerate((30.0, 33.0, 34.0))]).to_parquet(
        folder / "whatif.parquet")
    m = Q.measure(open_side(folder), "step_time")
    assert (m.value, m.per_step) == (33e3, (30e3, 33e3, 34e3))
    assert m.noise == pytest.approx(1482.6)          # MAD of 30, 33, 34 ms: 1 ms
    # the window: per step the longest rank's (rank 1 is 4 ms longer on step 1)
    steps = _steps([10, 11, 12], [20, 21, 22])
    folder = _report(tmp_path / "window", steps, ranks=(0, 1))
    bd = pd.read_parquet(folder / "breakdown.parquet")
    bd.loc[(bd["rank"] == 1) & (bd["step"] == 1), "window_us"] = 25e3
    bd.to_parquet(folder / "breakdown.parquet")
    m = Q.measure(open_side(folder), "step_time")
    assert m.per_step == (20e3, 25e3, 22e3)
    assert m.noise == pytest.approx(2 * 1482.6)      # MAD of 20, 25, 22 ms: 2 ms
    # the timer, the report stating no noise: from the timer's steps
    folder = _report(tmp_path / "timer", steps, timer=[20, 21, 23, 21])
    m = Q.measure(open_side(folder), "step_time")
    assert m.per_step == (20e3, 21e3, 23e3, 21e3)
    assert m.noise == pytest.approx(0.5 * 1482.6)    # MAD of 20, 21, 23, 21 ms: 0.5 ms


def test_each_side_is_described_and_a_cpu_pair_has_no_device_lists(pair, tmp_path):
    before, after = pair
    d = diff(before, after)
    info = d.before
    assert (info.name, info.path, info.report_dir) == ("before", str(before.path),
                                                       str(before.report_dir))
    assert (info.device, info.ranks, info.steps, info.step_time_source) == (
        "gpu", [0, 1], [0, 1, 2], "timer")
    assert (info.layout, info.trust_verdict) == (None, None)
    assert d.after.name == "after"
    # two CPU runs with a breakdown only: nothing under kernels, collectives, buckets, memory
    a = _cpu(tmp_path / "a", (0,), 10)
    b = _cpu(tmp_path / "b", (0,), 11)
    d = diff(a, b)
    assert (d.kernels, d.collectives, d.bandwidth, d.memory, d.operators, d.findings) == \
        ([], [], [], [], [], [])
    assert d.quantities["peak_allocated"].before is None
    assert d.quantities["compute"].delta == pytest.approx(1e3)
    # one side with memory rows, the other without: that rank's row, the other side empty
    d = diff(before, a)
    (row,) = [m for m in d.memory if m.rank_before == 0]
    assert (row.allocated_before_bytes, row.allocated_after_bytes) == (5 * GIB, None)
