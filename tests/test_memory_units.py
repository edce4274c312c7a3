"""The memory analysers on small hand-made inputs whose answers are known by construction
(analysis/memory/, analysis/report/memory_findings.py), and every memory finding both where it
must fire and in a healthy case where it must not."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from meshscope.analysis.ingest import decode
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import memory_events
from meshscope.analysis.ingest.validate import Damage
from meshscope.analysis.memory import curve, live, operators, rank_memory, series, steps
from meshscope.analysis.report import memory_findings as mf

MiB = 1 << 20


def _mem(rows, device_type=1, device_id=0, totals=True, lane="cpu:1:1") -> pd.DataFrame:
    """A memory table of (ts, bytes, addr[, reserved]) rows; the allocated totals are the
    running sum of bytes from ``base`` (100 MiB) when ``totals``."""
    base, allocated, out = 100 * MiB, 100 * MiB, []
    for r in rows:
        ts, size, addr = r[:3]
        allocated += size
        out.append({"ts_us": float(ts), "bytes": size,
                    "total_allocated": allocated if totals else None,
                    "total_reserved": (r[3] if len(r) > 3 else 400 * MiB) if totals else None,
                    "addr": addr, "device_type": device_type, "device_id": device_id,
                    "lane": lane})
    df = pd.DataFrame(out)
    df["total_allocated"] = df["total_allocated"].astype("Int64")
    df["total_reserved"] = df["total_reserved"].astype("Int64")
    df["addr"] = df["addr"].astype(np.uint64)
    df["lane"] = df["lane"].astype("category")
    assert base
    return df


# -- ingest ---------------------------------------------------------------------------------

def test_memory_events_are_typed_field_by_field(tmp_path):
    """A [memory] event without Bytes, or whose ts is not a number, is dropped and counted; a
    total that is not a non-negative integer, an address beyond 64 bits and a device type that
    is not a small integer are ignored on that event (null, 0, -1) and counted; the others are
    read as written, in file order, apart from the complete events."""
    good = {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 2, "ts": 10.0,
            "args": {"Bytes": 512, "Total Allocated": 1024, "Total Reserved": 2048,
                     "Addr": 7, "Device Type": 1, "Device Id": 0}}
    evs = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": i,
            "dur": 100} for i in range(60)]           # enough that 2 drops are below 5%
    evs += [good,
           {**good, "ts": 11.0, "args": {**good["args"], "Bytes": -512, "Total Allocated": -3,
                                         "Addr": 2**70, "Device Type": "cuda"}},
           {**good, "ts": 12.0, "args": {"Total Allocated": 5}},               # no Bytes
           {**good, "ts": "soon"}]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    tr = ingest.load_trace(path)
    m = tr.memory
    assert len(tr.events) == 60 and len(m) == 2
    assert m["bytes"].tolist() == [512, -512] and m["ts_us"].tolist() == [10.0, 11.0]
    assert m["total_allocated"].tolist()[0] == 1024 and pd.isna(m["total_allocated"].iloc[1])
    assert m["addr"].tolist() == [7, 0] and m["device_type"].tolist() == [1, -1]
    text = " ".join(tr.problems)
    for needle in ("[memory].args.Bytes: 1 event dropped", "[memory].ts: 1 event dropped",
                   "[memory].args.Total Allocated: ignored in 1 event",
                   "[memory].args.Addr: ignored in 1 event",
                   "[memory].args.Device Type: ignored in 1 event"):
        assert needle in text, (needle, tr.problems)


def test_memory_columns_keep_only_usable_rows():
    damage = Damage()
    e = decode.Event(ph="i", name="[memory]", ts=1.0, args=decode.Args(mem_bytes=8))
    bad = decode.Event(ph="i", name="[memory]", ts=float("inf"), args=decode.Args(mem_bytes=8))
    cols = memory_events.columns([e, bad], pa.array(["a", "b"], pa.large_string()), damage)
    assert len(cols["ts_us"]) == 1 and cols["lane"].to_pylist() == ["a"]
    assert damage.dropped == 1


# -- series, steps, live -------------------------------------------------------------------

def test_series_split_devices_and_rebuild_totals_from_bytes():
    cuda = _mem([(1, 10 * MiB, 1), (2, -10 * MiB, 1)])
    cpu = _mem([(1, 64, 9)], device_type=0, device_id=-1)
    old = _mem([(3, 4 * MiB, 5), (1, 2 * MiB, 4), (2, -2 * MiB, 4)], totals=False)
    got = {s.device: s for s in series.split(pd.concat([cuda, cpu], ignore_index=True))}
    assert set(got) == {"cuda:0", "cpu"}
    assert got["cuda:0"].totals == "absolute" and got["cpu"].totals == "since-start"
    assert got["cpu"].reserved is None and got["cuda:0"].reserved is not None
    (s,) = series.split(old)
    # In time order: +2 MiB (t=1), -2 MiB (t=2), +4 MiB (t=3): running sums from 0.
    assert s.totals == "rebuilt" and s.allocated.tolist() == [2 * MiB, 0, 4 * MiB]
    assert s.reserved is None
    assert series.device_label(1, 3) == "cuda:3" and series.device_label(12, 0) == "xpu:0"
    assert series.device_label(0, -1) == "cpu" and series.device_label(-1, -1) == "unknown"
    # c10's DeviceType 5 (IDEEP) has no name here: its number, as the docstring says
    assert series.device_label(5, 0) == "device5:0" and series.device_label(5, -1) == "device5"


def test_step_peaks_boundaries_and_growth():
    # Step 1 is [0, 10], step 2 [10, 20]: an event at t=10 belongs to both (the windows are
    # closed, as the test scans of the real traces count them).
    s = series.split(_mem([(1, 5 * MiB, 1), (5, 3 * MiB, 2), (10, -3 * MiB, 2),
                           (12, 4 * MiB, 3), (15, -4 * MiB, 3), (19, 2 * MiB, 4)]))[0]
    host = {1: (0.0, 10.0), 2: (10.0, 20.0), 3: (30.0, 40.0)}
    peaks = steps.step_peaks(s, host)
    assert [p.step for p in peaks] == [1, 2]               # step 3 has no event
    rows = steps.step_rows(0, s, host, peaks, {})
    a, b = rows
    assert a["peak_allocated_bytes"] == 108 * MiB and a["peak_allocated_us"] == 5.0
    assert a["start_allocated_bytes"] == 100 * MiB and a["end_allocated_bytes"] == 105 * MiB
    assert b["peak_allocated_bytes"] == 109 * MiB and b["start_allocated_bytes"] == 108 * MiB
    assert b["end_allocated_bytes"] == 107 * MiB
    assert a["fragmentation_bytes"] == 400 * MiB - 108 * MiB
    assert steps.growth(rows).deltas == [2 * MiB] and steps.growth(rows).monotone
    flat = [{**a, "end_allocated_bytes": 7}, {**b, "step": 2, "end_allocated_bytes": 7},
            {**b, "step": 3, "end_allocated_bytes": 7}]
    assert steps.growth(flat).deltas == [0, 0] and not steps.growth(flat).monotone


def test_live_blocks_at_a_moment():
    # addr 1: alloc t1, free t4; addr 2: alloc t2, never freed; addr 3: freed at t3 but
    # allocated before the trace; addr 1 again: alloc t5.
    s = series.split(_mem([(1, 8, 1), (2, 16, 2), (3, -32, 3), (4, -8, 1), (5, 64, 1)]))[0]
    freed = live.pairs(s)
    assert freed.tolist() == [3, -1, -1, -1, -1]
    at3 = live.live_at(s, 2, freed)       # after the free of addr 3
    assert at3.index.tolist() == [0, 1]
    # absolute totals: 100 MiB + 8 + 16 - 32 live then, of which the trace saw 24 allocated.
    assert at3.before_bytes == 100 * MiB + 8 + 16 - 32 - 24
    assert live.live_at(s, 4, freed).index.tolist() == [1, 4]


def test_innermost_range_per_thread():
    # outer [0, 100] ⊃ a [10, 20], b [30, 60] ⊃ c [40, 50]
    starts = np.array([0.0, 10, 30, 40])
    ends = np.array([100.0, 20, 60, 50])
    names = ["outer", "a", "b", "c"]
    assert operators.innermost(starts, ends, names, np.array([5.0, 15, 25, 45, 55, 99, 150])) \
        == ["outer", "a", "outer", "c", "b", "outer", None]


def test_innermost_range_found_past_many_closed_ranges_and_where_ranges_cross():
    # outer [0, 10,000] holds 600 short ranges [10k + 10, 10k + 15], k = 0 … 599 (more than
    # one search block each side of a query), then x [7,000, 7,100] crosses into y
    # [7,050, 7,200]; nothing covers 12,000, and nothing starts before -1
    short = np.arange(600) * 10.0 + 10
    starts = np.concatenate([[0.0], short, [7_000.0, 7_050.0]])
    ends = np.concatenate([[10_000.0], short + 5, [7_100.0, 7_200.0]])
    names = ["outer"] + [f"s{k}" for k in range(600)] + ["x", "y"]
    times = np.array([-1.0, 12.0, 17.0, 5_998.0, 5_992.0, 7_020.0, 7_080.0, 7_150.0,
                      9_000.0, 10_000.0, 12_000.0])
    assert operators.innermost(starts, ends, names, times) == [
        None, "s0", "outer", "outer", "s598", "x", "y", "y", "outer", "outer", None]
    # the same answers with the queries in any order
    order = np.array([10, 3, 0, 7, 1, 9, 4, 2, 8, 6, 5])
    assert operators.innermost_index(starts, ends, times[order]).tolist() == \
        [-1, 0, -1, 602, 1, 0, 599, 0, 0, 602, 601]


def test_operator_module_and_range_of_an_allocation():
    ev = pd.DataFrame({
        "name": ["ProfilerStep#3", "nn.Module: Linear_0", "aten::linear", "aten::mm",
                 "aten::mm"],
        "cat": ["user_annotation", "python_function", "cpu_op", "cpu_op", "cpu_op"],
        "ts_us": [0.0, 10, 11, 12, 50], "end_us": [100.0, 30, 29, 20, 60],
        "lane": ["cpu:1:1"] * 4 + ["cpu:1:2"]})
    ops, mods, notes = operators.context(ev, np.array(["cpu:1:1", "cpu:1:1", "cpu:1:1"],
                                                      dtype=object),
                                         np.array([15.0, 25.0, 55.0]))
    assert ops == ["aten::mm", "aten::linear", None]
    assert mods == ["Linear_0", "Linear_0", None]
    assert notes == ["ProfilerStep#3"] * 3


def test_the_curve_keeps_every_peak_within_its_bound():
    rng = np.random.default_rng(0)
    values = np.cumsum(rng.integers(-100, 101, 100_000))
    values[77_777] = values.max() + 10_000                 # one spike the curve must keep
    kept = curve.envelope(values, points=1000)
    assert len(kept) <= 1001 and 77_777 in kept
    assert values[kept].max() == values.max() and values[kept].min() == values.min()
    assert (np.diff(kept) > 0).all()
    assert curve.envelope(values[:50], points=1000).tolist() == list(range(50))


def test_rank_tables_group_live_blocks_by_what_made_them():
    ev = pd.DataFrame({
        "name": ["ProfilerStep#0", "meshscope/forward stage=0 chunk=0 mb=0",
                 "meshscope/forward stage=0 chunk=0 mb=1", "aten::mm", "aten::mm",
                 "aten::empty"],
        "cat": ["user_annotation", "user_annotation", "user_annotation", "cpu_op", "cpu_op",
                "cpu_op"],
        "ts_us": [0.0, 10, 30, 11, 31, 50], "end_us": [100.0, 20, 40, 12, 32, 51],
        "lane": ["cpu:1:1"] * 6})
    mem = _mem([(11.5, 3 * MiB, 1), (31.5, 3 * MiB, 2), (50.5, MiB, 3), (60, -MiB, 3)])
    out = rank_memory.rank_tables(0, mem, ev, {}, {0: (0.0, 100.0)})
    liv = out["memory_live"]
    top = liv.iloc[0]
    # Both microbatches' blocks are one group, under the forward of stage 0.
    assert (top["operator"], top["annotation"], top["bytes"], top["blocks"]) == \
        ("aten::mm", "meshscope/forward stage=0", 6 * MiB, 2)
    assert liv.loc[liv["operator"] == "(before the trace)", "bytes"].tolist() == [100 * MiB]
    dev = out["memory_devices"].iloc[0]
    assert dev["peak_allocated_bytes"] == 107 * MiB and dev["peak_op"] == "aten::empty"
    terms = out["memory_terms"].set_index("term")
    assert terms.loc["activations", "bytes"] == 6 * MiB


# -- findings -------------------------------------------------------------------------------

# One rank's memory_devices row, the fields a test does not set (test_memory_findings_oracle
# reads it too).
DEVICE_ROW = {"device": "cuda:0", "totals": "absolute", "events": 10, "steps": 3,
              "peak_step": 2, "peak_us": 1.0, "peak_op": "aten::mm", "peak_module": None,
              "peak_annotation": None, "peak_reserved_bytes": None,
              "reserved_at_peak_bytes": None, "fragmentation_bytes": None,
              "growth_per_step_bytes": 0.0, "growth_steps": 2, "growth_monotone": False,
              "device_total_bytes": None, "device_total_source": None, "stage": None}


def _devices(**rows) -> pd.DataFrame:
    return pd.DataFrame([{**DEVICE_ROW, "rank": r, **kw} for r, kw in rows.items()])


def _ids(devices, live=None, snapshots=(), stage_of=None):
    return [f.id for f in mf.memory_findings(devices, live if live is not None else
                                             pd.DataFrame(columns=rank_memory.LIVE_COLUMNS),
                                             list(snapshots), stage_of or {})]


def test_near_oom_fires_within_its_margin_only():
    near = _devices(r0={}, r1={})
    near["rank"] = [0, 1]
    near["peak_allocated_bytes"] = [70e9, 60e9]
    near["peak_reserved_bytes"] = [75e9, 62e9]
    near["device_total_bytes"] = 80e9                      # 75/80 = 94%: within 10%
    found = mf.memory_findings(near, pd.DataFrame(columns=rank_memory.LIVE_COLUMNS), [], {})
    f = found[0]
    assert f.id == "near-oom" and f.severity == "high" and f.evidence["rank"] == 0
    assert f.peak_saving_bytes == pytest.approx(75e9 - 72e9)
    healthy = near.assign(device_total_bytes=100e9)        # 75%
    assert "near-oom" not in _ids(healthy)
    unknown = near.assign(device_total_bytes=None)         # the device's memory not known
    assert "near-oom" not in _ids(unknown)
    oom = {"rank": 3, "device": "cuda:0", "source": "rank3.pickle",
           "oom": {"requested_bytes": 2 * MiB, "device_free_bytes": MiB,
                   "allocated_bytes": 10 * MiB, "reserved_bytes": 12 * MiB}}
    assert _ids(healthy, snapshots=[oom])[0] == "near-oom"


def test_imbalance_names_the_stage_and_not_an_even_run():
    d = _devices(a={}, b={}, c={}, d={})
    d["rank"] = [0, 1, 2, 3]
    d["peak_allocated_bytes"] = [300 * MiB, 290 * MiB, 200 * MiB, 210 * MiB]
    f = [x for x in mf.memory_findings(d, pd.DataFrame(columns=rank_memory.LIVE_COLUMNS), [],
                                       {0: 0, 1: 0, 2: 1, 3: 1}) if x.id == "memory-imbalance"][0]
    assert f.evidence["by"] == "stage" and f.evidence["largest"] == 0 and f.dimension == "pp"
    # the stages' peaks: 300 and 210 MiB, their mean 255
    assert f.peak_saving_bytes == pytest.approx(45 * MiB)
    assert "first stage" in f.remedy
    even = d.assign(peak_allocated_bytes=[300 * MiB, 290 * MiB, 295 * MiB, 298 * MiB])
    assert "memory-imbalance" not in _ids(even, stage_of={0: 0, 1: 0, 2: 1, 3: 1})


def test_growth_needs_every_step_to_end_higher():
    d = _devices(a={})
    d["rank"] = [0]
    d["peak_allocated_bytes"] = [100 * MiB]
    leak = d.assign(growth_per_step_bytes=8 * MiB, growth_steps=2, growth_monotone=True)
    (f,) = [x for x in mf.memory_findings(leak, pd.DataFrame(
        columns=rank_memory.LIVE_COLUMNS), [], {}) if x.id == "memory-growth"]
    assert f.peak_saving_bytes == 16 * MiB and f.evidence["ranks"] == [0]
    assert "memory-growth" not in _ids(d)                              # flat
    one = leak.assign(growth_steps=1)                                   # one step to step
    assert "memory-growth" not in _ids(one)
    tiny = leak.assign(growth_per_step_bytes=4096)                      # below 1 MiB
    assert "memory-growth" not in _ids(tiny)


def test_fragmentation_over_its_share_only():
    d = _devices(a={})
    d["rank"] = [0]
    d["peak_allocated_bytes"] = [6 * 1024 * MiB]
    frag = d.assign(reserved_at_peak_bytes=12 * 1024 * MiB, fragmentation_bytes=6 * 1024 * MiB)
    assert "memory-fragmentation" in _ids(frag)
    low = d.assign(reserved_at_peak_bytes=7 * 1024 * MiB, fragmentation_bytes=1024 * MiB)
    assert "memory-fragmentation" not in _ids(low)                    # 14% of reserved
    small = d.assign(reserved_at_peak_bytes=100 * MiB, fragmentation_bytes=50 * MiB)
    assert "memory-fragmentation" not in _ids(small)                  # below 64 MiB


def test_largest_allocator_over_its_share_and_symptom_of_growth():
    d = _devices(a={})
    d["rank"] = [0]
    d["peak_allocated_bytes"] = [100 * MiB]
    live_rows = pd.DataFrame([
        {"rank": 0, "device": "cuda:0", "step": 2, "operator": "aten::mm", "module": "Linear",
         "annotation": "meshscope/forward stage=0", "phase": "forward", "bytes": 40 * MiB,
         "blocks": 4, "share": 0.4},
        {"rank": 0, "device": "cuda:0", "step": 2, "operator": "aten::add", "module": None,
         "annotation": None, "phase": None, "bytes": 20 * MiB, "blocks": 2, "share": 0.2}])
    (f,) = [x for x in mf.memory_findings(d, live_rows, [], {}) if x.id == "largest-allocator"]
    # activations: a microbatch of half the size keeps half of them
    assert f.peak_saving_bytes == 20 * MiB and "recomputation" in f.remedy
    assert f.evidence["made_by"] == "activations"
    spread = live_rows.assign(bytes=[20 * MiB, 20 * MiB])
    assert "largest-allocator" not in _ids(d, spread)
    leak = d.assign(growth_per_step_bytes=8 * MiB, growth_steps=2, growth_monotone=True)
    found = mf.memory_findings(leak, live_rows, [], {})
    assert [x.id for x in found] == ["memory-growth"]
    assert any("aten::mm" in s for s in found[0].symptoms)


def test_allocations_in_the_backward_are_marked_by_the_autograd_engines_ranges():
    """PyTorch's profiler wraps every backward node in ``autograd::engine::evaluate_function``
    on the thread that runs it; an allocation inside one (here on the autograd thread,
    ``cpu:1:2``) was made by the backward, one outside it by something else."""
    ev = pd.DataFrame({
        "name": ["ProfilerStep#0", "autograd::engine::evaluate_function: MmBackward0",
                 "aten::mm", "aten::mm"],
        "cat": ["user_annotation", "cpu_op", "cpu_op", "cpu_op"],
        "ts_us": [0.0, 40, 41, 10], "end_us": [100.0, 60, 50, 20],
        "lane": ["cpu:1:1", "cpu:1:2", "cpu:1:2", "cpu:1:1"]})
    got = operators.in_backward(ev, np.array(["cpu:1:2", "cpu:1:1", "cpu:1:2"], dtype=object),
                                np.array([45.0, 45.0, 70.0]))
    assert got.tolist() == [True, False, False]


def test_rank_tables_say_which_phase_made_each_group():
    ev = pd.DataFrame({
        "name": ["ProfilerStep#0", "nn.Module: Linear_0", "aten::mm",
                 "autograd::engine::evaluate_function: MmBackward0", "aten::mm",
                 "Optimizer.step#AdamW.step", "aten::zeros_like", "aten::empty"],
        "cat": ["user_annotation", "python_function", "cpu_op", "cpu_op", "cpu_op",
                "user_annotation", "cpu_op", "cpu_op"],
        "ts_us": [0.0, 10, 11, 30, 31, 50, 51, 70], "end_us": [100.0, 20, 12, 40, 32, 60, 52, 71],
        "lane": ["cpu:1:1"] * 8})
    mem = _mem([(11.5, 4 * MiB, 1), (31.5, 3 * MiB, 2), (51.5, 2 * MiB, 3), (70.5, MiB, 4)])
    out = rank_memory.rank_tables(0, mem, ev, {}, {0: (0.0, 100.0)})
    liv = out["memory_live"].set_index("bytes")
    assert liv.loc[4 * MiB, "phase"] == "forward" and liv.loc[4 * MiB, "module"] == "Linear_0"
    assert liv.loc[3 * MiB, "phase"] == "backward"
    assert liv.loc[2 * MiB, "phase"] == "optimizer"
    assert liv.loc[MiB, "operator"] == "aten::empty" and pd.isna(liv.loc[MiB, "phase"])


def _group(operator, phase, nbytes, module=None, annotation="ProfilerStep"):
    return pd.Series({"rank": 0, "device": "cuda:0", "step": 1, "operator": operator,
                      "module": module, "annotation": annotation, "phase": phase,
                      "bytes": float(nbytes), "blocks": 1, "share": 0.5})


@pytest.mark.parametrize("operator,phase,replicas,made_by,names,saved", [
    # what the remedy names, and the bytes of 64 MiB it saves under its stated model
    ("aten::bmm", "forward", 8, "attention scores", "scaled_dot_product_attention", 64),
    ("aten::mm", "forward", 8, "activations", "recomputation", 32),
    ("aten::mm", "backward", 8, "gradients", "ZeRO-2", 56),
    ("aten::mm", "backward", 1, "gradients", "optimizer in the backward", 64),
    ("aten::zeros_like", "optimizer", 4, "optimizer state", "ZeRO-1", 48),
    ("aten::zeros_like", "optimizer", 1, "optimizer state", "offload", 64),
    ("(before the trace)", None, 4, "the model's state", "FSDP", 48),
    ("(before the trace)", None, 1, "the model's state", "bf16", 32),
    ("aten::empty", None, 8, "unknown", "with_stack=True", None),
])
def test_each_remedy_is_chosen_by_what_made_the_memory(operator, phase, replicas, made_by,
                                                        names, saved):
    fix = mf.remedy_of(_group(operator, phase, 64 * MiB), replicas)
    assert fix.made_by == made_by and names in fix.text
    assert fix.saving_bytes == (saved * MiB if saved is not None else None)


def test_the_model_state_from_before_the_trace_gets_the_weights_remedy():
    """[memory] events built by hand on a GPU (the allocator's absolute totals): 100 MiB live
    before the first event (the weights and optimizer state of a model built before the
    profiler started), 12 MiB of activations made in the trace. The largest allocator is the
    model's state; sharded over 4 data-parallel ranks it keeps a quarter."""
    ev = pd.DataFrame({"name": ["ProfilerStep#0", "nn.Module: Linear_0", "aten::mm"],
                       "cat": ["user_annotation", "python_function", "cpu_op"],
                       "ts_us": [0.0, 10, 11], "end_us": [100.0, 20, 12],
                       "lane": ["cpu:1:1"] * 3})
    mem = _mem([(11.5, 12 * MiB, 1), (90, -12 * MiB, 1)])
    out = rank_memory.rank_tables(0, mem, ev, {}, {0: (0.0, 100.0)})
    devices = out["memory_devices"]
    (f,) = [x for x in mf.memory_findings(devices, out["memory_live"], [], {}, replicas=4)
            if x.id == "largest-allocator"]
    assert f.evidence["made_by"] == "the model's state" and "FSDP" in f.remedy
    assert f.title.startswith("Memory allocated before the trace began holds 100.00 MiB")
    assert f.peak_saving_bytes == 75 * MiB
    # the same on a 1 GiB device, which its 112 MiB peak leaves nine-tenths free: no finding
    roomy = devices.assign(device_total_bytes=float(1 << 30))
    assert "largest-allocator" not in [x.id for x in mf.memory_findings(
        roomy, out["memory_live"], [], {}, replicas=4)]
    # a run whose trace saw its model made: no model state from before it, no such remedy
    fresh = _mem([(5, 100 * MiB, 9), (11.5, 12 * MiB, 1), (90, -12 * MiB, 1)])
    fresh["total_allocated"] = fresh["total_allocated"] - 100 * MiB
    out = rank_memory.rank_tables(0, fresh, ev, {}, {0: (0.0, 100.0)})
    assert not (out["memory_live"]["operator"] == "(before the trace)").any()


def test_a_buffer_of_the_step_itself_is_named_how_to_find_not_guessed():
    """``aten::empty under ProfilerStep`` (no module, no phase): the trace cannot say what it
    is; the remedy says how to find out and claims no saving model."""
    d = _devices(a={})
    d["rank"] = [0]
    d["peak_allocated_bytes"] = [100 * MiB]
    live_rows = pd.DataFrame([_group("aten::empty", None, 73 * MiB)])
    (f,) = [x for x in mf.memory_findings(d, live_rows, [], {}) if x.id == "largest-allocator"]
    assert "with_stack=True" in f.remedy and "_record_memory_history" in f.remedy
    assert f.evidence["made_by"] == "unknown" and f.evidence["remedy_model"].startswith("none")


def test_severity_moves_with_the_runs_headroom():
    """4 GiB saved on an 80 GiB device is 5% of it: medium on a run at 50 GiB (30 GiB free);
    high on a run at 70 GiB (12.5% free: under the 20% headroom); low on a run at 10 GiB (88%
    free). Against the peak where the device is not known: 8% of 50 GiB, medium."""
    GiB = 1 << 30
    even = mf.severity(4 * GiB, 50 * GiB, 80 * GiB)
    tight = mf.severity(4 * GiB, 70 * GiB, 80 * GiB)
    roomy = mf.severity(4 * GiB, 10 * GiB, 80 * GiB)
    assert (even.level, even.headroom_bytes, even.adjusted) == ("medium", 30 * GiB, None)
    assert tight.level == "high" and tight.adjusted.startswith("one level up")
    assert roomy.level == "low" and roomy.adjusted.startswith("one level down")
    unknown = mf.severity(4 * GiB, 50 * GiB, None)
    assert unknown.level == "medium" and unknown.of.startswith("the peak")


def test_findings_rank_near_oom_first_and_memory_after_time():
    from meshscope.analysis.report.findings import Finding, FindingInputs, findings

    near = Finding("near-oom", "high", "all", None, None, "near", {}, "", {},
                   peak_saving_bytes=1.0)
    grow = Finding("memory-growth", "low", "all", None, None, "grow", {}, "", {},
                   peak_saving_bytes=1.0)
    inp = FindingInputs(step_us=100.0, noise_us=float("nan"),
                        breakdown=pd.DataFrame(), bubbles=pd.DataFrame(), schedule=None,
                        stages=1, microbatches=1, virtual_stages=1, straggler=None,
                        savings=pd.DataFrame(), imbalance=None, dim_savings={}, hangs=None,
                        slow_steps=[], warmup_steps=[], step_times=pd.Series(dtype=float),
                        median_step_us=100.0, memory=[near, grow])
    assert [f.id for f in findings(inp)] == ["near-oom", "memory-growth"]


# -- the report's tables are registered -----------------------------------------------------

def test_memory_tables_are_registered():
    from meshscope.analysis.report import tables
    for name in ("memory_steps", "memory_devices", "memory_live", "memory_curve",
                 "memory_terms", "memory_segments", "memory_snapshot_live"):
        assert name in tables.COLUMNS and name in tables.MEMORY
    assert pathlib.Path(memory_events.__file__).name == "memory_events.py"


def test_runtime_buffers_only_from_the_allocators_own_totals():
    """meshscope/layouts/memory_vs_plan.runtime_buffers: on a GPU trace (absolute totals) the
    lowest start-of-step allocated after the first profiled step, less the model states; on a
    CPU trace (its totals start with the profiler) nothing."""
    from meshscope.layouts.memory_vs_plan import runtime_buffers

    devices = pd.DataFrame([{"rank": 0, "device": "cuda:0", "totals": "absolute",
                             "peak_allocated_bytes": 900 * MiB}])
    steps_ = pd.DataFrame([{"rank": 0, "device": "cuda:0", "step": s,
                            "start_allocated_bytes": b * MiB}
                           for s, b in ((2, 100), (3, 430), (4, 420))])
    got = {"weights": (100 * MiB, "census"), "grads": (100 * MiB, "events"),
           "optimizer_state": (200 * MiB, "events")}
    assert runtime_buffers(devices, steps_, got, 0) == 20 * MiB      # 420 − 400, step 2 left out
    cpu = devices.assign(device="cpu", totals="since-start")
    assert runtime_buffers(cpu, steps_.assign(device="cpu"), got, 0) is None
    assert runtime_buffers(devices, steps_, {"weights": got["weights"]}, 0) is None
