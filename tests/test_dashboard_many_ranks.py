"""Pages of many ranks (issue 51 item 3) on a hand-made 64-rank report whose answers are known
by construction: the slow-rank sample's report with its first rank's rows copied to ranks
0-63, rank r's step window (and waits) growing with r. Above ``common.MANY_RANKS`` ranks the
overview draws the ``TOP_K`` ranks with the longest step — the last 16 — beside the
distribution of every rank's step (64 ranks in its bins), the focused rank added when it is
not among them; the mesh folds its 64 columns into rows of 32, every rank in a cell; the
Timeline draws a lane for the 16 ranks that waited longest and the focused one. The sample's
own 4 ranks — a healthy input — keep one bar and one lane per rank and no distribution.

(The pages of real 64- and 1,024-rank synthetic jobs drawn in Chromium are timed by
``bench/dashboard_latency.py --browser``; analysing such a job here would cost more than this
file's time budget.)"""
from __future__ import annotations

import copy
import json
import pathlib

import pandas as pd
import pytest

from meshscope.dashboard.data import RunReport, open_report
from meshscope.dashboard.pages import overview, timeline
from meshscope.dashboard.pages.common import MANY_RANKS, PageContext, TOP_K
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.state import ViewState
from meshscope.dashboard import sections as S

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SLOW = "dp2-pp2-slow-rank1"
RANKS = 64


@pytest.fixture(scope="module")
def sample() -> RunReport:
    return open_report(RunIndex(SAMPLES).get(SLOW))


def _copies(df: pd.DataFrame, ranks: int, shift_us: dict[str, float] | None = None
            ) -> pd.DataFrame:
    """Rank 0's rows of ``df`` copied to ranks 0…ranks-1, each column of ``shift_us`` grown by
    that many µs per rank."""
    base = df[df["rank"] == 0]
    out = []
    for r in range(ranks):
        part = base.assign(rank=r)
        for col, per in (shift_us or {}).items():
            part = part.assign(**{col: part[col] + per * r})
        out.append(part)
    return pd.concat(out, ignore_index=True)


@pytest.fixture(scope="module")
def many(sample) -> RunReport:
    assert RANKS > MANY_RANKS > TOP_K
    summary = copy.deepcopy(sample.summary)
    first = summary["per_rank_mean"][0]
    summary["ranks"] = list(range(RANKS))
    summary["per_rank_mean"] = [dict(first, rank=r, window_us=first["window_us"] + 10.0 * r)
                                for r in range(RANKS)]
    tables = dict(sample.tables)
    tl = sample.table("timeline")
    waits = tl[(tl["rank"] == 0) & (tl["kind"] == "wait")]
    assert len(waits)       # the sample's rank 0 waits: each copy's waits grow with its rank
    tables["timeline"] = _copies(tl, RANKS, {"end_us": 0.0})
    grown = tables["timeline"]
    is_wait = grown["kind"] == "wait"
    grown.loc[is_wait, "end_us"] = grown.loc[is_wait, "end_us"] + grown.loc[is_wait, "rank"]
    tables["breakdown"] = _copies(sample.table("breakdown"), RANKS, {"window_us": 10.0})
    tables["clock_offsets"] = _copies(sample.table("clock_offsets"), RANKS)
    return RunReport(entry=sample.entry, summary=json.loads(json.dumps(summary)),
                     tables=tables, written=sample.written, run_info=None, mtime_ns=1)


def _ctx(report: RunReport, page: str, rank: int | None = None) -> PageContext:
    return PageContext(report, ViewState(page=page, runs=(SLOW,), rank=rank))


def _ranks_of(fig) -> set[int]:
    return {int(r) for t in fig.data if t.customdata is not None for r in t.customdata}


def test_the_overview_of_many_ranks_draws_the_top_ranks_and_the_distribution(many):
    bars = overview.breakdown_figure(_ctx(many, "overview"))
    assert _ranks_of(bars) == set(range(RANKS - TOP_K, RANKS))    # the 16 longest steps
    assert f"the {TOP_K} ranks with the longest step, of {RANKS}" in bars.layout.title.text
    spread = overview.step_distribution(_ctx(many, "overview"))
    assert sum(spread.data[0].y) == RANKS
    # the focused rank is drawn beside them
    focused = overview.breakdown_figure(_ctx(many, "overview", rank=3))
    assert _ranks_of(focused) == set(range(RANKS - TOP_K, RANKS)) | {3}
    assert "and rank 3" in focused.layout.title.text


def test_the_mesh_of_many_ranks_is_folded_into_rows_with_every_rank(many):
    fig = overview.mesh_figure(_ctx(many, "overview"))
    heat = fig.data[0]
    assert len(heat.z) == RANKS // overview.MESH_WIDTH and \
        all(len(row) == overview.MESH_WIDTH for row in heat.z)
    assert sorted(r for row in heat.customdata for r in row) == list(range(RANKS))
    assert heat.customdata[1][0] == overview.MESH_WIDTH       # the second row starts at 32


def test_the_timeline_of_many_ranks_draws_the_ranks_that_waited_longest(many):
    seg, arrows, _ = timeline._segments(_ctx(many, "timeline"), many.steps[0])
    fig = timeline.timeline_figure(_ctx(many, "timeline"), seg, arrows, many.steps[0])
    lanes = [int(x.split()[1]) for x in fig.layout.yaxis.categoryarray]
    assert sorted(lanes) == list(range(RANKS - TOP_K, RANKS))
    assert f"{TOP_K} of its {RANKS} ranks" in fig.layout.title.text
    fig = timeline.timeline_figure(_ctx(many, "timeline", rank=5), seg, arrows,
                                   many.steps[0])
    assert 5 in [int(x.split()[1]) for x in fig.layout.yaxis.categoryarray]


def test_a_few_ranks_keep_one_bar_and_lane_per_rank(sample):
    assert len(sample.ranks) <= MANY_RANKS
    assert _ranks_of(overview.breakdown_figure(_ctx(sample, "overview"))) == set(sample.ranks)
    assert overview.step_distribution(_ctx(sample, "overview")) is None
    ids = [i.id for s in overview.sections(_ctx(sample, "overview")) for i in s.items
           if isinstance(i, S.Figure)]
    assert "step-distribution" not in ids
    seg, arrows, _ = timeline._segments(_ctx(sample, "timeline"), sample.steps[0])
    fig = timeline.timeline_figure(_ctx(sample, "timeline"), seg, arrows, sample.steps[0])
    assert len(fig.layout.yaxis.categoryarray) == len(sample.ranks)


def _rank_picker(report: RunReport, page: str):
    from meshscope.dashboard.app import _pickers

    found = []

    def walk(node):
        if getattr(node, "id", None) == "rank-select":
            found.append(node)
        children = getattr(node, "children", None)
        for child in children if isinstance(children, list) else [children]:
            if child is not None and not isinstance(child, str):
                walk(child)
    for node in _pickers(_ctx(report, page)):
        walk(node)
    return found[0] if found else None


def test_a_rank_picker_reaches_every_rank_of_many(many, sample):
    from meshscope.dashboard.app import MAX_RANK_OPTIONS, rank_options

    assert RANKS > MAX_RANK_OPTIONS
    for page in ("overview", "stragglers", "communication", "timeline", "pipeline"):
        picker = _rank_picker(many, page)
        assert picker is not None, page
        # the first ranks listed (the browser indexes every option it is given), …
        assert [o["value"] for o in picker.options] == list(range(MAX_RANK_OPTIONS))
    # … every other rank one search away (the picker's text searched on the server), and
    # the focused rank listed whatever is typed
    for r in range(RANKS):
        assert r in [o["value"] for o in rank_options(many, None, f"rank {r}")]
    assert [o["value"] for o in rank_options(many, 60, "rank 1")][0] == 60
    assert {o["value"] for o in rank_options(many, None, "rank 6")} == {6, 60, 61, 62, 63}
    # a few ranks: every rank is drawn already, the overview needs no picker
    assert _rank_picker(sample, "overview") is None

