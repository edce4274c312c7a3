"""One run, one number per name: the step time, stage imbalance and compute of a sample read
the same in summary.json, the ``analyze`` text, the runs list, the overview, the pipeline page,
``meshscope compare`` and its page, and the static report (issue 23). The samples' committed
reports are real runs (samples/README.md); nothing here is built by hand but the schema-2
summary the reader must still understand."""
from __future__ import annotations

import json
import pathlib

import pytest

from meshscope.layouts import ranked as compare_mod
from meshscope.analysis.report import reader, text
from meshscope.dashboard import state as st
from meshscope.dashboard.app import BUILDERS
from meshscope.dashboard.data import open_report
from meshscope.dashboard.pages import compare as compare_page
from meshscope.dashboard.pages import overview, runs_list
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.static_report import render_html

SAMPLES = pathlib.Path(__file__).resolve().parents[1] / "samples"
SLOW = "dp2-pp2-slow-rank1"


@pytest.fixture(scope="module")
def index():
    return RunIndex(SAMPLES)


def _summary(run_id):
    return json.loads((SAMPLES / run_id / "report" / "summary.json").read_text())


def _items(index, run_id, page):
    ctx = PageContext(open_report(index.get(run_id)), st.ViewState(page=page, runs=(run_id,)))
    return {i.id: i for s in BUILDERS[page](ctx) for i in s.items}


@pytest.mark.parametrize("run_id", sorted(p.name for p in SAMPLES.iterdir()
                                          if (p / "report" / "summary.json").is_file()))
def test_every_sample_names_its_step_times(run_id):
    s = _summary(run_id)
    assert s["schema_version"] >= 3
    # The headline is the step timer's, the figure tokens/s is computed from.
    assert s["step_time_source"] == "timer"
    assert s["step_time_us"] == s["step_time_timer_us"] == s["throughput"]["step_time_us"]
    assert s["step_time_replayed_us"] is not None and s["window_us"] is not None
    longest = max(r["window_us"] for r in s["per_rank_mean"])
    assert longest <= s["window_us"] * 1.0001   # the mean of per-step maxima ≥ max of means


def test_the_slow_rank_sample_shows_one_step_time_everywhere(index):
    s = _summary(SLOW)
    ms = s["step_time_us"] / 1e3
    shown = f"{ms:.2f} ms"
    # CLI text.
    assert f"step time {shown} (step timer)" in text.render(s)
    # Runs list.
    row = runs_list.run_row(index.get(SLOW))
    assert row["step_ms"] == round(ms, 2) and row["step_source"] == "step timer"
    assert row["tokens_per_s"] == round(s["throughput"]["tokens_per_s"])
    # Overview facts.
    facts = dict(_items(index, SLOW, "overview")["run-facts"].items)
    assert facts["step time"] == f"{shown} (step timer)"
    assert facts["tokens/s"] == f"{s['throughput']['tokens_per_s']:,.0f}"
    # meshscope compare, and its page's table.
    c = compare_mod.compare([SAMPLES / SLOW, SAMPLES / "dp4-ddp"])
    mine = next(r for r in c.rows if r.name == SLOW)
    assert mine.step_time_us == pytest.approx(s["step_time_us"])
    assert mine.step_time_source == "timer"
    names, rows = compare_page.comparison_rows(c)
    figures = {label: vals for label, vals, _ in rows}
    assert figures["step time (ms)"][names.index(SLOW)] == pytest.approx(ms)
    assert figures["ranks (world size)"][names.index(SLOW)] == 4
    # The static report.
    assert f"{shown} (step timer)" in render_html(open_report(index.get(SLOW)))


def test_stage_imbalance_is_two_named_measures(index):
    s = _summary(SLOW)
    typed = reader.read_summary(s)
    measured, corrected = typed.stage_imbalance_measured, \
        typed.stage_imbalance_without_straggler
    # measured: the stage_imbalance table's max ratio; corrected: the what-if's.
    tab = open_report(index.get(SLOW)).table("stage_imbalance")
    assert measured.max_over_mean == pytest.approx(float(tab["ratio_to_mean"].max()))
    assert corrected.max_over_mean != pytest.approx(measured.max_over_mean)
    out = text.render(s)
    assert f"measured (compute per microbatch): max/mean {measured.max_over_mean:.3f}" in out
    assert f"peers' pace: max/mean {corrected.max_over_mean:.3f}" in out
    facts = dict(_items(index, SLOW, "pipeline")["imbalance-facts"].items)
    assert any(v.startswith(f"{measured.max_over_mean:.3f}") and "measured" in k
               for k, v in facts.items())
    assert any(v.startswith(f"{corrected.max_over_mean:.3f}") and "straggler" in k
               for k, v in facts.items())


def test_the_breakdown_bar_names_compute_without_overlap(index):
    s = _summary(SLOW)
    ctx = PageContext(open_report(index.get(SLOW)), st.ViewState(page="overview", runs=(SLOW,)))
    fig = overview.breakdown_figure(ctx)
    bar = next(t for t in fig.data if t.name == "compute without overlapped comm")
    r1 = next(r for r in s["per_rank_mean"] if r["rank"] == 1)
    i = list(fig.data[0].customdata).index(1)
    assert bar.y[i] == pytest.approx((r1["compute_us"] - r1["overlapped_comm_us"]) / 1e3,
                                     abs=1e-3)
    assert f"compute (all): {r1['compute_us'] / 1e3:.2f} ms" in bar.hovertext[i]


def test_a_schema_2_summary_reads_under_the_new_names():
    """Schema 2 wrote the replayed makespan as step_time_us beside the timer in
    throughput: the reader puts each under its own name and heads with the timer."""
    old = {"schema_version": 2, "step_time_us": 307829.0,
           "step_time_source": "replayed makespan of the profiled steps",
           "throughput": {"step_time_us": 202836.3, "tokens_per_s": 5048.4},
           "per_rank_mean": [{"rank": 0, "window_us": 275166.0}],
           "stage_imbalance": {"max_over_mean": 1.05, "slowest_stage": 0}}
    t = reader.step_time(old)
    assert (t.us, t.source, t.timer_us, t.replayed_us, t.window_us) == \
        (202836.3, "timer", 202836.3, 307829.0, 275166.0)
    typed = reader.read_summary(old)
    assert typed.stage_imbalance_measured is None
    corrected = typed.stage_imbalance_without_straggler
    assert (corrected.max_over_mean, corrected.slowest_stage) == (1.05, 0)
    plain = {"schema_version": 2, "step_time_us": 1000.0, "step_time_source": "mean step window",
             "throughput": {"step_time_us": None}}
    t = reader.step_time(plain)
    assert (t.us, t.source) == (1000.0, "window")


@pytest.mark.parametrize("run_id", sorted(p.name for p in SAMPLES.iterdir()
                                          if (p / "report" / "summary.json").is_file()))
def test_the_typed_summary_reads_every_sample(run_id):
    s = _summary(run_id)
    typed = reader.read_summary(s)
    assert typed.schema_version == s["schema_version"] and typed.ranks == s["ranks"]
    assert typed.step_time.us == s["step_time_us"]
    assert typed.tokens_per_s == s["throughput"]["tokens_per_s"]
    assert [f.id for f in typed.findings] == [f["id"] for f in s["findings"]]
    assert all(f.cost_us is None or f.cost_us == g["cost_us"]
               for f, g in zip(typed.findings, s["findings"]))


def test_the_typed_summary_reads_a_schema_2_document():
    """Older reports: tokens/s stays beside the timer's step time; a report without timers
    (only the replayed step) shows no tokens/s beside a step time it was not computed from."""
    old = {"schema_version": 2, "step_time_us": 307829.0, "ranks": [0, 1],
           "step_time_source": "replayed makespan of the profiled steps",
           "throughput": {"step_time_us": None, "tokens_per_s": None},
           "findings": [{"id": "straggler", "severity": "high", "dimension": "all",
                         "cost_us": 63140.0, "cost_pct": 20.5, "title": "Rank 1",
                         "evidence": {}, "remedy": ""}]}
    typed = reader.read_summary(old)
    assert (typed.step_time.us, typed.step_time.source) == (307829.0, "replayed")
    assert typed.tokens_per_s is None and [f.id for f in typed.findings] == ["straggler"]


# -- every other quantity of the slow-rank sample: one value in every place ----------------

def _static_figure(html: str, div_id: str) -> list[dict]:
    """The traces of figure ``div_id`` as the static report embeds them (plotly's own
    ``Plotly.newPlot("id", [traces], …)``), decoded from the file's JSON."""
    import re
    m = re.search(r'Plotly\.newPlot\(\s*"%s",\s*' % re.escape(div_id), html)
    assert m, f"no figure {div_id} in the static report"
    data, _ = json.JSONDecoder().raw_decode(html, m.end())
    return data


def _cli_rank_row(out: str, rank: int) -> list[float]:
    """The CLI's per-rank table row of ``rank``: window, compute, comm, overlapped, exposed,
    bubble, idle (ms), overlap %."""
    head = out.index("Per rank, mean over profiled steps (ms):")
    for line in out[head:].splitlines()[2:]:
        cells = line.split()
        if cells and cells[0] == str(rank):
            return [float(c) for c in cells[1:]]
    raise AssertionError(f"rank {rank} not in the CLI table")


@pytest.fixture(scope="module")
def slow(index):
    """The slow-rank sample in every place a reader meets it: summary.json, the CLI text, the
    overview and stragglers pages' items and figures, the static report, compare and its
    page."""
    s = _summary(SLOW)
    report = open_report(index.get(SLOW))
    c = compare_mod.compare([SAMPLES / SLOW, SAMPLES / "dp4-ddp"])
    return {"summary": s, "cli": text.render(s),
            "overview": _items(index, SLOW, "overview"),
            "stragglers": _items(index, SLOW, "stragglers"),
            "static": render_html(report), "compare": c,
            "compare_table": compare_page.comparison_rows(c)}


def _assert_compare_page_shows(slow, row_label: str, bar_name: str, ms: float) -> None:
    """The compare page shows ``ms`` for the slow-rank run in its table's row ``row_label``
    and in its bar ``bar_name`` (to the 0.01 ms the bar is drawn at)."""
    names, rows = slow["compare_table"]
    table = dict((label, vals) for label, vals, _ in rows)
    assert table[row_label][names.index(SLOW)] == pytest.approx(ms)
    bar = next(t for t in compare_page.compare_figure(names, rows).data if t.name == bar_name)
    assert bar.y[names.index(SLOW)] == pytest.approx(ms, abs=0.005)


def test_compute_is_one_number_everywhere(slow):
    """Each rank's compute (all of it) and the bar's compute without the overlapped
    communication: the CLI, summary.json, the overview's figure data (dashboard and static
    report), and compare's mean over ranks (its table and its bars)."""
    s = slow["summary"]
    fig = slow["overview"]["breakdown-graph"].figure
    bar = next(t for t in fig.data if t.name == "compute without overlapped comm")
    static = next(t for t in _static_figure(slow["static"], "breakdown-graph")
                  if t["name"] == "compute without overlapped comm")
    for r in s["per_rank_mean"]:
        i = list(bar.customdata).index(r["rank"])
        assert _cli_rank_row(slow["cli"], r["rank"])[1] == pytest.approx(r["compute_us"] / 1e3,
                                                                       abs=0.005)
        assert f"compute (all): {r['compute_us'] / 1e3:.2f} ms" in bar.hovertext[i]
        assert static["hovertext"][i] == bar.hovertext[i]
        without = (r["compute_us"] - r["overlapped_comm_us"]) / 1e3
        assert bar.y[i] == pytest.approx(without, abs=1e-3) == static["y"][i]
    mean_ms = sum(r["compute_us"] for r in s["per_rank_mean"]) / len(s["per_rank_mean"]) / 1e3
    row = next(r for r in slow["compare"].rows if r.name == SLOW)
    assert row.compute_us / 1e3 == pytest.approx(mean_ms)
    _assert_compare_page_shows(slow, "compute (ms, mean over ranks)", "compute", mean_ms)


def test_exposed_communication_is_one_number_everywhere(slow):
    """Exposed communication per rank (CLI, summary, the overview's stacked segments in the
    dashboard and the static report) and its mean over ranks (compare, its page's table and
    bars)."""
    s = slow["summary"]
    fig = slow["overview"]["breakdown-graph"].figure
    exposed = [t for t in fig.data if t.name.startswith("exposed")]
    static = [t for t in _static_figure(slow["static"], "breakdown-graph")
              if t["name"].startswith("exposed")]
    assert [t.name for t in exposed] == [t["name"] for t in static] and exposed
    ranks = list(fig.data[0].customdata)
    for r in s["per_rank_mean"]:
        i = ranks.index(r["rank"])
        cli = _cli_rank_row(slow["cli"], r["rank"])[4]
        assert cli == pytest.approx(r["exposed_comm_us"] / 1e3, abs=0.005)
        assert sum(t.y[i] for t in exposed) == pytest.approx(r["exposed_comm_us"] / 1e3,
                                                             abs=1e-3)
        assert sum(t["y"][i] for t in static) == pytest.approx(r["exposed_comm_us"] / 1e3,
                                                               abs=1e-3)
    mean_ms = sum(r["exposed_comm_us"] for r in s["per_rank_mean"]) / len(s["per_rank_mean"]) / 1e3
    row = next(r for r in slow["compare"].rows if r.name == SLOW)
    assert row.exposed_total_us / 1e3 == pytest.approx(mean_ms)
    _assert_compare_page_shows(slow, "exposed comm (ms)", "exposed comm", mean_ms)


def test_the_top_findings_cost_is_one_number_everywhere(slow):
    """The top finding (the straggler, rank 1) and its cost: summary.json's cost, the
    straggler's what-if saving, the CLI's finding line, the overview's findings table, the
    stragglers page's saving bar (dashboard and static report) and compare's top finding."""
    s = slow["summary"]
    top = s["findings"][0]
    straggler = s["cross_rank"]["straggler"]
    assert top["id"] == "straggler" and top["cost_us"] == straggler["saving_us"]
    ms, pct = top["cost_us"] / 1e3, top["cost_pct"]
    assert f"1. [{top['severity']}] {top['title']} — costs {ms:.1f} ms/step ({pct:.1f}%)" \
        in slow["cli"]
    table = slow["overview"]["findings-table"]
    first = dict(zip(table.columns, table.rows[0]))
    assert first["cost ms/step"] == f"{ms:.2f}" and first["cost %"] == f"{pct:.1f}"
    static_table = slow["static"].split('id="findings-table"')[1].split("</table>")[0]
    first_row = static_table.split("<tbody>")[1].split("</tr>")[0]
    assert f">{ms:.2f}</td>" in first_row and f">{pct:.1f}</td>" in first_row
    bar = slow["stragglers"]["saving-graph"].figure.data[0]
    i = [x.split()[1] for x in bar.x].index(str(straggler["rank"]))
    assert bar.y[i] == pytest.approx(ms)
    static = _static_figure(slow["static"], "saving-graph")[0]
    assert static["y"][i] == pytest.approx(ms)
    row = next(r for r in slow["compare"].rows if r.name == SLOW)
    assert (row.findings[0].id, row.findings[0].cost_pct) == ("straggler", pct)
    names, rows = slow["compare_table"]
    assert dict((label, vals) for label, vals, _ in rows)["top finding"][names.index(SLOW)] \
        == top["title"]


def test_stage_imbalance_reads_the_same_in_the_static_report(slow):
    typed = reader.read_summary(slow["summary"])
    measured, corrected = typed.stage_imbalance_measured, \
        typed.stage_imbalance_without_straggler
    html = slow["static"]
    assert f"{measured.max_over_mean:.3f} (stage {measured.slowest_stage})" in html
    assert f"{corrected.max_over_mean:.3f} (stage {corrected.slowest_stage})" in html


def one_base_everywhere(summary: dict, report, cli_text: str) -> None:
    """Issue 35, item 3: every cost % is of the one headline step time, and reads the same in
    summary.json, the CLI text, the overview's findings table and the straggler's line; the
    Communication page's overlap is per_rank_mean's (a report's ``RunReport`` built on the
    server: ``report``)."""
    head = summary["step_time_us"]
    assert summary["step_time_source"] in ("timer", "window", "replayed")
    if summary["step_time_source"] != "timer":        # measured before modelled
        assert summary["step_time_source"] == "window" or summary["window_us"] is None
    ctx = PageContext(report, st.ViewState(page="overview", runs=(report.run_id,)))
    items = {i.id: i for s in BUILDERS["overview"](ctx) for i in s.items}
    table = items.get("findings-table")
    rows = [dict(zip(table.columns, r)) for r in table.rows] if table is not None else []
    timed = [f for f in summary["findings"] if f.get("cost_us") is not None]
    for f, row in zip(summary["findings"], rows):
        if f.get("cost_us") is None:
            continue
        assert f["cost_pct"] == pytest.approx(100 * f["cost_us"] / head, rel=1e-9), f["id"]
        assert row["cost %"] == f"{f['cost_pct']:.1f}"
        assert f"({f['cost_pct']:.1f}%)" in cli_text
    assert len(rows) >= min(len(summary["findings"]), len(timed))
    st_ = summary["cross_rank"].get("straggler")
    if st_ and st_.get("saving_us") is not None:
        pct = 100 * st_["saving_us"] / head
        assert f"({pct:.0f}% of the {head / 1e3:.2f} ms step)" in cli_text
        from meshscope.dashboard.pages.common import straggler_text
        assert f"({pct:.1f}% of the {head / 1e3:.2f} ms step)" in straggler_text(report)
        gate = st_.get("gate_us")
        if gate is not None:
            assert f"gate of {gate / 1e3:.2f} ms" in cli_text
    comm = {i.id: i for s in BUILDERS["communication"](PageContext(
        report, st.ViewState(page="communication", runs=(report.run_id,)))) for i in s.items}
    if "overlap-table" in comm:
        for row, m in zip(comm["overlap-table"].rows, summary["per_rank_mean"]):
            want = "—" if m.get("overlap_pct") is None else f"{m['overlap_pct']:.1f}%"
            assert row[3] == want


@pytest.mark.parametrize("run_id", sorted(p.name for p in SAMPLES.iterdir()
                                          if (p / "report" / "summary.json").is_file()))
def test_one_base_for_every_number_of_every_sample(index, run_id):
    s = _summary(run_id)
    one_base_everywhere(s, open_report(index.get(run_id)), text.render(s))
