"""Readable evidence and pages (issue 23, item 5), on the samples' real reports: evidence as
labelled sentences with units, nothing cut mid-word, savings on a diverging scale centred on
zero and red only with a straggler, colour bars on the rank × rank matrices, profiled steps
named on the heatmap, ``?rank=`` marking its lane on the timeline, ties left unmarked."""
from __future__ import annotations

import json
import pathlib

from meshscope.dashboard import sections as S
from meshscope.dashboard import state as st
from meshscope.dashboard.data import open_report
from meshscope.dashboard.pages import communication, compare, overview, stragglers, timeline
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex

SAMPLES = pathlib.Path(__file__).resolve().parents[1] / "samples"
SLOW = "dp2-pp2-slow-rank1"
HEALTHY = "dp4-ddp"


def _ctx(run_id, page, **state):
    return PageContext(open_report(RunIndex(SAMPLES).get(run_id)),
                       st.ViewState(page=page, runs=(run_id,), **state))


def _summary(run_id):
    return json.loads((SAMPLES / run_id / "report" / "summary.json").read_text())


def test_evidence_reads_as_labelled_sentences_with_units():
    finding = next(f for f in _summary(SLOW)["findings"] if f["id"] == "straggler")
    text = S.evidence_text(finding["evidence"])
    ev = finding["evidence"]
    key = next(k for k, v in ev.items() if k.endswith("_us") and isinstance(v, (int, float)))
    label = key[:-3].replace("_", " ").capitalize()
    assert f"{label}: {ev[key] / 1e3:,.2f} ms." in text
    assert "=" not in text and "e+0" not in text     # no raw key=value dump, no 6.3e+04


def test_nothing_is_cut_mid_word():
    title = "Exposed pp communication: finishing it as soon as its last rank arrives per step"
    cut = S.clip(title, 60)
    assert cut.endswith("…") and len(cut) <= 60
    assert title.startswith(cut[:-1]) and title[len(cut) - 1] == " "
    assert S.clip("short", 60) == "short"


def test_savings_diverge_around_zero_and_red_needs_a_straggler():
    fig = overview.mesh_figure(_ctx(SLOW, "overview", color="saving"))
    hm = fig.data[0]
    assert hm.zmid == 0 and hm.zmin == -hm.zmax
    assert _summary(SLOW)["cross_rank"]["straggler"] is not None
    assert hm.colorscale[-1][1] != "#7f7f7f"           # the red end: a straggler is named
    healthy = overview.mesh_figure(_ctx(HEALTHY, "overview", color="saving")).data[0]
    assert _summary(HEALTHY)["cross_rank"]["straggler"] is None
    assert healthy.zmid == 0 and healthy.colorscale[-1][1] == "#7f7f7f"   # no alarm colour


def test_rank_matrices_have_colour_bars():
    fig = communication.matrix_figure(communication._per_rank_ops(_ctx(SLOW, "communication")))
    assert all(t.showscale is not False for t in fig.data)
    assert {t.colorbar.title.text for t in fig.data} == {"MB", "ms"}


def test_the_heatmap_names_profiled_and_warm_up_steps():
    fig = stragglers.heatmap_figure(_ctx(SLOW, "stragglers"))
    labels = list(fig.data[0].x)
    for s in _summary(SLOW)["steps"]:
        assert any(lab.split(" ")[0] == str(s) and "(profiled)" in lab for lab in labels)
    assert any("(warm-up)" in lab for lab in labels)
    # ... and outlined: each profiled column in solid black, the warm-up ones dotted.
    solid = [sh for sh in fig.layout.shapes if sh.line.dash == "solid"]
    dotted = [sh for sh in fig.layout.shapes if sh.line.dash == "dot"]
    centre = [labels[round((sh.x0 + sh.x1) / 2)] for sh in solid]
    assert sorted(int(c.split()[0]) for c in centre) == sorted(_summary(SLOW)["steps"])
    assert [labels[round((sh.x0 + sh.x1) / 2)] for sh in dotted] == \
        [lab for lab in labels if "(warm-up)" in lab]


def test_rank_in_the_url_marks_its_lane_on_the_timeline():
    ctx = _ctx(SLOW, "timeline", rank=1, step=4)
    seg, arrows, _ = timeline._segments(ctx, 4)
    fig = timeline.timeline_figure(ctx, seg, arrows, 4)
    order = list(fig.layout.yaxis.categoryarray)
    marked = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(marked) == 1
    i = (marked[0].y0 + marked[0].y1) / 2
    assert order[int(i)].startswith("rank 1")


def test_compare_leaves_ties_unmarked():
    """Equal values and values within 0.5% (914.78 vs 915.01 ms) are ties: not marked."""
    table = compare._table(["a", "b", "c"], [("tie", [1.0, 1.0, 1.0], "low"),
                                              ("one worse", [1.0, 2.0, 2.0], "low"),
                                              ("world", [4, 2, 4], "info"),
                                              ("near tie", [914.78, 915.01, 914.9], "low"),
                                              ("higher is better", [10.0, 9.0, 10.02], "high")])
    assert table.highlight == frozenset({(1, 2), (1, 3), (4, 2)})


def test_the_static_report_carries_every_profiled_step_and_no_server_instruction():
    from meshscope.dashboard.static_report import render_html
    html = render_html(open_report(RunIndex(SAMPLES).get(SLOW)))
    steps = _summary(SLOW)["steps"]
    assert len(steps) >= 2
    for s in steps:
        assert f"Schedule of step {s}" in html and f"Step {s}" in html
    for s in steps[1:]:
        assert 'id="gantt-graph-step%d"' % s in html and 'id="timeline-graph-step%d"' % s in html
    import re
    text = re.sub(r"<script.*?</script>", "", html, flags=re.S)   # plotly's own code aside
    assert "Click" not in text and "click" not in text and "?rank=" not in text


def test_nested_evidence_rows_read_with_units():
    text = S.evidence_text({"per_stage": [{"stage": 0, "bubble_fraction": 0.3836},
                                          {"stage": 1, "bubble_fraction": 0.6652}]})
    assert text == "Per stage: stage 0, bubble 38.4%; stage 1, bubble 66.5%."


def test_the_stragglers_page_states_its_evidence_with_units():
    items = {i.id: i for s in stragglers.sections(_ctx(SLOW, "stragglers")) for i in s.items}
    text = items["straggler-evidence"].text
    st_ = _summary(SLOW)["cross_rank"]["straggler"]
    assert f"Saving: {st_['saving_us'] / 1e3:,.2f} ms ({st_['saving_pct']:.1f}%)." in text
    assert text.count("Saving") == 1 and "e+0" not in text
    assert f"Critical path share: {100 * st_['critical_path_share']:.1f}%." in text


def test_unknown_transfers_show_a_dash_not_nan():
    table = communication.costly_table(communication._per_rank_ops(_ctx(SLOW, "communication")))
    cells = [c for row in table.rows for c in row]
    assert not any("nan" in str(c) for c in cells) and "—" in cells


def test_the_interleaved_gantt_names_the_stages_the_bubble_table_counts():
    from meshscope.dashboard.pages import pipeline
    ctx = _ctx("tp2-pp2-interleaved", "pipeline")
    step = _summary("tp2-pp2-interleaved")["steps"][0]
    fig = pipeline.gantt_figure(ctx, step)
    lanes = list(fig.layout.yaxis.categoryarray)
    stages = {s["stage"] for s in _summary("tp2-pp2-interleaved")["pipeline_stages"]}
    assert {int(lane.split()[1]) for lane in lanes} == stages == {0, 1}
    assert len(lanes) == len(set(lanes)) == len(_summary("tp2-pp2-interleaved")["ranks"])
    assert all("virtual" in lane for lane in lanes)


def test_saving_bars_are_centred_on_zero_and_red_only_for_the_straggler():
    """The stragglers page's savings: a negative saving is a blue bar below zero (never
    alarm red), the named straggler's bar is red, the others grey; the axis is symmetric
    about zero."""
    from meshscope.dashboard.pages.common import COLOURS
    fig = stragglers.saving_figure(_ctx(SLOW, "stragglers"))
    bar = fig.data[0]
    named = _summary(SLOW)["cross_rank"]["straggler"]["rank"]
    for x, y, colour in zip(bar.x, bar.y, bar.marker.color):
        rank = int(x.split()[1])
        if y < 0:
            assert colour == COLOURS["saving negative"]
        elif rank == named:
            assert colour == COLOURS["saving straggler"]
        else:
            assert colour == COLOURS["saving"]
    assert any(y < 0 for y in bar.y)            # the sample has negative savings to show
    lo, hi = fig.layout.yaxis.range
    assert lo == -hi
    healthy = stragglers.saving_figure(_ctx(HEALTHY, "stragglers")).data[0]
    assert COLOURS["saving straggler"] not in healthy.marker.color


def test_waiting_has_one_colour_distinct_from_every_communication_colour():
    from meshscope.dashboard.pages.common import COLOURS
    comm = {v for k, v in COLOURS.items() if k.startswith(("comm", "exposed", "transfer"))}
    assert COLOURS["wait"] not in comm
    fig = communication.transfer_wait_figure(
        communication._per_rank_ops(_ctx(SLOW, "communication")))
    colours = {t.name: t.marker.color for t in fig.data}
    assert colours == {"transfer": COLOURS["transfer"], "wait": COLOURS["wait"]}
    waits = stragglers.waits_figure(_ctx(SLOW, "stragglers"))
    assert {t.name: t.marker.color for t in waits.data}["waited"] == COLOURS["wait"]
