"""Idle charged to what the host was doing, and CUDA graphs told apart, on small hand-made Kineto
traces whose answer is known by construction (tests/gpu_trace_builder.py); each verdict beside
a healthy twin where it must not fire.

- a launch call that holds the host for a second is launch time (and start-up), not work
  queued on the device, and the launch-bound finding does not claim it;
- the device idle after a short synchronisation is charged to it only as long as the call held
  the host; the rest goes to what the host did next (creating streams is start-up);
- a stall inside a wait for another stream's event is charged to that wait, not to the
  ``.item()`` before it;
- a graph replay that the trace catches mid-work is measured over the device's span, as HTA
  measures it; a trace that captures graphs is never advised to capture graphs;
- the GEMM verdict says how much of the GEMM time it covers when shapes are missing.
"""
from __future__ import annotations

import logging

import pytest

from meshscope.analysis.report import device_findings
from meshscope.analysis.report.analyze import analyze
from gpu_trace_builder import PID, TID, Trace, kernels_back_to_back

GRAPH_ADVICE = "capture the step in a CUDA graph"


def run(folder, **kw):
    return analyze(folder, workers=1, cache_dir=None, **kw)


def found(rep, fid):
    return next((f for f in rep.findings if f.id == fid), None)


def idle_adds_up(rep):
    idle = rep.steps.idle.set_index(["rank", "step"])
    bd = rep.steps.breakdown.set_index(["rank", "step"])
    parts = idle[[c for c in idle.columns if c.startswith("idle_") and c != "idle_us"]]
    assert parts.sum(axis=1).to_numpy() == pytest.approx(
        bd.loc[idle.index, "idle_us"].to_numpy(), abs=1e-3)


def graph_kernels(t: Trace, corr: int, ts: float, n: int, dur: float, gap: float,
                  name: str = "triton_poi_fused_add_0", stream: int = 7) -> float:
    """``n`` kernels of one graph replay (the ``cudaGraphLaunch`` of correlation ``corr``),
    ``gap`` apart from ``ts``; returns the end of the last."""
    for _ in range(n):
        t.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                         "ts": ts, "dur": dur, "args": {"device": 0, "stream": stream,
                                                        "correlation": corr, "graph id": 1}})
        ts += dur + gap
    return ts - gap


# -- a long launch call ----------------------------------------------------------------------

SHORT = 2000


def launches(t: Trace, start: float, n: int) -> float:
    """``n`` launches back to back from ``start``: each call 10 µs, its 5 µs kernel starting
    5 µs after the call returned, the next call when that kernel ends — every gap is 10 µs in
    a launch call and 5 µs queued. Returns the end of the last kernel."""
    L = start
    for _ in range(n):
        t.launch(L, 10, L + 15, 5, name="void at::native::vectorized_elementwise_kernel")
        L += 20
    return L


def long_launch_trace(long_us: float) -> Trace:
    """One window (no ProfilerStep): 2,000 short launches, one launch call of ``long_us`` whose
    kernel starts 5 µs after it returns, 2,000 short launches."""
    t = Trace()
    end = launches(t, 0, SHORT)
    t.launch(end, long_us, end + long_us + 5, 5, name="void cudnn::first_conv_kernel")
    launches(t, end + long_us + 10, SHORT)
    return t


def test_a_one_second_launch_call_is_launch_time_not_queued(tmp_path):
    """Every gap before a short kernel is 10 µs in its launch call and 5 µs queued; the gap
    before the slow one is the whole 1 s call (launch) and 5 µs queued. The launch-bound
    finding claims the short launches only; the second, start-up, is the gpu-idle finding's,
    with the remedy that fits a first launch — the two never claim the same time."""
    long_us = 1_000_000.0
    long_launch_trace(long_us).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    idle_adds_up(rep)
    row = rep.steps.idle.iloc[0]
    gaps = 2 * SHORT          # kernels 2·SHORT + 1, one window from the first to the last
    assert row["idle_launch_us"] == pytest.approx((gaps - 1) * 10 + long_us, abs=1)
    assert row["slow_launch_us"] == pytest.approx(long_us, abs=1)
    assert row["idle_queued_us"] == pytest.approx(gaps * 5, abs=1)
    lb = found(rep, "launch-bound")
    assert lb is not None
    assert lb.cost_us == pytest.approx((gaps - 1) * 10 + gaps * 5, rel=1e-6)
    gi = found(rep, "gpu-idle")
    assert "launch calls of over 1 ms: first launches" in gi.title
    assert gi.remedy == device_findings.SLOW_LAUNCH_REMEDY
    # Nothing claimed twice: the two costs add up to the idle time, no more.
    assert lb.cost_us + gi.cost_us == pytest.approx(row["idle_us"], rel=1e-6)


def test_ordinary_launches_are_not_slow(tmp_path):
    """The healthy twin: the same trace whose odd launch takes 10 µs like the others."""
    long_launch_trace(10.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    row = rep.steps.idle.iloc[0]
    assert row["slow_launch_us"] == 0
    assert row["idle_queued_us"] == pytest.approx((2 * SHORT) * 5, abs=1)
    assert GRAPH_ADVICE in found(rep, "launch-bound").remedy
    gi = found(rep, "gpu-idle")
    assert gi is None or ("first launches" not in gi.title
                          and gi.remedy != device_findings.SLOW_LAUNCH_REMEDY)


# -- a short synchronisation followed by host work --------------------------------------------

STEP = 100_000.0


def short_sync_trace(sync_us: float) -> Trace:
    """Each step: 10 kernels of 1 ms launched ahead; when they are done, a blocking
    ``cudaMemcpy`` of ``sync_us`` (its 2 µs copy starts 5 µs in); then 40 ms of host operators
    and 30 ms creating streams before the next step's launches."""
    t = Trace()
    for s in range(3):
        T = s * STEP
        t.step(s, T, STEP - 10)
        e = kernels_back_to_back(t, T, T + 20, 10, 1_000)
        m = e + 10
        t.launch(m, sync_us, m + 5, 2, name="Memcpy DtoH (Device -> Pageable)",
                 call="cudaMemcpy", cat="gpu_memcpy")
        t.host("aten::add_", m + 30, 40_000)
        t.host("cudaStreamCreateWithPriority", m + 40_100, 30_000, cat="cuda_runtime")
    return t


def test_a_short_sync_is_charged_no_more_than_it_held_the_host(tmp_path):
    """The 22 µs copy blocked the host 22 µs: without it the host would have been 22 µs ahead,
    no more. So 22 µs of the 70 ms that follow are sync (5 µs while the copy's own transfer
    waited, 15 µs after it inside the call, 2 µs after it returned) and the rest is what the
    host did: 40 ms of operators, 30 ms of stream creation (start-up). The rule before this
    charged the whole 70 ms to the 22 µs copy. No sync-stall finding: 22 µs is no stall."""
    short_sync_trace(22.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    idle_adds_up(rep)
    idle = rep.steps.idle.set_index("step")
    for step in (1, 2):
        assert idle.loc[step, "idle_sync_us"] == pytest.approx(22.0, abs=1e-3)
        assert idle.loc[step, "idle_cpu_us"] == pytest.approx(40_000.0, abs=1e-3)
        assert idle.loc[step, "idle_startup_us"] == pytest.approx(30_000.0, abs=1e-3)
    calls = rep.gpu.sync_calls
    # Bounded by the host's time inside blocking calls, call by call.
    assert (calls["idle_after_us"] <= calls["end_us"] - calls["ts_us"] + 1e-6).all()
    assert found(rep, "sync-stall") is None
    gi = found(rep, "gpu-idle")
    assert gi.remedy == device_findings.CAUSE_REMEDY["cpu"]
    assert "start-up and set-up calls" in gi.title


def test_a_long_sync_is_a_stall_with_its_call(tmp_path):
    """The verdict's twin: the copy blocks 50 ms (the host waits that long), so the 50 ms of
    host work that follow it are the stall's — the copy held the host as long."""
    short_sync_trace(50_000.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    f = found(rep, "sync-stall")
    assert f is not None and f.evidence["sync_op"] == "cudaMemcpy"
    idle = rep.steps.idle.set_index("step")
    # In the call: from the copy's launch to its end, less the 2 µs transfer; after it, as
    # much as the call held the host less that idle: 50 ms in all.
    assert idle.loc[1, "idle_sync_us"] == pytest.approx(50_000.0, abs=1e-3)


# -- a cross-stream event wait ----------------------------------------------------------------

def event_wait_trace(call: str, wait_us: float) -> Trace:
    """Each step: 10 kernels of 1 ms; a 10 µs ``aten::item``; then the host in ``call`` for
    ``wait_us`` (an event recorded on another device's stream: nothing runs here meanwhile);
    the next step's launches right after."""
    t = Trace()
    step = 10_020 + 30 + wait_us + 20
    for s in range(3):
        T = s * step
        t.step(s, T, step - 5)
        e = kernels_back_to_back(t, T, T + 20, 10, 1_000)
        t.host("aten::item", e + 10, 10)
        t.host(call, e + 30, wait_us, cat="cuda_runtime")
    return t


@pytest.mark.parametrize("call", ["cudaEventSynchronize", "cudaStreamWaitEvent"])
def test_an_event_wait_is_the_stall_not_the_item_before_it(tmp_path, call):
    """46.3 ms a step inside the event wait, the device idle: a sync stall charged to the wait
    (the rule before charged it to the 10 µs aten::item that ended just before the stretch)."""
    event_wait_trace(call, 46_300.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    f = found(rep, "sync-stall")
    assert f is not None
    assert f.evidence["sync_op"] == call
    assert "a wait for an event recorded on another stream" in f.title
    assert "event" in f.remedy
    # The wait, and the item's own 10 µs: nothing after the item, which held the host 10 µs
    # and the device idled all of them.
    assert f.cost_us == pytest.approx(46_310.0, abs=1)
    calls = rep.gpu.sync_calls
    item = calls[calls["name"] == "aten::item"]
    assert (item["idle_after_us"] <= 10.0 + 1e-6).all()


def test_a_short_event_wait_is_no_stall(tmp_path):
    """The healthy twin: the same waits of 20 µs."""
    event_wait_trace("cudaEventSynchronize", 20.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert found(rep, "sync-stall") is None


# -- CUDA graphs ------------------------------------------------------------------------------

def mid_work_trace() -> Trace:
    """vLLM's full-graph decode, caught mid-work: the host's Python runs from 0 to 10 ms; the
    device's first traced work is a graph replay at 4.6 ms (50 kernels of 8 µs, 2 µs apart)."""
    t = Trace()
    t.host("python: vllm/v1/worker/gpu_model_runner.py: execute_model", 0, 10_000,
           cat="python_function")
    c = t.launch(4_400, 20, 4_600, 0, name="placeholder", call="cudaGraphLaunch")
    t.events.pop()                              # the replay's kernels, not a kernel of its own
    graph_kernels(t, c, 4_600, 50, 8, 2)
    return t


def test_a_graph_replay_caught_mid_work_is_measured_over_the_device_span(tmp_path):
    """The 4.6 ms before the first traced device work are not idle: HTA's idle time breakdown
    (its own code, run here on the same file) measures the 49 gaps of 2 µs, and so does the
    report — not 47% of the trace. The job replays graphs: the launch-bound finding's remedy
    is about the launches left outside them, never "capture the step in a CUDA graph"."""
    from hta.trace_analysis import TraceAnalysis

    folder = tmp_path / "run"
    mid_work_trace().write(folder)
    logging.disable(logging.WARNING)
    try:
        analysis = TraceAnalysis(trace_dir=str(folder))
        hta, _ = analysis.get_idle_time_breakdown(ranks=[0], visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    rep = run(folder)
    bd = rep.steps.breakdown.iloc[0]
    assert bd["idle_us"] == pytest.approx(float(hta["idle_time"].sum()), abs=1e-6)
    assert bd["idle_us"] == pytest.approx(49 * 2, abs=1e-6)
    assert bd["window_us"] == pytest.approx(50 * 8 + 49 * 2, abs=1e-6)
    assert any("before it" in n and "not counted" in n for n in rep.notes)
    assert any("replays CUDA graphs (1 graph launch)" in n for n in rep.notes)
    lb = found(rep, "launch-bound")
    assert lb is not None and "already replays CUDA graphs" in lb.remedy
    assert all(GRAPH_ADVICE not in f.remedy for f in rep.findings)


def warmup_then_capture(capture: bool) -> Trace:
    """A capture trace as vLLM records it at start-up: 500 eager warm-up launches (5 µs
    kernels, 20 µs apart), then the capture: 300 launches that run nothing, and the
    instantiation."""
    t = Trace()
    end = launches(t, 0, 500)
    if capture:
        t.host("cudaStreamBeginCapture_v10000", end + 100, 5, cat="cuda_runtime")
        for i in range(300):
            t.host("cudaLaunchKernel", end + 110 + i * 12, 10, cat="cuda_runtime",
                   correlation=100_000 + i)
        t.host("cudaStreamEndCapture", end + 3_800, 5, cat="cuda_runtime")
        t.host("cudaGraphInstantiateWithFlags", end + 3_810, 50_000, cat="cuda_runtime")
    return t


def test_a_capture_trace_is_not_advised_to_use_graphs(tmp_path):
    """A trace that captures graphs and replays none: no launch-bound finding (its launches are
    set-up), the notes say it captures, and no remedy says to capture graphs."""
    warmup_then_capture(True).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert found(rep, "launch-bound") is None
    assert any("captures CUDA graphs (1 capture)" in n for n in rep.notes)
    assert all(GRAPH_ADVICE not in f.remedy for f in rep.findings)
    gi = found(rep, "gpu-idle")
    assert gi is not None and "profile the replays" in gi.remedy


def test_the_same_launches_without_capture_are_launch_bound(tmp_path):
    """The verdict's twin: the eager launches alone are launch-bound, and CUDA graphs are the
    remedy."""
    warmup_then_capture(False).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    lb = found(rep, "launch-bound")
    assert lb is not None and GRAPH_ADVICE in lb.remedy


def test_a_capture_step_is_start_up_and_the_replays_are_analysed(tmp_path):
    """ProfilerStep#0 warms up and captures (set-up, graph capture: start-up); steps 1–3
    replay the graph. Only the replays are steady state; both are named in the notes."""
    t = Trace()
    t.step(0, 0, 60_000)
    end = launches(t, 10, 100)
    t.host("cudaStreamBeginCapture", end + 10, 5, cat="cuda_runtime")
    for i in range(100):
        t.host("cudaLaunchKernel", end + 20 + i * 12, 10, cat="cuda_runtime",
               correlation=100_000 + i)
    t.host("cudaStreamEndCapture", end + 1_300, 5, cat="cuda_runtime")
    t.host("cudaGraphInstantiate", end + 1_310, 50_000, cat="cuda_runtime")
    for s in (1, 2, 3):
        T = 60_000 + (s - 1) * 2_000
        t.step(s, T, 2_000)
        c = t.launch(T + 10, 20, T + 40, 0, name="placeholder", call="cudaGraphLaunch")
        t.events.pop()
        graph_kernels(t, c, T + 40, 100, 8, 2)
    t.write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert sorted(rep.steps.breakdown["step"]) == [1, 2, 3]
    assert any("ProfilerStep#0 is start-up" in n and "cudaGraphInstantiate" in n
               for n in rep.notes)
    assert any("captures CUDA graphs" in n and "also replays graphs (3 graph launches)" in n
               for n in rep.notes)
    assert all(GRAPH_ADVICE not in f.remedy for f in rep.findings)


# -- GEMM coverage ----------------------------------------------------------------------------

def gemm_trace(graph_gemm_us: float) -> Trace:
    """Each step: one 4096³ bf16 ``aten::mm`` with shapes whose kernel takes 10 ms (4% of an
    A100's peak), and a graph replay of GEMM kernels without shapes of ``graph_gemm_us`` in
    all, on ten streams at once."""
    t = Trace()
    n = 4096
    step = 12_000 + graph_gemm_us / 10
    for s in range(3):
        T = s * step
        t.step(s, T, step)
        t.host("aten::mm", T + 10, 30, **{"Input Dims": [[n, n], [n, n]],
                                          "Input type": ["c10::BFloat16", "c10::BFloat16"]})
        t.launch(T + 20, 10, T + 40, 10_000, name="ampere_bf16_s16816gemm_bf16_128x128_nn")
        if graph_gemm_us:
            c = t.launch(T + 60, 20, T + 10_040, 0, name="placeholder", call="cudaGraphLaunch")
            t.events.pop()
            for k in range(10):
                graph_kernels(t, c, T + 10_040, 10, graph_gemm_us / 100, 0,
                              name="sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", stream=20 + k)
    return t


def test_the_gemm_verdict_states_its_coverage(tmp_path):
    """10 ms of GEMM time with shapes, 990 ms replayed by a graph without: the verdict on the
    10 ms says it covers ~1% of the GEMM time, and a note says so whatever the verdict."""
    gemm_trace(990_000.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    f = found(rep, "low-gemm-efficiency")
    assert f is not None
    assert "judged on ~1% of the GEMM kernel time" in f.title
    assert f.evidence["gemm_time_covered_pct"] == pytest.approx(1.0, rel=1e-6)
    assert any("covers ~1% of its GEMM kernel time" in n and "CUDA graph replays carry none"
               in n for n in rep.notes)


def test_full_gemm_coverage_is_not_qualified(tmp_path):
    """The healthy twin: every GEMM has its shapes — no coverage caveat, no note."""
    gemm_trace(0.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    f = found(rep, "low-gemm-efficiency")
    assert f is not None and "judged on" not in f.title
    assert f.evidence["gemm_time_covered_pct"] == pytest.approx(100.0)
    assert not any("GEMM" in n for n in rep.notes)


def test_trace_builder_host_thread_is_the_launching_thread():
    """The builder's host events and launches share one thread (the tests above rely on the
    launching thread being the one whose calls they place)."""
    t = Trace()
    t.launch(0, 10, 20, 5)
    assert {(e["pid"], e["tid"]) for e in t.events if e["cat"] == "cuda_runtime"} == \
        {(PID, TID)}
