"""overlap_pct against Holistic Trace Analysis on real GPU traces recorded by others.

HTA's ``get_comm_comp_overlap`` is run in the test on the same file; meshscope's whole-trace
overlap (``analysis.overlap.trace_overlap``) must agree within 1 percentage point.
"""
import logging
import shutil

import pytest

from analysis import overlap, timeline
from analysis.ingest import load_trace
from conftest import shared_trace

TRACES = [
    "gpu/hta/nccl_parser_config/nccl_data.json.gz",          # A100 DDP, ncclKernel_*
    "gpu/hta/trace_diff/control/control.json.gz",            # all_to_all + all_reduce
    "gpu/hta/trace_diff/test/test.json.gz",
    "gpu/hta/negative_queue_length_values_check/rank0.json.gz",
    "gpu/hta/trace_filter/sampled_rank-0.json.gz",           # subsampled rank of 128
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
