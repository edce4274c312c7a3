"""The shipped samples' numbers held against scans of their raw inputs written here, not against
what the code wrote before (issue 52 item 4; tests/test_sample_regression.py is the change
alarm beside this): a rank's step window is the mean length of its trace's ``ProfilerStep#N``
spans; a collective's bytes are the element count of its ``Input Dims`` times the size of its
``Input type``; the timer's step time per step is the slowest rank's ``wall_time_us`` in the
raw step-timer files."""
from __future__ import annotations

import gzip
import json
import math
import statistics

import pandas as pd
import pytest

from conftest import ROOT

# A 1F1B pipeline over data parallelism, and the same with its rank 1 slowed (the others' traces:
# 12 MB more to read, kept out of the suite's time).
SAMPLES = ("dp2-pp2-1f1b", "dp2-pp2-slow-rank1")
# Bytes of one element of each tensor type the samples' collectives carry (PyTorch's names).
ELEMENT_BYTES = {"float": 4, "double": 8, "long int": 8, "int": 4, "c10::BFloat16": 2,
                 "c10::Half": 2}


def _raw_traces(sample: str) -> dict[int, list[dict]]:
    """Each rank's raw trace events, the rank read from the trace's own distributedInfo."""
    out = {}
    for path in sorted((ROOT / "samples" / sample / "traces").glob("*.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        out[doc["distributedInfo"]["rank"]] = doc["traceEvents"]
    return out


@pytest.fixture(scope="module", params=SAMPLES)
def sample(request):
    name = request.param
    return name, _raw_traces(name), json.loads(
        (ROOT / "samples" / name / "report" / "summary.json").read_text())


def test_each_ranks_window_is_the_mean_of_its_profiler_steps(sample):
    """A CPU trace's step window is its ``ProfilerStep#N`` span (docs/metrics.md): a rank's
    ``window_us`` their mean; the run's, the longest rank's span of each step, mean over the
    steps."""
    name, traces, summary = sample
    per_rank = {r["rank"]: r for r in summary["per_rank_mean"]}
    assert set(per_rank) == set(traces), name
    spans = {rank: {e["name"]: e["dur"] for e in events if e.get("ph") == "X"
                    and str(e.get("name", "")).startswith("ProfilerStep#")}
             for rank, events in traces.items()}
    for rank, of_step in spans.items():
        assert sorted(of_step) == [f"ProfilerStep#{s}" for s in summary["steps"]], (name, rank)
        assert per_rank[rank]["window_us"] == pytest.approx(statistics.mean(of_step.values()),
                                                            abs=0.01)
    longest = [max(of_step[f"ProfilerStep#{s}"] for of_step in spans.values())
               for s in summary["steps"]]
    assert summary["window_us"] == pytest.approx(statistics.mean(longest), abs=0.01)


def test_each_collectives_bytes_are_its_input_dims_times_its_element_size(sample):
    """Every all-reduce of the report carries the bytes of a raw ``gloo:all_reduce`` of the
    traces, and every raw one's size is among the report's."""
    name, traces, _ = sample
    raw = {math.prod(e["args"]["Input Dims"][0]) * ELEMENT_BYTES[e["args"]["Input type"][0]]
           for ev in traces.values() for e in ev
           if e.get("name") == "gloo:all_reduce" and e.get("args", {}).get("Input Dims")}
    coll = pd.read_parquet(ROOT / "samples" / name / "report" / "collectives.parquet")
    reported = set(coll.loc[coll["op"] == "all_reduce", "msg_bytes"].astype(int))
    assert reported == raw, (name, sorted(reported ^ raw)[:10])


def test_the_timers_step_time_is_the_slowest_ranks_wall_time(sample):
    name, _, summary = sample
    steps = pd.concat(pd.read_parquet(p) for p in
                      sorted((ROOT / "samples" / name / "steps").glob("rank*.parquet")))
    slowest = steps.groupby("step")["wall_time_us"].max()
    thr = pd.read_parquet(ROOT / "samples" / name / "report" / "throughput.parquet")
    assert len(thr) > 0
    for row in thr.itertuples():
        assert row.step_time_us == pytest.approx(slowest[row.step], rel=1e-9), (name, row.step)
    # The headline is the median of those raw maxima over the steps that are not warm-up (which
    # steps are warm-up is the report's judgement: step_heatmap.parquet).
    heat = pd.read_parquet(ROOT / "samples" / name / "report" / "step_heatmap.parquet")
    warm = set(heat.loc[heat["warmup"], "step"])
    assert summary["step_time_source"] == "timer"
    assert summary["step_time_us"] == pytest.approx(
        statistics.median(slowest[s] for s in slowest.index if s not in warm), rel=1e-9)
