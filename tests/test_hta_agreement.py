"""overlap_pct against Holistic Trace Analysis on real GPU traces recorded by others.

HTA's ``get_comm_comp_overlap`` is run in the test on the same file; meshscope's whole-trace
overlap (``analysis.overlap.trace_overlap``) must agree within 1 percentage point.
"""
import logging
import shutil

import pytest

from meshscope.analysis.timeline import breakdown as overlap
from meshscope.analysis import intervals as iv
from meshscope.analysis.timeline import rank_timeline as timeline
from meshscope.analysis.timeline import step_windows
from meshscope.analysis.ingest.events import load_trace
from conftest import shared_trace

TRACES = [
    "gpu/hta/nccl_parser_config/nccl_data.json.gz",          # A100 DDP, ncclKernel_*
    "gpu/hta/trace_diff/control/control.json.gz",            # all_to_all + all_reduce
    "gpu/hta/trace_diff/test/test.json.gz",
    "gpu/hta/negative_queue_length_values_check/rank0.json.gz",
    "gpu/hta/trace_filter/sampled_rank-0.json.gz",           # subsampled rank of 128
    "gpu/hta/trace_filter/sampled_rank-1.json.gz",
    "gpu/hta/df_index_resolver/df_index_resolver.json.gz",   # 2,020 all_reduce, overlap 0
]


def hta_overlap_pct(path, tmp_path) -> float:
    from hta.trace_analysis import TraceAnalysis

    folder = tmp_path / "hta"
    folder.mkdir()
    shutil.copy(path, folder / path.name)
    logging.disable(logging.WARNING)
    try:
        df = TraceAnalysis(trace_dir=str(folder)).get_comm_comp_overlap(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    assert len(df) == 1
    return float(df["comp_comm_overlap_pctg"].iloc[0])


@pytest.mark.parametrize("rel", TRACES)
def test_overlap_pct_agrees_with_hta(rel, tmp_path):
    path = shared_trace(rel)
    ours = overlap.trace_overlap(timeline.build(load_trace(path)))
    assert ours["comm_us"] > 0
    assert ours["overlap_pct"] == pytest.approx(hta_overlap_pct(path, tmp_path), abs=1.0)


def test_rccl_trace_hta_cannot_load_is_still_reported(tmp_path):
    """MI300X DDP over RCCL: HTA's loader fails on it (an int16 overflow in its symbol
    table); meshscope reads the ``ncclDevKernel_Generic`` collectives and, over the whole
    trace, finds the overlap the corpus's own collector recorded (MANIFEST.md: 0.222)."""
    from hta.trace_analysis import TraceAnalysis

    path = shared_trace("gpu/tracelens/traces/mi300/resnet_act_checkpoint.json.gz")
    folder = tmp_path / "hta"
    folder.mkdir()
    shutil.copy(path, folder / path.name)
    logging.disable(logging.WARNING)
    try:
        with pytest.raises(TypeError, match="int16"):
            TraceAnalysis(trace_dir=str(folder)).get_comm_comp_overlap(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    trace = load_trace(path)
    dev = trace.events[trace.events["device"]]
    comm = dev[dev["kind"] == "communication"]
    assert len(comm) > 0 and comm["name"].str.startswith("ncclDevKernel_Generic").all()
    # The corpus's collector measures over the whole trace (no step left out).
    tl = timeline.build(trace)
    assert overlap.overlap_pct(tl.compute, tl.comm) == pytest.approx(22.2, abs=1.0)


def test_symmetric_memory_all_reduce_is_communication_out_of_the_box(tmp_path):
    """vLLM TP=8 on B200: the tensor-parallel all-reduce runs in symmetric-memory
    ``multimem_all_reduce_kernel`` kernels, which no NCCL name matches. HTA finds one
    communication kernel (the single NCCL all-gather); meshscope classes the 73 all-reduce
    kernels as communication too, with tensor parallelism as their likely dimension — and over
    the same NCCL kernel alone both still agree on the overlap."""
    path = shared_trace("gpu/tracelens/traces/b200/eager_trace.json.gz")
    trace = load_trace(path)
    dev = trace.events[trace.events["device"]]
    comm = dev[dev["kind"] == "communication"]
    assert len(comm) == 74
    assert comm["name"].str.contains("multimem_all_reduce").sum() == 73
    assert comm["name"].str.startswith("ncclDevKernel_AllGather").sum() == 1
    tl = timeline.build(trace)
    nccl_kernels = comm[comm["name"].str.startswith("nccl")]
    assert overlap.trace_overlap(tl)["comm_us"] > \
        iv.length(iv.union(nccl_kernels["ts_us"], nccl_kernels["end_us"]))
    # HTA's selection (kernels launched before the last profiled step), NCCL kernels only.
    sel = step_windows.complete_steps(dev, trace.events[~trace.events["device"]], tl.steps)
    nccl = sel[(sel["kind"] == "communication") & sel["name"].str.startswith("nccl")]
    compute = sel[sel["kind"] == "compute"]
    ours_nccl = overlap.overlap_pct(iv.union(compute["ts_us"], compute["end_us"]),
                                    iv.union(nccl["ts_us"], nccl["end_us"]))
    assert ours_nccl == pytest.approx(hta_overlap_pct(path, tmp_path), abs=1.0)
