"""Where a GPU's idle time goes, and the findings that name it, on small hand-made Kineto traces
whose answer is known by construction (tests/gpu_trace_builder.py).

Each scenario builds a trace in which the device waits for one thing a known time per step; the
report's ``idle`` table must charge that time to the right cause (its parts adding up to the
breakdown's idle time) and the first finding must be the one that fits, with that cost.
"""
from __future__ import annotations

import gzip
import json

import pytest

from meshscope.analysis.errors import InputError
from meshscope.analysis.report.analyze import analyze
from gpu_trace_builder import Trace, kernels_back_to_back

STEP = 100_000.0      # µs between step starts


def run(folder, **kw):
    return analyze(folder, workers=1, **kw)


def first(report):
    assert report.findings, "no findings"
    return report.findings[0]


def idle_adds_up(report):
    """The idle table's parts equal the breakdown's idle time, step by step."""
    idle = report.steps.idle.set_index(["rank", "step"])
    bd = report.steps.breakdown.set_index(["rank", "step"])
    parts = idle[[c for c in idle.columns if c.startswith("idle_") and c != "idle_us"]]
    assert parts.sum(axis=1).to_numpy() == pytest.approx(bd.loc[idle.index, "idle_us"]
                                                         .to_numpy(), abs=1e-3)


def loader_trace(steps=3) -> Trace:
    """Each step: the host spends 30 ms in the data loader, launches 10 kernels of 2 ms, then
    waits for them (cudaDeviceSynchronize): the GPU idles exactly while the loader runs."""
    t = Trace()
    for s in range(steps):
        T = s * STEP
        t.step(s, T, 60_000)
        t.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", T, 30_000)
        end = kernels_back_to_back(t, T + 30_000, T + 30_010, 10, 2_000)
        t.host("cudaDeviceSynchronize", T + 30_100, end - (T + 30_100), cat="cuda_runtime")
        t.host("aten::zeros", end + 5, 10)     # a little host work after the sync
    return t


def test_data_loader_stall(tmp_path):
    """A hand-made trace whose GPU waits exactly the 30 ms the data loader runs each step: the
    independent reference (by construction) that kills the idle mutations of docs/testing.md —
    the data-loader and synchronisation parts swapped in ``gpu/idle.causes``, and every gap
    charged as queued work (the host part of a gap dropped) — issue 52."""
    loader_trace().write(tmp_path / "run")
    rep = run(tmp_path / "run")
    idle_adds_up(rep)
    idle = rep.steps.idle.set_index("step")
    # Steps 1 and 2: the window starts where the previous step's kernels ended; the GPU then
    # waits for the rest of that step's host time and the 30 ms loader.
    assert idle.loc[1, "idle_dataloader_us"] == pytest.approx(30_000, abs=1)
    assert idle.loc[2, "idle_dataloader_us"] == pytest.approx(30_000, abs=1)
    f = first(rep)
    assert f.id == "data-loading-stall"
    assert f.cost_us == pytest.approx(30_000, rel=0.01)
    assert "workers" in f.remedy


def sync_trace(steps=3) -> Trace:
    """Each step: 20 ms of kernels; ``.item()`` (aten::item → _local_scalar_dense → a tiny
    copy and a cudaStreamSynchronize that waits ~20 ms for them); then 15 ms of host work
    (an optimizer on the host) before the next step's launches: the GPU idles those 15 ms
    because the host could not run ahead."""
    t = Trace()
    for s in range(steps):
        T = s * 35_200
        t.step(s, T, 35_200)
        end = kernels_back_to_back(t, T + 100, T + 110, 10, 2_000)   # ends T + 20_110
        t.host("aten::item", T + 300, end + 60 - (T + 300))
        t.host("aten::_local_scalar_dense", T + 310, end + 40 - (T + 310))
        t.launch(T + 320, 10, end, 5, name="Memcpy DtoH (Device -> Pageable)",
                 call="cudaMemcpyAsync", cat="gpu_memcpy")
        t.host("cudaStreamSynchronize", T + 340, end + 10 - (T + 340), cat="cuda_runtime")
        t.host("Optimizer.step#SGD.step", end + 70, 15_000)   # ends T + 35_195
    return t


def test_synchronisation_stall_names_its_call_site(tmp_path):
    sync_trace().write(tmp_path / "run")
    rep = run(tmp_path / "run")
    idle_adds_up(rep)
    f = first(rep)
    assert f.id == "sync-stall"
    # From the end of the copy (the sync returns) to the next step's first kernel: the host's
    # 15 ms optimizer plus the ~0.1 ms before it and before the next launch.
    assert 15_000 <= f.cost_us <= 15_300
    assert f.evidence["sync_op"] == "cudaStreamSynchronize"
    assert f.evidence["called_from"] == "aten::item"
    assert "aten::item" in f.title


def test_launch_bound(tmp_path):
    """1,000 kernels of 5 µs, launched 20 µs apart: 15 µs of every 20 the GPU waits for the
    host's launches (10 µs in the launch call, 5 µs of launch latency after it returned)."""
    t = Trace()
    for s in range(2):
        T = s * 30_000
        t.step(s, T, 20_100)
        for i in range(1000):
            L = T + 50 + i * 20
            t.launch(L, 10, L + 15, 5, name="void at::native::vectorized_elementwise_kernel")
    t.write(tmp_path / "run")
    rep = run(tmp_path / "run")
    idle_adds_up(rep)
    f = first(rep)
    assert f.id == "launch-bound"
    row = rep.steps.idle.set_index("step").loc[0]
    assert row["idle_launch_us"] == pytest.approx(1000 * 10, rel=0.01)
    assert row["idle_queued_us"] == pytest.approx(1000 * 5, rel=0.01)
    assert f.cost_us == pytest.approx(15_000, rel=0.02)
    assert "CUDA graph" in f.remedy


def test_pageable_copy_on_the_critical_path(tmp_path):
    """A 50 MB copy from pageable memory before the forward: 10 ms with nothing else on the
    GPU (5 GB/s), then 20 ms of kernels."""
    t = Trace()
    for s in range(3):
        T = s * 40_000
        t.step(s, T, 31_000)
        t.launch(T + 10, 10_000, T + 20, 10_000, name="Memcpy HtoD (Pageable -> Device)",
                 call="cudaMemcpyAsync", cat="gpu_memcpy", bytes=50_000_000)
        kernels_back_to_back(t, T + 10_100, T + 10_110, 10, 2_000)
    t.write(tmp_path / "run")
    rep = run(tmp_path / "run")
    f = first(rep)
    assert f.id == "memcpy-on-critical-path"
    assert f.cost_us == pytest.approx(10_000, rel=0.01)
    assert "pinned" in f.remedy and "Pageable" in f.evidence["copies"][0]["name"]


def nccl_trace() -> Trace:
    """One rank: 30 ms of compute kernels, then a 20 ms NCCL all-reduce on a side stream that
    nothing overlaps: 40% of the step."""
    t = Trace(rank=0, world=1)
    for s in range(3):
        T = s * 60_000
        t.step(s, T, 50_100)
        end = kernels_back_to_back(t, T + 10, T + 20, 15, 2_000)
        t.launch(T + 200, 10, end, 20_000,
                 name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 stream=20)
    return t


def test_single_rank_exposed_communication(tmp_path):
    nccl_trace().write(tmp_path / "run")
    rep = run(tmp_path / "run")
    f = first(rep)
    assert f.id.startswith("exposed-comm-")
    # What full overlap would save: the exposed time, never more.
    assert f.cost_us == pytest.approx(20_000, rel=0.01)
    assert f.cost_us <= rep.steps.breakdown["exposed_comm_us"].max() + 1e-6


def test_two_ranks_whose_arrivals_jitter(tmp_path):
    """Two ranks, four steps, one all-reduce each: rank 0 reaches it 10 ms late in steps 0 and
    2, rank 1 in steps 1 and 3; the other spins in the NCCL kernel meanwhile. No rank is a
    straggler; the waits are arrival jitter."""
    for rank in (0, 1):
        t = Trace(rank=rank, world=2)
        for s in range(4):
            T = s * 60_000
            late = (s % 2 == 0) == (rank == 0)
            t.step(s, T, 50_000)
            work = 40_000 if late else 30_000
            end = kernels_back_to_back(t, T + 10, T + 20, 10, work / 10)
            done = T + 20 + 40_000 + 2_000      # 2 ms transfer after the late one arrives
            t.launch(T + 200, 10, end, done - end,
                     name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", stream=20)
            t.host("record_param_comms", T + 190, 30, **{
                "Collective name": "allreduce", "In msg nelems": 1 << 20,
                "Out msg nelems": 1 << 20, "dtype": "Float", "Process Group Name": "0",
                "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
                "Group size": 2, "Seq": s + 1})
        t.write(tmp_path / "run", f"rank{rank}.json.gz")
    rep = run(tmp_path / "run")
    ids = [f.id for f in rep.findings]
    assert "straggler" not in ids
    f = first(rep)
    assert f.id == "arrival-jitter"
    assert f.evidence["last_arrivers"] == {0: 2, 1: 2}
    # Each rank waits 10 ms in two of four steps: 5 ms per step on average.
    assert f.cost_us == pytest.approx(5_000, rel=0.05)


def test_healthy_single_rank_has_no_idle_findings(tmp_path):
    """Kernels back to back, launched well ahead: nothing idles, nothing is found."""
    t = Trace()
    for s in range(3):
        T = s * 20_100
        t.step(s, T, 20_000)
        kernels_back_to_back(t, T + 10, (T + 100) if s == 0 else T + 100, 10, 2_000)
    t.write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert [f.id for f in rep.findings if f.id != "exposed-comm-unknown"] == []


def _be_pairs(doc: dict) -> dict:
    """The same trace with every host range written as a B/E pair."""
    out = []
    for ev in doc["traceEvents"]:
        if ev["ph"] == "X" and ev["pid"] != 0:
            b = {k: v for k, v in ev.items() if k != "dur"}
            b["ph"] = "B"
            out.append(b)
            out.append({"ph": "E", "pid": ev["pid"], "tid": ev["tid"],
                        "ts": ev["ts"] + ev["dur"]})
        else:
            out.append(ev)
    out.sort(key=lambda e: (e["ts"], 0 if e["ph"] == "E" else 1))
    return {**doc, "traceEvents": out}


@pytest.mark.parametrize("form", ["B/E pairs", "bare array"])
def test_other_formats_give_the_same_answer(tmp_path, form):
    """The data-loader trace written as B/E pairs, or as a bare JSON array of events: the same
    idle breakdown and the same first finding."""
    doc = loader_trace().doc()
    folder = tmp_path / "run"
    folder.mkdir()
    payload = _be_pairs(doc) if form == "B/E pairs" else doc["traceEvents"]
    with gzip.open(folder / "rank0.json.gz", "wt") as f:
        json.dump(payload, f)
    rep = run(folder)
    f = first(rep)
    assert f.id == "data-loading-stall"
    assert f.cost_us == pytest.approx(30_000, rel=0.01)


def test_trace_without_profiler_steps_is_one_window(tmp_path):
    """The launch-bound trace without its ProfilerStep ranges: the whole trace is one window
    (said in a note), with the same finding; ``--step-annotation`` names the steps instead."""
    t = Trace()
    for s in range(2):
        T = s * 30_000
        t.host(f"train_step_{s}", T, 20_100, cat="user_annotation")
        for i in range(1000):
            L = T + 50 + i * 20
            t.launch(L, 20, L + 5, 5, name="void at::native::vectorized_elementwise_kernel")
    t.write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert rep.steps.breakdown["step"].tolist() == [0]
    assert any("one window" in n for n in rep.notes)
    assert first(rep).id == "launch-bound"
    rep2 = run(tmp_path / "run", step_annotation=r"train_step_(\d+)", cache_dir=None)
    assert rep2.steps.breakdown["step"].tolist() == [0, 1]
    assert any("--step-annotation" in n for n in rep2.notes)
    assert first(rep2).id == "launch-bound"
    with pytest.raises(InputError, match="step-annotation"):
        run(tmp_path / "run", step_annotation="(")


def test_slow_large_gemm_and_cuda_graph_kernels(tmp_path):
    """A 4096³ bf16 ``aten::mm`` (137 GFLOP) whose kernel takes 10 ms on an A100: 13.7 TFLOP/s,
    4.4% of the 312 TFLOP/s peak; at 60% of peak it would take 0.73 ms, so it costs 9.27 ms a
    step. Beside it, 100 kernels replayed by one ``cudaGraphLaunch`` are counted, not lost."""
    t = Trace()
    n = 4096
    for s in range(3):
        T = s * 20_000
        t.step(s, T, 20_000)
        t.host("aten::mm", T + 10, 30, **{"Input Dims": [[n, n], [n, n]],
                                          "Input type": ["c10::BFloat16", "c10::BFloat16"]})
        t.launch(T + 20, 10, T + 40, 10_000, name="ampere_bf16_s16816gemm_bf16_128x128_nn")
        c = t.launch(T + 60, 20, T + 10_040, 0, name="placeholder", call="cudaGraphLaunch")
        t.events.pop()                              # the graph launch's own kernel: none
        for i in range(100):
            t.events.append({"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add_0",
                             "pid": 0, "tid": 7, "ts": T + 10_040 + i * 50, "dur": 50,
                             "args": {"device": 0, "stream": 7, "correlation": c,
                                      "graph id": 1}})
    t.write(tmp_path / "run")
    rep = run(tmp_path / "run")
    g = rep.gpu.gemms.iloc[0]
    assert g["flops"] == pytest.approx(3 * 2 * n ** 3)
    assert g["tflops"] == pytest.approx(2 * n ** 3 / 10_000 / 1e6)
    assert g["peak_tflops"] == 312.0
    f = next(f for f in rep.findings if f.id == "low-gemm-efficiency")
    assert f.cost_us == pytest.approx(10_000 - 2 * n ** 3 / (0.6 * 312e12) * 1e6, rel=1e-6)
    k = rep.gpu.kernels.set_index("name").loc["triton_poi_fused_add_0"]
    assert k["count"] == 300 and bool(k["graph"])
    # The graph's kernels belong to the steps whose host range launched them.
    assert rep.steps.breakdown["compute_us"].tolist() == pytest.approx([15_000.0] * 3)


@pytest.mark.parametrize("op, dims, flops", [
    ("aten::mm", [[64, 128], [128, 32]], 2 * 64 * 128 * 32),
    ("aten::addmm", [[32], [64, 128], [128, 32], [], []], 2 * 64 * 128 * 32),
    ("aten::bmm", [[4, 64, 128], [4, 128, 32]], 2 * 4 * 64 * 128 * 32),
    ("aten::baddbmm", [[4, 64, 32], [4, 64, 128], [4, 128, 32], [], []], 2 * 4 * 64 * 128 * 32),
    ("aten::linear", [[8, 16, 128], [32, 128], [32]], 2 * 8 * 16 * 128 * 32),
    ("aten::matmul", [[8, 16, 128], [128, 32]], 2 * 8 * 16 * 128 * 32),
    # Shapes that do not fit the op (as one shared trace records a bmm) give no number.
    ("aten::bmm", [[4, 64, 128]], None),
    ("aten::mm", [[64, 128], [64, 32]], None),
    ("aten::mm", "not a list", None),
    ("aten::mm", [[64, "x"], [128, 32]], None),
    ("aten::addmm", [[32], [64, 128]], None),
])
def test_gemm_flops_from_recorded_shapes(op, dims, flops):
    from meshscope.analysis.gpu.kernels import gemm_flops
    assert gemm_flops(op, dims) == flops


def test_gemm_rows_sum_each_calls_kernels_and_read_repeated_arguments_alike():
    """One thread's four aten::mm calls of a 4×8 by 8×2 product (128 FLOPs each): the first
    launches one kernel of 2 µs, the second two of 3 and 5 µs, the third a launch whose kernel
    the trace lacks (no kernel time: left out), the fourth has arguments that do not parse
    (left out); a call on another thread launches nothing."""
    import pandas as pd
    from meshscope.analysis.gpu.kernels import gemm_table
    args = json.dumps({"dims": [[4, 8], [8, 2]], "types": ["float", "float"]})
    host = pd.DataFrame({
        "name": ["aten::mm"] * 5, "lane": ["cpu:1:1"] * 4 + ["cpu:1:2"],
        "ts_us": [0.0, 20.0, 40.0, 60.0, 0.0], "end_us": [10.0, 30.0, 50.0, 70.0, 10.0],
        "call_args": [args, args, args, "{not json", args]})
    launches = pd.DataFrame({"lane": ["cpu:1:1"] * 5, "ts_us": [1.0, 21.0, 22.0, 41.0, 61.0],
                             "end_us": [2.0, 22.0, 23.0, 42.0, 62.0],
                             "correlation": [1, 2, 3, 4, 5]})
    dev = pd.DataFrame({"correlation": [1, 2, 3, 5], "dur_us": [2.0, 3.0, 5.0, 7.0]})
    rows = gemm_table(0, host, dev, launches, None)
    assert rows[["op", "shapes", "dtype", "calls", "flops", "kernel_us"]].to_dict("records") \
        == [{"op": "aten::mm", "shapes": "[[4, 8], [8, 2]]", "dtype": "float", "calls": 2,
             "flops": 256.0, "kernel_us": 10.0}]


@pytest.mark.parametrize("name, category", [
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>", "convolution"),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "convolution"),
    ("void vllm::_typeConvert_rms_norm_kernel<c10::BFloat16>", "norm/elementwise"),
    ("bmm_Bfloat16_E2m1E2m1_Fp32_t_tileSize128", "gemm"),
    ("ampere_sgemm_128x64_nn", "gemm"),
    ("void fbgemm_gpu::split_embedding_codegen_forward_kernel<float>", "other"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
    ("void at::native::reduce_kernel<512, 1>", "reduction"),
])
def test_kernel_categories_by_name(name, category):
    from meshscope.analysis.gpu.kernels import category as cat_of
    assert cat_of(name, "kernel", "compute") == category


def test_an_item_is_one_synchronisation(tmp_path):
    """``aten::item`` holding ``aten::_local_scalar_dense`` and no runtime synchronisation (a
    trace without runtime events) is one call, not two; its step is the host step holding it."""
    t = Trace()
    t.step(0, 0, 1_000)
    t.host("aten::item", 100, 300)
    t.host("aten::_local_scalar_dense", 110, 280)
    t.launch(50, 10, 60, 500)
    t.write(tmp_path / "run")
    calls = run(tmp_path / "run").gpu.sync_calls
    assert calls["name"].tolist() == ["aten::item"]
    assert calls["step"].tolist() == [0]
