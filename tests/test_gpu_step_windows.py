"""Every step analysed, and only steps: step ranges on small hand-made Kineto traces whose answer
is known by construction (tests/gpu_trace_builder.py), each beside a healthy twin.

- a step range longer than the profiler's own span is clipped to it (a 13.3 s step in a
  355 ms trace is not a step);
- repeated ``ProfilerStep#N`` numbers (several profiler windows in one file) are kept apart,
  window by window: every range is a step;
- a step whose ``ProfilerStep`` event was dropped is named in the problems;
- a start-up step (CUDA initialisation, stream creation, a first launch loading its module) is
  left out of the steady-state steps;
- the device is taken from the trace's ``deviceProperties`` as well as its kernels.
"""
from __future__ import annotations

import gzip
import json

import pytest

from meshscope.analysis.report.analyze import analyze
from gpu_trace_builder import Trace, kernels_back_to_back


def run(folder, **kw):
    return analyze(folder, workers=1, cache_dir=None, **kw)


# -- a step range longer than the trace -------------------------------------------------------

def overlong_trace(last_step_us: float, profiler_range: bool = True) -> Trace:
    """Four steps 85 ms apart, each 60 ms of kernels; the profiler's own range spans 355 ms;
    ProfilerStep#3's range lasts ``last_step_us``."""
    t = Trace()
    if profiler_range:
        t.host("PyTorch Profiler (0)", 0, 355_000, cat="Trace")
    for s in range(4):
        T = s * 85_000
        t.step(s, T, last_step_us if s == 3 else 80_000)
        kernels_back_to_back(t, T + 10, T + 20, 30, 2_000)
    return t


@pytest.mark.parametrize("profiler_range", [True, False])
def test_a_step_longer_than_the_trace_is_clipped(tmp_path, profiler_range):
    """ProfilerStep#3 says it lasts 13.3 s in a trace of 355 ms: its window ends where the
    profiler's span ends — its own range, or without one its events' extent (the first launch
    at 10 µs to the last kernel's end at 315.02 ms) and a tenth of it — and a note says so."""
    overlong_trace(13_300_000.0, profiler_range).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    w = rep.steps.breakdown.set_index("step")["window_us"]
    hi = 355_000.0 if profiler_range else 315_020.0 + 0.1 * (315_020.0 - 10.0)
    assert w.loc[3] == pytest.approx(hi - 255_000.0, abs=1e-6)
    assert list(w.loc[[0, 1, 2]]) == pytest.approx([80_000.0] * 3, abs=1e-6)
    assert any("ProfilerStep#3 runs" in n and "past the profiler's own span" in n
               for n in rep.notes)
    # The idle that the long range made is gone with it.
    assert rep.steps.breakdown.set_index("step").loc[3, "idle_us"] < 100_000


def test_a_step_inside_the_trace_is_left_as_it_is(tmp_path):
    """The healthy twin: ProfilerStep#3 lasts 80 ms like the others."""
    overlong_trace(80_000.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    w = rep.steps.breakdown.set_index("step")["window_us"]
    assert w.loc[3] == pytest.approx(80_000.0, abs=1e-6)
    assert not any("past the profiler's own span" in n for n in rep.notes)


# -- repeated step numbers ---------------------------------------------------------------------

def windows_trace(windows: int, first: int = 0, per_window: int = 5) -> Trace:
    """``windows`` profiler windows in one file, each of the steps ``first`` … ``first +
    per_window - 1``: each step 10 ms of kernels (window w's step k: ``k + 1`` kernels of
    1 ms, so every step is told by its compute time), the device-side ProfilerStep range
    beside it as Kineto writes it."""
    t = Trace()
    T = 0.0
    for w in range(windows):
        for k in range(per_window):
            n = first + k
            t.step(n, T, 20_000)
            end = kernels_back_to_back(t, T + 10, T + 20, k + 1, 1_000)
            t.events.append({"ph": "X", "cat": "gpu_user_annotation", "name":
                             f"ProfilerStep#{n}", "pid": 0, "tid": 7, "ts": T + 20,
                             "dur": end - (T + 20)})
            T += 25_000
        T += 1_000_000          # the next window, a second later
    return t


def test_repeated_step_numbers_are_kept_apart_by_window(tmp_path):
    """Ten windows of ProfilerStep#0–#4: all 50 ranges are steps (before, 45 of them were
    ignored), numbered window after window, each with its own kernels."""
    windows_trace(10).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    bd = rep.steps.breakdown.set_index("step")
    assert list(bd.index) == list(range(50))
    for step in range(50):
        assert bd.loc[step, "compute_us"] == pytest.approx((step % 5 + 1) * 1_000, abs=1e-6)
        assert bd.loc[step, "window_us"] < 30_000
    assert any("10 profiler windows" in n and "all 50 steps are analysed" in n
               for n in rep.notes)


def test_windows_that_start_later_follow_the_previous_one(tmp_path):
    """Windows of ProfilerStep#10–#14 three times: steps 10–24."""
    windows_trace(3, first=10).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert sorted(rep.steps.breakdown["step"]) == list(range(10, 25))
    assert any("ProfilerStep#10 of window 2 is step 15" in n for n in rep.notes)


def test_unique_step_numbers_are_the_steps(tmp_path):
    """The healthy twin: one window of 50 numbered steps, no note."""
    windows_trace(1, per_window=50).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert sorted(rep.steps.breakdown["step"]) == list(range(50))
    assert not any("profiler windows" in n for n in rep.notes)


# -- a dropped ProfilerStep event ---------------------------------------------------------------

def _write(doc: dict, folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "rank0.json.gz", "wt") as f:
        json.dump(doc, f)


@pytest.mark.parametrize("dur, why", [(-5, "a negative duration"), ("x", "not a number")])
def test_a_dropped_step_event_is_named(tmp_path, dur, why):
    """ProfilerStep#2's duration is unusable: the event is dropped (and counted), and the
    problems say that step 2 is missing from the rank."""
    t = Trace()
    for s in range(4):
        t.step(s, s * 30_000, 25_000)
        kernels_back_to_back(t, s * 30_000 + 10, s * 30_000 + 20, 10, 2_000)
    doc = t.doc()
    for ev in doc["traceEvents"]:
        if ev["name"] == "ProfilerStep#2":
            ev["dur"] = dur
    _write(doc, tmp_path / "run")
    rep = run(tmp_path / "run")
    assert 2 not in set(rep.steps.breakdown["step"])
    lines = [p for p in rep.problems if "ProfilerStep#2 dropped" in p]
    assert len(lines) == 1 and why in lines[0] and "missing from this rank's figures" in lines[0]


def test_no_step_line_when_no_step_is_dropped(tmp_path):
    t = Trace()
    for s in range(4):
        t.step(s, s * 30_000, 25_000)
        kernels_back_to_back(t, s * 30_000 + 10, s * 30_000 + 20, 10, 2_000)
    t.write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert not any("ProfilerStep" in p for p in rep.problems)


# -- start-up steps --------------------------------------------------------------------------

def startup_trace(first_launch_us: float, streams_us: float) -> Trace:
    """ProfilerStep#0: stream creation (``streams_us``), a first launch of
    ``first_launch_us``, ten kernels; steps 1–3: ten 2 ms kernels each, launched ahead."""
    t = Trace()
    step0 = streams_us + first_launch_us + 25_000
    t.step(0, 0, step0)
    t.host("cudaStreamCreateWithPriority", 10, streams_us, cat="cuda_runtime")
    L = streams_us + 20
    t.launch(L, first_launch_us, L + first_launch_us + 5, 1_000,
             name="void cudnn::conv_kernel")
    kernels_back_to_back(t, L + first_launch_us + 10, L + first_launch_us + 1_010, 10, 2_000)
    for s in (1, 2, 3):
        T = step0 + (s - 1) * 21_000
        t.step(s, T, 21_000)
        kernels_back_to_back(t, T + 10, T + 20, 10, 2_000)
    return t


def test_a_start_up_step_is_left_out_of_the_steady_state(tmp_path):
    """ProfilerStep#0 spends 1 s in its first launch and 50 ms creating streams: it is
    start-up, named in the notes with what it did, and the figures are the other steps'."""
    startup_trace(1_000_000.0, 50_000.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert sorted(rep.steps.breakdown["step"]) == [1, 2, 3]
    note = next(n for n in rep.notes if "ProfilerStep#0 is start-up" in n)
    assert "cudaLaunchKernel ×1 (1,000.0 ms)" in note
    assert "cudaStreamCreateWithPriority ×1 (50.0 ms)" in note
    assert not [f for f in rep.findings if f.id in ("launch-bound", "gpu-idle")]


def test_an_ordinary_first_step_is_analysed(tmp_path):
    """The healthy twin: a first launch of 10 µs and 0.1 ms of stream creation."""
    startup_trace(10.0, 100.0).write(tmp_path / "run")
    rep = run(tmp_path / "run")
    assert sorted(rep.steps.breakdown["step"]) == [0, 1, 2, 3]
    assert not any("start-up" in n for n in rep.notes)


# -- the device ------------------------------------------------------------------------------

def range_profiler_trace(device_properties: bool) -> dict:
    """A CUPTI range-profiler trace as Kineto writes it: the host's operators and launches,
    one ``cuda_profiler_range`` event of counters per kernel, and no kernel events."""
    t = Trace()
    for s in range(3):
        T = s * 10_000
        t.step(s, T, 9_000)
        for i in range(5):
            t.host("aten::mm", T + 100 + i * 1_000, 500)
            t.host("cudaLaunchKernel", T + 200 + i * 1_000, 10, cat="cuda_runtime",
                   correlation=s * 10 + i + 1)
            t.events.append({"ph": "X", "cat": "cuda_profiler_range",
                             "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 0,
                             "ts": T + 300 + i * 1_000, "dur": 400,
                             "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum":
                                      1234}})
    doc = t.doc()
    if not device_properties:
        doc.pop("deviceProperties")
    return doc


def test_a_range_profiler_trace_of_an_a100_is_a_gpu(tmp_path):
    """No kernel events, but the trace names an A100: the device is a GPU, and the notes say
    why there are no device figures."""
    _write(range_profiler_trace(True), tmp_path / "run")
    rep = run(tmp_path / "run")
    assert rep.summary.device == "gpu"
    assert any("NVIDIA A100-SXM4-80GB" in n and "cuda_profiler_range" in n for n in rep.notes)


def test_a_trace_naming_no_device_and_running_no_kernel_is_cpu(tmp_path):
    """The twin: the same events, without deviceProperties, say nothing of a GPU."""
    _write(range_profiler_trace(False), tmp_path / "run")
    rep = run(tmp_path / "run")
    assert rep.summary.device == "cpu"
    assert not any("deviceProperties" in n for n in rep.notes)


def test_a_start_up_step_on_one_rank_is_left_out_on_every_rank(tmp_path):
    """Two ranks, one all-reduce a step (matched by its sequence number): rank 0's first step
    is start-up (a 1 s first launch), rank 1's is not. Both leave step 0 out, so their steps
    and collectives still match across ranks; rank 1's note says why."""
    for rank in (0, 1):
        t = Trace(rank=rank, world=2)
        first_launch = 1_000_000.0 if rank == 0 else 10.0
        T = 0.0
        for s in range(4):
            step = (first_launch + 30_000) if s == 0 else 30_000
            t.step(s, T, step)
            L = T + 10
            if s == 0:
                t.launch(L, first_launch, L + first_launch + 5, 100, name="void cudnn::conv")
                L += first_launch + 110
            end = kernels_back_to_back(t, L, L + 10, 10, 2_000)
            t.launch(L + 150, 10, end, 2_000,
                     name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", stream=20)
            t.host("record_param_comms", L + 140, 30, **{
                "Collective name": "allreduce", "In msg nelems": 1 << 20,
                "Out msg nelems": 1 << 20, "dtype": "Float", "Process Group Name": "0",
                "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
                "Group size": 2, "Seq": s + 1})
            T += step
        t.write(tmp_path / "run", f"rank{rank}.json.gz")
    rep = run(tmp_path / "run")
    assert sorted(set(rep.steps.breakdown["step"])) == [1, 2, 3]
    assert rep.steps.breakdown.groupby("rank")["step"].apply(sorted).tolist() == [[1, 2, 3]] * 2
    assert rep.summary.cross_rank.matchable, rep.summary.cross_rank.why_not
    assert any(n.startswith("rank 1: step 0 left out as on the ranks where it is start-up")
               for n in rep.notes)
    assert set(rep.gpu.kernel_totals["step"]) == {1, 2, 3}
