"""Clocks once and transfer-not-waiting, on a real 2-rank gloo pipeline run made here.

One module fixture: ``meshscope run --layout pp=2`` (two stages, 1F1B, 4 microbatches, 4
steps) and, in the same session, ``meshscope bench-comm --layout pp=2 --ops send_recv`` at the
size of the run's pipeline messages; then a copy of the run whose rank 1 trace clock is moved
10 s ahead (every ``ts`` + 10 s, as the damage corpus's ``clock-skew-plus-10s`` does — the
runner has no clock-skew fault), and ``meshscope analyze`` of both. Nothing here builds a
report table by hand: the offsets, the instance table, the timeline table and the export are
the analysis' own.

- In the Perfetto export of the skewed run, every matched-collective slice of a rank starts at
  one of that rank's own (aligned) ``c10d::`` host calls and ends at the end of one of its own
  ``gloo:`` ranges: the op's own extent, not 10 s away from it.
- The timeline page's arrows, put back on the aligned clock through the step's start (read
  from the raw traces and the offsets here), end inside an operation of the rank that waited.
- pp send/recv: gloo's ranges of batched ``isend``/``irecv`` are waits for asynchronous work,
  so the report leaves their busbw empty (never the wait-dominated bytes / span), keeps the
  receive's wait for its sender as wait, and ``bench-comm``'s measurement of the same size
  stands beside it in the same session.
"""
from __future__ import annotations

import gzip
import json
import pathlib
import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import meshscope
from damage_corpus import _shift_clock, edit_trace
from meshscope.analysis.report.perfetto import COLLECTIVES_TID, SEGMENTS_TID, export

pytestmark = pytest.mark.slow

SHIFT_US = 10_000_000
RUN = "pp2"
SKEWED = "pp2-skewed"


def _events(run: pathlib.Path, rank: int) -> list[dict]:
    doc = json.loads(gzip.decompress((run / "traces" / f"rank{rank}.json.gz").read_bytes()))
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("clocks-p2p")
    run = root / RUN
    meshscope("run", "--layout", "pp=2", "--steps", 4, "--out", run, check=True)
    skewed = root / SKEWED
    shutil.copytree(run, skewed)
    edit_trace(skewed, 1, _shift_clock)
    for r in (run, skewed):
        meshscope("analyze", r, check=True)
    inst = pd.read_parquet(run / "report" / "instances.parquet")
    sizes = sorted(set(inst.loc[inst["p2p"], "msg_bytes"].dropna().astype(int)))
    assert len(sizes) == 1, sizes          # the tiny model's activations: one message size
    bench = root / "bench"
    meshscope("bench-comm", "--layout", "pp=2", "--ops", "send_recv", "--sizes", sizes[0],
              "--out", bench, check=True)
    return {"run": run, "skewed": skewed, "bench": bench, "msg_bytes": sizes[0]}


def _offsets(run: pathlib.Path) -> dict[int, float]:
    t = pd.read_parquet(run / "report" / "clock_offsets.parquet")
    return dict(zip(t["rank"].astype(int), t["applied_us"].astype(float)))


def test_the_skewed_rank_is_aligned_by_10_s(runs):
    applied = _offsets(runs["skewed"])
    assert abs(applied[1] - SHIFT_US) < 1e3 and applied[0] == 0.0
    assert _offsets(runs["run"])[1] == 0.0        # same host, same clock: nothing applied


def test_export_slices_sit_on_the_ranks_own_calls_and_ranges(runs, tmp_path):
    out = tmp_path / "skewed.json"
    export(runs["skewed"], out, report_dir=runs["skewed"] / "report")
    doc = json.loads(out.read_text())
    applied = _offsets(runs["skewed"])
    for rank in (0, 1):
        raw = _events(runs["skewed"], rank)
        calls = np.array(sorted(e["ts"] - applied[rank] for e in raw
                                if e["name"].startswith("c10d::")))
        ends = np.array(sorted(e["ts"] + e["dur"] - applied[rank] for e in raw
                               if e["name"].startswith("gloo:")))
        slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == rank
                  and e.get("tid") == COLLECTIVES_TID]
        # Every send and recv of the profiled steps is matched, so each has its slice.
        inst = pd.read_parquet(runs["skewed"] / "report" / "instances.parquet")
        assert len(slices) == int((inst["rank"] == rank).sum()) > 0
        for sl in slices:
            start, end = sl["ts"], sl["ts"] + sl["dur"]
            assert np.abs(calls - start).min() < 1.0, (rank, sl)
            assert np.abs(ends - end).min() < 1.0, (rank, sl)
        # The export's own copy of the rank's trace events is shifted by the same offset.
        mine = sorted(e["ts"] for e in doc["traceEvents"] if e["ph"] == "X"
                      and e["pid"] == rank and e.get("tid") not in (COLLECTIVES_TID,
                                                                    SEGMENTS_TID))
        assert mine[0] == pytest.approx(min(e["ts"] for e in raw) - applied[rank], abs=0.01)


def test_export_draws_the_reports_segments_on_the_ranks_own_steps(runs, tmp_path):
    """The "report breakdown" thread: the report's timeline rows, one slice each, put back on
    the aligned clock by the report's step anchor — inside the rank's own (aligned)
    ProfilerStep, and each wait inside one of the rank's own operations."""
    skewed = runs["skewed"]
    out = tmp_path / "skewed.json"
    export(skewed, out, report_dir=skewed / "report")
    doc = json.loads(out.read_text())
    seg = pd.read_parquet(skewed / "report" / "timeline.parquet")
    inst = pd.read_parquet(skewed / "report" / "instances.parquet")
    applied = _offsets(skewed)
    for rank in (0, 1):
        slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == rank
                  and e.get("tid") == SEGMENTS_TID]
        assert len(slices) == int((seg["rank"] == rank).sum()) > 0
        steps = {int(e["name"].split("#")[1]): (e["ts"] - applied[rank],
                                                 e["ts"] + e["dur"] - applied[rank])
                 for e in _events(skewed, rank) if e["name"].startswith("ProfilerStep#")}
        ops = inst[inst["rank"] == rank]
        lo = ops[["call_ts_us", "exec_ts_us"]].min(axis=1).to_numpy()
        hi = ops["end_us"].to_numpy()
        for sl in slices:
            a, b = steps[sl["args"]["step"]]
            assert a - 1.0 <= sl["ts"] and sl["ts"] + sl["dur"] <= b + 1.0, (rank, sl)
            if sl["name"].startswith("wait"):
                assert ((lo - 1.0 <= sl["ts"]) & (sl["ts"] + sl["dur"] <= hi + 1.0)).any(), sl


def _step_start_us(run: pathlib.Path, step: int) -> float:
    """The step's earliest start over the ranks on the aligned clock, from the raw traces."""
    applied = _offsets(run)
    return min(e["ts"] - applied[r] for r in (0, 1) for e in _events(run, r)
               if e["name"] == f"ProfilerStep#{step}")


def _page(run: pathlib.Path, step: int, rank: int | None = None):
    from meshscope.dashboard import state as st
    from meshscope.dashboard.data import open_report
    from meshscope.dashboard.pages import timeline
    from meshscope.dashboard.pages.common import PageContext
    from meshscope.dashboard.runs import RunIndex

    ctx = PageContext(open_report(RunIndex(run.parent).get(run.name)),
                      st.ViewState(page="timeline", runs=(run.name,), step=step, rank=rank))
    return timeline, ctx


def test_timeline_arrows_end_inside_the_waiting_ranks_own_operation(runs):
    skewed = runs["skewed"]
    inst = pd.read_parquet(skewed / "report" / "instances.parquet")
    steps = sorted(inst["step"].unique())
    drawn = 0
    for step in steps:
        timeline, ctx = _page(skewed, int(step))
        _, arrows, applied = timeline._segments(ctx, int(step))
        assert abs(applied[1] - SHIFT_US) < 1e3
        t0 = _step_start_us(skewed, int(step))
        anchor = pd.read_parquet(skewed / "report" / "timeline.parquet")
        assert anchor.loc[anchor["step"] == step, "step_start_us"].tolist() == \
            pytest.approx([t0] * int((anchor["step"] == step).sum()), abs=1.0)
        for waiter, culprit, a, b in arrows:
            assert waiter != culprit
            ops = inst[(inst["rank"] == waiter) & (inst["step"] == step)]
            lo = ops[["call_ts_us", "exec_ts_us"]].min(axis=1)
            inside = (lo - 1.0 <= t0 + b) & (t0 + b <= ops["end_us"] + 1.0)
            assert inside.any(), (step, waiter, culprit, a, b)
            drawn += 1
    assert drawn > 0          # a 1F1B pipeline's stages wait for each other every step
    # The same run on one clock draws the same arrows (within the offset's uncertainty). The
    # skewed copy is put back by the estimated offset, the unskewed run by none (its estimate
    # is within its uncertainty): the two clocks differ by the estimate's error, a few µs, and
    # a wait that short may be charged on one side only (a CI run drew one more (0, 1) on the
    # unskewed run) — the waits longer than the uncertainty are the same on both.
    unc = float(pd.read_parquet(skewed / "report" / "clock_offsets.parquet")
                .set_index("rank").loc[1, "uncertainty_us"])
    step = int(steps[0])

    def beyond_the_uncertainty(run):
        timeline, ctx = _page(run, step)
        return [a for a in timeline._segments(ctx, step)[1] if a[3] - a[2] > 2 * unc + 50.0]
    skew_arrows, plain_arrows = beyond_the_uncertainty(skewed), beyond_the_uncertainty(runs["run"])
    assert skew_arrows, "no wait longer than the clock's uncertainty"
    assert [(w, c) for w, c, _, _ in skew_arrows] == [(w, c) for w, c, _, _ in plain_arrows]
    assert max(abs(x[3] - y[3]) for x, y in zip(skew_arrows, plain_arrows)) <= unc + 50.0


def test_timeline_colours_wait_apart_and_rank_highlights_its_lane(runs):
    from meshscope.dashboard.pages.common import COLOURS

    step = int(pd.read_parquet(runs["run"] / "report" / "timeline.parquet")["step"].min())
    timeline, ctx = _page(runs["run"], step, rank=1)
    seg, arrows, _ = timeline._segments(ctx, step)
    fig = timeline.timeline_figure(ctx, seg, arrows, step)
    colour = {t.name: t.marker.color for t in fig.data if t.type == "bar"}
    # A pipeline's send/recv that compute does not hide is bubble (the breakdown's sets, which
    # the timeline draws), so the pp waits lie over bubble: their colour is neither the
    # bubble's nor any communication's.
    assert {"bubble", "wait"} <= set(colour)
    assert colour["wait"] == COLOURS["wait"] and colour["bubble"] == COLOURS["bubble"]
    assert colour["wait"] not in {colour["bubble"]} | {
        c for k, c in COLOURS.items() if k.startswith("comm")}
    lanes = list(fig.layout.yaxis.categoryarray)
    shapes = [s for s in fig.layout.shapes if (s.name or "").startswith("highlight")]
    assert len(shapes) == 1
    i = lanes.index(next(x for x in lanes if x.startswith("rank 1")))
    assert (shapes[0].y0, shapes[0].y1) == (i - 0.5, i + 0.5) and shapes[0].layer == "below"
    bold = [t for t in fig.layout.yaxis.ticktext if t.startswith("<b>")]
    assert bold == [f"<b>{lanes[i]}</b>"]
    # Without ?rank= nothing is marked.
    timeline, ctx = _page(runs["run"], step)
    plain = timeline.timeline_figure(ctx, seg, arrows, step)
    assert not [s for s in plain.layout.shapes if (s.name or "").startswith("highlight")]


def test_pp_send_recv_busbw_is_empty_not_the_wait_and_bench_comm_measures_it(runs):
    """gloo's send/recv ranges cannot give a transfer: busbw empty on every pp row, the
    summary's pp rows empty too, never bytes / span. The receive's wait for its sender is wait
    (inside its span, never more). bench-comm, run in this session at the same size, measures
    the busbw the report would have to match; it is printed for the record and must be a
    finite, positive figure (the test fails if the comparison baseline is missing)."""
    bw = pd.read_parquet(runs["run"] / "report" / "bandwidth.parquet")
    pp = bw[(bw["dim"] == "pp") & bw["op"].isin(["send", "recv"])]
    assert len(pp) == 2 * 16           # 4 microbatches × 2 directions × 2 profiled steps × 2 sides
    assert (pp["msg_bytes"] == runs["msg_bytes"]).all()
    assert pp["transfer_us"].isna().all() and pp["busbw_gbps"].isna().all()
    assert ((pp["wait_us"] >= 0) & (pp["wait_us"] <= pp["dur_us"] + 1e-6)).all()
    recv = pp[pp["op"] == "recv"]
    assert (recv["wait_us"] > 0).any()     # a later stage waits for its earlier one
    summary = pd.read_parquet(runs["run"] / "report" / "bandwidth_summary.parquet")
    rows = summary[(summary["dim"] == "pp") & summary["op"].isin(["send", "recv"])]
    assert len(rows) == 2 and rows["busbw_gbps"].isna().all()
    base = pd.read_parquet(runs["bench"] / "baseline.parquet")
    base = base[(base["op"] == "send_recv") & (base["size_bytes"] == runs["msg_bytes"])]
    assert len(base) == 1 and float(base["busbw_gbps"].iloc[0]) > 0
    wait_figure = (pp["msg_bytes"] / pp["dur_us"] / 1e3).median()
    print(f"bench-comm send_recv {runs['msg_bytes']} B: "
          f"{float(base['busbw_gbps'].iloc[0]):.4f} GB/s "
          f"({float(base['time_us'].iloc[0]):.1f} µs); the wait-dominated bytes/span "
          f"figure the report does not show: {wait_figure:.4f} GB/s")


def test_every_table_with_points_in_time_names_its_clock(runs):
    report = runs["skewed"] / "report"
    clocks = json.loads((report / "summary.json").read_text())["table_clocks"]
    points = ("_ts_us", "start_us", "end_us", "arrival_us", "completion_us")
    timed = set()
    for f in report.glob("*.parquet"):
        cols = pd.read_parquet(f).columns
        if any(c.endswith(points) for c in cols):
            timed.add(f.stem)
    assert timed and timed <= set(clocks), sorted(timed - set(clocks))
    assert clocks["instances"] == clocks["collectives"] == "aligned"
    # The instance table really is aligned: rank 1's rows within the run's span, not 10 s on.
    inst = pd.read_parquet(report / "instances.parquet")
    r0, r1 = inst[inst["rank"] == 0], inst[inst["rank"] == 1]
    assert r1["arrival_us"].min() > r0["arrival_us"].min() - 1e6
    assert r1["end_us"].max() < r0["end_us"].max() + 1e6
