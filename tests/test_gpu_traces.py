"""Real GPU traces recorded by others (../shared/traces/gpu/), held against tools nobody here
wrote: HTA's idle time breakdown per stream, and the former TensorBoard profiler plugin's step
times and categories (``torch_tb_profiler``'s own parser, installed by ``make setup``).
"""
from __future__ import annotations

import logging
import shutil

import pytest

from meshscope.analysis.report.analyze import analyze
from conftest import shared_trace

HTA_TRACES = [
    "gpu/hta/nccl_parser_config/nccl_data.json.gz",
    "gpu/hta/trace_diff/control/control.json.gz",
    "gpu/hta/trace_diff/test/test.json.gz",
    "gpu/hta/negative_queue_length_values_check/rank0.json.gz",
]


def _folder_with(path, tmp_path):
    folder = tmp_path / "trace"
    folder.mkdir()
    shutil.copy(path, folder / path.name)
    return folder


@pytest.mark.parametrize("rel", HTA_TRACES)
def test_stream_idle_agrees_with_hta(rel, tmp_path):
    """Per stream, the share of the idle time HTA calls host wait (the next kernel's launch
    came after the previous kernel ended) agrees within 2 percentage points, and the idle
    time itself within 2% of HTA's."""
    from hta.trace_analysis import TraceAnalysis

    path = shared_trace(rel)
    folder = _folder_with(path, tmp_path)
    logging.disable(logging.WARNING)
    try:
        analysis = TraceAnalysis(trace_dir=str(folder))
        hta, _ = analysis.get_idle_time_breakdown(ranks=list(analysis.t.traces),
                                                  visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    rank = int(hta["rank"].iloc[0])
    ours = analyze(folder, workers=1).gpu.stream_idle
    ours = ours[ours["rank"] == rank].assign(stream=lambda d: d["stream"].str.split(":").str[-1])
    checked = 0
    for stream, g in hta.groupby("stream"):
        total = float(g["idle_time"].sum())
        if total < 1000:            # under 1 ms of idle on the stream: nothing to compare
            continue
        mine = ours[ours["stream"] == str(stream)]
        assert len(mine) == 1, f"stream {stream} missing"
        m = mine.iloc[0]
        host = float(g.loc[g["idle_category"] == "host_wait", "idle_time"].sum())
        assert m["idle_us"] == pytest.approx(total, rel=0.02)
        assert 100 * m["host_wait_us"] / m["idle_us"] == pytest.approx(100 * host / total,
                                                                       abs=2.0)
        checked += 1
    assert checked >= 1


def _plugin_steps(path):
    tbp = pytest.importorskip(
        "torch_tb_profiler.profiler.data",
        reason="torch-tb-profiler (the former TensorBoard plugin; make setup installs it) is "
               "not installed")
    from torch_tb_profiler.profiler.event_parser import ProfileRole

    logging.disable(logging.WARNING)
    try:
        prof = tbp.RunProfileData.parse("worker0", "span", str(path), "/tmp")
    finally:
        logging.disable(logging.NOTSET)
    return {int(n): {r.name: c.costs[r] for r in ProfileRole}
            for n, c in zip(prof.steps_names, prof.steps_costs)}


def test_pytorch_1_8_sample_steps_and_categories_as_the_plugin_defines_them(tmp_path):
    """The plugin's own sample (PyTorch 1.8 categories): every step's time and its Kernel,
    Memcpy, Memset, Runtime, DataLoader, CPU Exec and Other time as the plugin computes them,
    to the microsecond (its events are whole microseconds)."""
    path = shared_trace("gpu/kineto_tb_samples/resnet50_profiler_api_num_workers_4/"
                        "worker0.pt.trace.json.gz")
    plugin = _plugin_steps(path)
    rep = analyze(_folder_with(path, tmp_path), workers=1)
    cats = rep.gpu.step_categories.set_index("step")
    assert sorted(cats.index) == sorted(plugin)
    for step, costs in plugin.items():
        row = cats.loc[step]
        assert row["window_us"] == pytest.approx(costs["Total"], abs=1)
        for ours, theirs in (("kernel_us", "Kernel"), ("memcpy_us", "Memcpy"),
                             ("memset_us", "Memset"), ("runtime_us", "Runtime"),
                             ("dataloader_us", "DataLoader"), ("cpu_exec_us", "CpuOp"),
                             ("other_us", "Other")):
            assert row[ours] == pytest.approx(costs[theirs], abs=1), (step, ours)
    # The breakdown's step windows are the same device-side windows.
    bd = rep.steps.breakdown.set_index("step")
    for step, costs in plugin.items():
        assert bd.loc[step, "window_us"] == pytest.approx(costs["Total"], abs=1)


def test_gpu_runs_behind_the_host_steps_are_timed_on_the_gpu(tmp_path):
    """MI300X DDP trace whose GPU runs about 30 ms behind its host: on the host's windows step
    17 looked 53.8 ms long with 9 of the 12 collectives; on the device's, the three steps are
    alike and each holds its own all-reduces."""
    path = shared_trace("gpu/tracelens/traces/mi300/resnet_act_checkpoint.json.gz")
    rep = analyze(_folder_with(path, tmp_path), workers=1)
    w = rep.steps.breakdown.set_index("step")["window_us"]
    assert w.max() / w.min() < 1.1
    per_step = rep.comm.instances.groupby("step").size()
    assert per_step.max() - per_step.min() <= 1


@pytest.mark.parametrize("rel", [
    "gpu/hta/nccl_parser_config/nccl_data.json.gz",
    "gpu/hta/negative_queue_length_values_check/rank0.json.gz",
    "gpu/hta/trace_filter/sampled_rank-0.json.gz",
    "gpu/hta/df_index_resolver/df_index_resolver.json.gz",
])
def test_a_gpu_idle_over_a_third_of_the_step_always_gets_a_finding(rel, tmp_path):
    path = shared_trace(rel)
    rep = analyze(_folder_with(path, tmp_path), workers=1)
    bd = rep.steps.breakdown
    share = float((bd["idle_us"] / bd["window_us"]).mean())
    assert share > 1 / 3
    ids = [f.id for f in rep.findings]
    assert "gpu-idle" in ids
    f = next(f for f in rep.findings if f.id == "gpu-idle")
    # It says where the time went: the causes it lists add up to the idle time.
    assert sum(f.evidence["by_cause_us"].values()) == pytest.approx(f.evidence["idle_us"],
                                                                    rel=1e-6)
