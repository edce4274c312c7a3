"""The dashboard's pages, built on the server from the shipped samples' reports (no browser):
each page's figures and tables hold that run's numbers from summary.json and its report tables,
arranged as run.json says (mesh coordinates, process groups); a report lacking a table gives a
note instead of an error; the static HTML report carries the same numbers and loads nothing
from the network."""
from __future__ import annotations

import html
import json
import pathlib
import shutil

import pandas as pd
import pytest

from meshscope.dashboard import sections as S
from meshscope.dashboard import state as st
from meshscope.dashboard.app import BUILDERS
from meshscope.dashboard.data import open_report
from meshscope.dashboard.pages import compare, overview
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.static_report import render_html

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
PIPELINED = "dp2-pp2-1f1b"
SLOW = "dp2-pp2-slow-rank1"


@pytest.fixture(scope="module")
def index():
    return RunIndex(SAMPLES)


def _summary(run_id):
    return json.loads((SAMPLES / run_id / "report" / "summary.json").read_text())


def _run_json(run_id):
    return json.loads((SAMPLES / run_id / "run.json").read_text())


def _items(index, run_id, page, **state):
    """id -> item of the page's sections."""
    ctx = PageContext(open_report(index.get(run_id)),
                      st.ViewState(page=page, runs=(run_id,), **state))
    return {i.id: i for s in BUILDERS[page](ctx) for i in s.items}


def test_samples_are_all_listed(index):
    expected = sorted(p.name for p in SAMPLES.iterdir() if (p / "run.json").is_file())
    assert sorted(index.runs) == expected
    assert all(index.get(r).analysed for r in expected)


@pytest.mark.parametrize("run_id", sorted(p.name for p in SAMPLES.iterdir()
                                          if (p / "report" / "summary.json").is_file()))
def test_every_page_builds_for_every_sample(index, run_id):
    for page in BUILDERS:
        items = _items(index, run_id, page)
        assert items, page
        S.to_dash([S.Section(None, list(items.values()))])  # renders without error


def test_overview_facts_and_findings_are_the_reports(index):
    summary = _summary(SLOW)
    items = _items(index, SLOW, "overview")
    facts = dict(items["run-facts"].items)
    assert facts["layout"] == summary["run"]["layout_str"]
    assert facts["world size"] == summary["run"]["world_size"]
    table = items["findings-table"]
    assert len(table.rows) == len(summary["findings"])
    assert [r[2] for r in table.rows] == [f["title"] for f in summary["findings"]]
    costs = [f["cost_us"] for f in summary["findings"]]
    assert [r[4] for r in table.rows] == ["—" if c is None else f"{c / 1e3:.2f}" for c in costs]
    rank = summary["cross_rank"]["straggler"]["rank"]
    assert items["straggler"].text.startswith(f"Straggler: rank {rank} ")


def test_breakdown_bars_stack_to_each_ranks_window(index):
    summary = _summary(PIPELINED)
    fig = _items(index, PIPELINED, "overview")["breakdown-graph"].figure
    window = {m["rank"]: m["window_us"] / 1e3 for m in summary["per_rank_mean"]}
    assert len(fig.data[0].x) == len(summary["ranks"])
    for i, r in enumerate(summary["ranks"]):
        assert sum(t.y[i] for t in fig.data) == pytest.approx(window[r], rel=1e-4)
    assert {"compute without overlapped comm", "overlapped comm", "bubble", "idle"} <= \
        {t.name for t in fig.data}


def test_mesh_puts_each_rank_at_its_coordinates(index):
    coords = _run_json(SLOW)["mesh"]["coordinates"]
    fig = _items(index, SLOW, "overview", color="bubble")["mesh-graph"].figure
    heat = fig.data[0]
    assert list(heat.y) == ["stage 0", "stage 1"] and list(heat.x) == ["dp0", "dp1"]
    bubble = {m["rank"]: m["bubble_us"] / 1e3 for m in _summary(SLOW)["per_rank_mean"]}
    for rank, c in coords.items():
        assert heat.text[c["pp"]][c["dp"]].startswith(f"rank {rank}<br>")
        assert heat.z[c["pp"]][c["dp"]] == pytest.approx(bubble[int(rank)])


def test_pipeline_page_has_each_stage_and_every_microbatch(index):
    summary = _summary(PIPELINED)
    step = summary["steps"][-1]
    items = _items(index, PIPELINED, "pipeline", step=step)
    rows = items["bubble-table"].rows
    assert [r[0] for r in rows] == [s["stage"] for s in summary["pipeline_stages"]]
    for row, s in zip(rows, summary["pipeline_stages"]):
        assert row[2] == f"{100 * s['bubble_fraction']:.1f} %"
        assert row[4] == f"{100 * s['theory_fraction']:.1f} %"
    mb = pd.read_parquet(SAMPLES / PIPELINED / "report" / "microbatches.parquet")
    gantt = items["gantt-graph"].figure
    assert gantt.layout.title.text == f"Microbatch schedule of step {step}"
    bars = [t for t in gantt.data if t.type == "bar"]
    assert sum(len(t.x) for t in bars) == int((mb["step"] == step).sum())
    assert {t.name for t in bars} == set(mb["phase"])


def test_no_pipeline_says_so(index):
    items = _items(index, "dp4-ddp", "pipeline")
    assert list(items) == ["pipeline-none"]


def test_rank_matrix_follows_the_process_groups(index):
    groups = [set(g["ranks"]) for g in _run_json(PIPELINED)["process_groups"]]
    fig = _items(index, PIPELINED, "communication")["rank-matrix-graph"].figure
    nbytes = fig.data[0]
    labels = list(nbytes.x)
    for i, a in enumerate(labels):
        for j, b in enumerate(labels):
            ra, rb = int(a.split()[1]), int(b.split()[1])
            shared = any({ra, rb} <= g for g in groups) and ra != rb
            value = nbytes.z[i][j]
            assert (value is not None and value == value and value > 0) == shared, (a, b)


def test_busbw_points_are_the_bandwidth_summary(index):
    bw = pd.read_parquet(SAMPLES / PIPELINED / "report" / "bandwidth_summary.parquet")
    item = _items(index, PIPELINED, "communication")["busbw-graph"]
    fig = item.figure
    # every size bucket of an (op, dim) with a busbw; the others named in the caption
    known = bw.groupby(["dim", "op"])["busbw_gbps"].transform(lambda s: s.notna().any())
    assert sum(len(t.x) for t in fig.data) == int(known.sum())
    for (d, op), g in bw[~known].groupby(["dim", "op"]):
        assert f"{op} ({d})" in item.caption
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_step_heatmap_has_every_timed_step(index):
    hm = pd.read_parquet(SAMPLES / SLOW / "report" / "step_heatmap.parquet")
    fig = _items(index, SLOW, "stragglers")["heatmap-graph"].figure
    assert len(fig.data[0].y) == hm["rank"].nunique()
    assert len(fig.data[0].x) == hm["step"].nunique()


def test_step_heatmap_of_a_long_run_shows_runs_of_steps(tmp_path):
    """The slow-rank sample's timers as if the run had gone on for 5,000 steps: the figure
    keeps at most 200 columns; its warm-up step and profiled steps stay one a column, the
    others are in runs, and rank 1's 40 ms step 4,321 shows in its run's cell."""
    run = tmp_path / "long"
    shutil.copytree(SAMPLES / SLOW, run, ignore=shutil.ignore_patterns("traces", ".cache"))
    path = run / "report" / "step_heatmap.parquet"
    hm = pd.read_parquet(path)
    last = int(hm["step"].max())
    more = [{"rank": r, "step": s, "wall_time_us": 40_000.0 if (r, s) == (1, 4321) else 20_000.0,
             "warmup": False, "profiled": False, "slow": False}
            for s in range(last + 1, 5000) for r in sorted(hm["rank"].unique())]
    pd.concat([hm, pd.DataFrame(more).astype(hm.dtypes.to_dict())]).to_parquet(path,
                                                                               index=False)
    fig = _items(RunIndex(tmp_path), "long", "stragglers")["heatmap-graph"].figure
    x = list(fig.data[0].x)
    assert len(x) <= 200 and len(fig.data[0].y) == hm["rank"].nunique()
    alone = {int(label.split(" ")[0]) for label in x if "–" not in label}
    assert alone == set(hm.loc[hm["warmup"] | hm["profiled"], "step"]) == {0, 4, 5}
    assert x[0] == "0 (warm-up)"
    (cell,) = [i for i, label in enumerate(x) if "–" in label and
               int(label.split("–")[0]) <= 4321 <= int(label.split("–")[1])]
    ranks = [int(label.split()[1]) for label in fig.data[0].y]      # "rank 1 (pp0·dp1)"
    z = fig.data[0].z
    assert [z[i][cell] for i in range(len(ranks))] == [40.0 if r == 1 else 20.0 for r in ranks]
    assert "a run of steps per column" in fig.layout.title.text


def test_health_of_a_healthy_run_says_so(index):
    assert _summary("dp4-ddp")["hangs"] == []
    assert "fr-healthy" in _items(index, "dp4-ddp", "health")


def test_health_lists_the_flight_recorder_verdicts(tmp_path):
    """A report whose Flight Recorder table names a hang (rank 3 never reached seq 7 of the dp
    group) and a run.json problem: both are on the page, as the analysis wrote them."""
    run = tmp_path / "hung"
    shutil.copytree(SAMPLES / PIPELINED, run, ignore=shutil.ignore_patterns("traces"))
    detail = "rank 3 last finished step 4; its last operation: all_reduce seq 6"
    pd.DataFrame([{"process_group": "3", "group_desc": "mesh_dp", "seq": 7,
                   "kind": "collective", "op": "all_reduce", "verdict": "missing",
                   "ranks_present": [2], "ranks_missing": [3],
                   "last_seq_of_missing": "{3: 6}", "detail": detail}]).to_parquet(
        run / "report" / "flight_recorder.parquet", index=False)
    summary = json.loads((run / "report" / "summary.json").read_text())
    summary["problems"] = ["comms/rank1.json: $.entries[4].state: expected a string, got 7"]
    (run / "report" / "summary.json").write_text(json.dumps(summary))
    items = _items(RunIndex(tmp_path), "hung", "health")
    assert items["fr-summary"].text == "Flight Recorder: 1 problem(s): 1 missing."
    (row,) = items["fr-table"].rows
    assert row[:7] == ["3", "mesh_dp", "7", "all_reduce", "missing", "2", "3"]
    assert row[7] == detail
    assert items["problems-table"].rows == [[summary["problems"][0]]]


@pytest.fixture
def stripped(tmp_path):
    """A copy of the pipelined sample's report with most tables removed (an old or partial
    report)."""
    run = tmp_path / "partial"
    shutil.copytree(SAMPLES / PIPELINED, run, ignore=shutil.ignore_patterns("traces", ".cache"))
    for name in ("clock_offsets", "collectives", "step_heatmap", "bandwidth",
                 "bandwidth_summary", "microbatches", "stage_imbalance", "rank_waits"):
        (run / "report" / f"{name}.parquet").unlink(missing_ok=True)
    return tmp_path


def test_absent_tables_give_notes_not_errors(stripped):
    index = RunIndex(stripped)
    notes = {}
    for page in ("pipeline", "communication", "stragglers"):
        notes.update({k: v for k, v in _items(index, "partial", page).items()
                      if isinstance(v, S.Note)})
    for key in ("gantt-none", "busbw-none", "ops-none", "heatmap-none", "clock-none"):
        assert "re-run `meshscope analyze partial`" in notes[key].text, key


def _walk(component) -> tuple[set, str]:
    """The ids and the text of a Dash component tree."""
    if isinstance(component, (list, tuple)):
        parts = [_walk(c) for c in component]
        return set().union(*(p[0] for p in parts)) if parts else set(), \
            " ".join(p[1] for p in parts)
    if isinstance(component, (str, int, float)):
        return set(), str(component)
    ids = {component.id} if getattr(component, "id", None) else set()
    inner = _walk(getattr(component, "children", None) or [])
    return ids | inner[0], inner[1]


def test_compare_two_runs_side_by_side(index):
    state = st.ViewState(page="compare", runs=("dp4-ddp", PIPELINED))
    body = compare.render(index, state)
    ids, text = _walk(body)
    title = body[0].children[1].children
    assert title.split(" → ") == list(state.runs)          # before → after
    assert {"compare-table", "compare-graph", "compare-winner", "compare-waterfall",
            "compare-parts", "compare-steps", "compare-sentence-0"} <= ids
    from meshscope.layouts.ranked import compare as analysis_compare
    # the page says what the analysis' comparison says
    fastest = analysis_compare([SAMPLES / r for r in state.runs]).winner.name
    assert f"Fastest: {fastest}" in text


def test_the_pair_view_is_the_analysis_diff(index):
    """Two runs: the waterfall goes from the first run's window to the second's by the diff's
    own parts; the sentences, parts and findings are ``analysis.compare.diff``'s."""
    from meshscope.analysis.compare import diff, open_side

    d = diff(open_side(SAMPLES / PIPELINED / "report", name=PIPELINED),
             open_side(SAMPLES / SLOW / "report", name=SLOW))
    items = {i.id: i for sec in compare.pair_sections(d) for i in sec.items}
    fall = items["compare-waterfall"].figure.data[0]
    assert fall.x[0] == PIPELINED and fall.x[-1] == SLOW
    assert fall.y[0] == pytest.approx(d.window.before / 1e3)
    assert sum(fall.y[1:-1]) == pytest.approx(d.window.delta / 1e3)
    assert [items[f"compare-sentence-{i}"].text for i in range(len(d.sentences))] == \
        d.sentences
    findings = items["compare-findings"].rows
    assert [r[0] for r in findings if r[0] == "new"] == ["new"]
    heat = items["compare-ranks"].figure.data[0]
    assert list(heat.y) == [f"rank {r}" for r in range(4)]
    # the CPU runs have no kernels: their operators whose launches changed, if any
    assert "compare-kernels" not in items


def test_compare_with_one_run_asks_for_two(index):
    """... and says which name of the URL it left out (issue 46: it was dropped silently)."""
    body = compare.render(index, st.ViewState(page="compare", runs=("dp4-ddp", "nope")))
    assert body[1].id == "compare-unknown"
    assert body[1].children == "Left out — not a run of this folder: nope."
    assert body[2].id == "run-message"
    assert "two or more" in body[2].children


def test_static_html_holds_the_same_numbers_and_loads_nothing(index):
    entry = index.get(SLOW)
    text = render_html(open_report(entry))
    summary = _summary(SLOW)
    for s in summary["pipeline_stages"]:
        assert f"{100 * s['bubble_fraction']:.1f} %" in text
    for f in summary["findings"]:
        assert html.escape(f["title"]) in text
    assert "<script src" not in text and "<link" not in text
    assert text.count('id="breakdown-graph"') == 1


@pytest.mark.parametrize("search,expected", [
    ("?run=a&step=5&rank=2&color=bubble", st.ViewState("overview", ("a",), None, 2, 5,
                                                      "bubble")),
    ("?run=a&run=b", st.ViewState("overview", ("a", "b"))),
    ("?run=a&step=five&rank=99999999999999", st.ViewState("overview", ("a",))),
    ("?step=-1&rank=%00", st.ViewState("overview", (), step=-1)),
    ("", st.ViewState("overview")),
])
def test_url_state_round_trips_and_drops_garbage(search, expected):
    state = st.parse("/overview", search)
    assert state == expected
    assert st.parse("/overview", state.query()) == state


def test_unknown_page_path_is_the_runs_list():
    assert st.parse("/etc/passwd", "?run=a").page == "runs"
    assert st.ViewState(page="pipeline", runs=("a b/c",), step=4).href() == \
        "/pipeline?run=a+b%2Fc&step=4"


def test_mesh_colour_defaults_to_what_the_report_has(index):
    ctx = PageContext(open_report(index.get(SLOW)), st.ViewState(page="overview",
                                                                 runs=(SLOW,)))
    key = overview.color_key(ctx)
    has_savings = bool(_summary(SLOW)["cross_rank"].get("rank_savings"))
    assert key == ("saving" if has_savings else "wait")


def test_timeline_draws_the_reports_own_segments_and_charged_waits(tmp_path):
    """A report with its aligned timeline table (schema 2): the page draws those segments as
    they are, and each charged wait as an arrow from the rank it is charged to."""
    run = tmp_path / "with-timeline"
    shutil.copytree(SAMPLES / PIPELINED, run, ignore=shutil.ignore_patterns("traces"))
    rows = [  # rank, step, kind, dim, cause, start_us, end_us
        (0, 4, "compute", "", -1, 0.0, 1000.0), (0, 4, "wait", "dp", 1, 1000.0, 3000.0),
        (1, 4, "compute", "", -1, 0.0, 2900.0), (1, 4, "comm", "dp", -1, 2900.0, 3100.0),
        (2, 4, "bubble", "", -1, 0.0, 500.0), (3, 4, "compute", "", -1, 100.0, 900.0),
        (0, 5, "compute", "", -1, 0.0, 10.0)]
    pd.DataFrame(rows, columns=["rank", "step", "kind", "dim", "cause", "start_us", "end_us"]) \
        .to_parquet(run / "report" / "timeline.parquet", index=False)
    items = _items(RunIndex(tmp_path), "with-timeline", "timeline", step=4)
    fig = items["timeline-graph"].figure
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert set(bars) == {"compute", "wait", "comm dp", "bubble"}
    cp = pd.read_parquet(run / "report" / "critical_path.parquet") \
        if (run / "report" / "critical_path.parquet").is_file() else None
    path = [t for t in fig.data if t.type == "scatter"]
    if cp is not None:   # the report's critical path of the step, one line over the lanes
        assert len(path[0].x) == 2 * int((cp["step"] == 4).sum())
    else:
        assert path == []
    assert len(bars["compute"].x) == 3 and list(bars["wait"].base) == [1.0]
    assert list(bars["wait"].x) == [2.0]
    (arrow,) = fig.layout.annotations
    assert (arrow.ay, arrow.y, arrow.x) == ("rank 1 (pp0·dp1)", "rank 0 (pp0·dp0)", 3.0)


@pytest.mark.parametrize("spelling", ["relative", "absolute"])
def test_pages_and_export_show_paths_relative_to_the_runs_folder(tmp_path, spelling):
    """A run analysed from another folder — ``meshscope analyze ../runs/RUN`` or
    ``/abs/…/runs/RUN`` — with one damaged trace: the health page, the overview and the static
    report name the damaged file as ``RUN/traces/…``, never the server's folder or the
    analysing shell's ``../runs``."""
    import subprocess
    import sys
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copytree(SAMPLES / "dp4-ddp", runs / "dp4-ddp",
                    ignore=shutil.ignore_patterns("report"))
    (runs / "dp4-ddp" / "traces" / "rank3.json.gz").write_bytes(b"not gzip")
    target = "../runs/dp4-ddp" if spelling == "relative" else str(runs / "dp4-ddp")
    proc = subprocess.run([sys.executable, "-m", "meshscope", "analyze", "--no-cache", target],
                          cwd=elsewhere, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    written = json.loads((runs / "dp4-ddp" / "report" / "summary.json").read_text())
    assert any(target in p for p in written["problems"])     # the report holds the spelling
    report = open_report(RunIndex(runs).get("dp4-ddp"))
    shown = ""
    for page in ("overview", "health"):
        ctx = PageContext(report, st.ViewState(page=page, runs=("dp4-ddp",)))
        shown += S.to_html(BUILDERS[page](ctx))
    shown = html.unescape(shown)
    exported = render_html(report)
    for text in (shown, exported):
        assert "dp4-ddp/traces/rank3.json.gz" in html.unescape(text)
        assert str(tmp_path) not in text and "../runs" not in text
        assert str(runs) not in html.unescape(text)


def test_a_schema_2_report_reads_on_every_page_through_the_reader(tmp_path):
    """The slow-rank sample's report written back as schema 2 wrote it (the replayed makespan
    as step_time_us beside throughput.step_time_us, the what-if's imbalance as
    stage_imbalance, no schema-3 names): every page and the static report build, the overview
    heads with the step timer's time, the pipeline page shows the one imbalance schema 2 had
    under its schema-3 name — the older version handled in reader.py alone."""
    shutil.copytree(SAMPLES / SLOW, tmp_path / SLOW)
    path = tmp_path / SLOW / "report" / "summary.json"
    s = json.loads(path.read_text())
    timer, replayed = s["step_time_timer_us"], s["step_time_replayed_us"]
    corrected = s["stage_imbalance_without_straggler"]
    for key in ("step_time_timer_us", "step_time_replayed_us", "window_us", "table_clocks",
                "stage_imbalance_measured", "stage_imbalance_without_straggler"):
        s.pop(key, None)
    s.update(schema_version=2, step_time_us=replayed,
             step_time_source="replayed makespan of the profiled steps",
             stage_imbalance=corrected)
    path.write_text(json.dumps(s))
    index = RunIndex(tmp_path)
    for page in BUILDERS:
        items = _items(index, SLOW, page)
        assert items, page
        S.to_dash([S.Section(None, list(items.values()))])
    facts = dict(_items(index, SLOW, "overview")["run-facts"].items)
    assert facts["step time"] == f"{timer / 1e3:.2f} ms (step timer)"
    assert f"replayed {replayed / 1e3:.2f} ms" in facts["other step times"]
    imbalance = dict(_items(index, SLOW, "pipeline")["imbalance-facts"].items)
    assert any(v.startswith(f"{corrected['max_over_mean']:.3f}") and "straggler" in k
               for k, v in imbalance.items())
    assert f"{timer / 1e3:.2f} ms (step timer)" in render_html(open_report(index.get(SLOW)))


def _served_ids(app, path: str, search: str) -> tuple[set, set]:
    """The ids in the navigation bar and in the page body the server sends for
    ``path?search`` (Dash's callback answer, as the browser receives it)."""
    from meshscope.dashboard.app import page_request

    r = app.server.test_client().post("/_dash-update-component",
                                      json=page_request(app, path, search))
    assert r.status_code == 200
    answer = r.get_json()["response"]

    def ids(node) -> set:
        if isinstance(node, list):
            return set().union(*map(ids, node)) if node else set()
        if isinstance(node, dict):
            own = {node["props"]["id"]} if isinstance(node.get("props"), dict) and \
                isinstance(node["props"].get("id"), str) else set()
            return own | set().union(*map(ids, node.values()))
        return set()
    return ids(answer["nav"]), ids(answer["page"])


@pytest.mark.parametrize("run_id", sorted(p.name for p in SAMPLES.iterdir()
                                          if (p / "report" / "summary.json").is_file()))
def test_the_nav_bar_offers_the_gpu_page_only_for_a_gpu_run(run_id):
    """Every shipped sample ran on CPUs (its summary says so) and was recorded before the
    runner recorded memory (its summary's memory is empty): no GPU or Memory link in the bar
    on any of its pages, every other page linked; ``/gpu`` and ``/memory`` still answer, with
    their explanations."""
    from meshscope.dashboard.app import create_app

    assert _summary(run_id)["device"] == "cpu"
    assert not _summary(run_id)["memory"]["devices"]
    app = create_app(SAMPLES)
    for page in ("overview", "timeline"):
        nav, _ = _served_ids(app, f"/{page}", f"?run={run_id}")
        assert "nav-gpu" not in nav and "nav-memory" not in nav
        assert {f"nav-{p}" for p in st.PAGES if p not in ("gpu", "memory")} | {"nav-runs"} \
            <= nav
    _, body = _served_ids(app, "/gpu", f"?run={run_id}")
    assert "gpu-none" in body
    _, body = _served_ids(app, "/memory", f"?run={run_id}")
    assert "memory-none" in body


def test_a_grid_is_a_plain_table_in_the_static_report():
    """sections.Grid (the compare page's sortable kernel table) in the static HTML: the same
    rows, numbers with the grid's decimals, unknown values as a dash."""
    grid = S.Grid("g", [("kernel", "key", "text"), ("Δ ms", "d", "number")],
                  [{"key": "nccl:all_reduce", "d": 1.23456}, {"key": "gemm<a>", "d": None}])
    out = S.to_html([S.Section(None, [grid])])
    assert '<table id="g">' in out and "<td class=\"\">1.23</td>" in out
    assert "gemm&lt;a&gt;" in out and "—" in out


def test_a_query_string_of_any_size_is_read():
    """A URL with hundreds of query fields (issue 35: more than 64 answered 500 with a
    traceback in the log): the first 64 are read, the rest ignored."""
    search = "?" + "&".join(f"run=r{i}" for i in range(300)) + "&step=3"
    s = st.parse("/compare", search)
    assert s.page == "compare" and s.runs == tuple(f"r{i}" for i in range(st.MAX_RUNS))
    assert s.step is None                    # it came after the first 64 fields
    assert st.parse("/overview", "?step=3&" + "x=1&" * 500).step == 3


@pytest.mark.parametrize("run_id", ["dp4-ddp", "dp2-ep2-moe"])
def test_the_communication_page_shows_each_ranks_overlap(index, run_id):
    """Overlap % was on no page (issue 35): each rank's, as summary.json holds it."""
    rows = _items(index, run_id, "communication")["overlap-table"].rows
    s = _summary(run_id)
    assert len(rows) == len(s["per_rank_mean"])
    for row, m, t in zip(rows, s["per_rank_mean"], s["trace_overlap"]):
        assert row[3] == f"{m['overlap_pct']:.1f}%" and row[4] == f"{t['overlap_pct']:.1f}%"
        assert row[1] == f"{m['comm_us'] / 1e3:.2f} ms"


def test_the_compare_table_shows_the_window_its_parts_fit_within(index):
    """The compare table's compute and bubble (profiled steps) exceeded its step time (the
    step timer's, over every step) with nothing to say why (issue 35): the profiled window they
    fit within is a row of its own — the report's one window, summary.json's ``window_us``
    (issue 44), not a mean over ranks of its own."""
    names, rows = compare.comparison_rows(compare._analysis_compare(
        index, st.ViewState(page="compare", runs=(PIPELINED, SLOW)),
        [index.get(PIPELINED), index.get(SLOW)]))
    table = {label: vals for label, vals, _ in rows}
    window = next(v for k, v in table.items() if k.startswith("profiled window"))
    for name, w, c, b in zip(names, window, table["compute (ms, mean over ranks)"],
                             table["bubble (ms)"]):
        assert w == pytest.approx(_summary(name)["window_us"] / 1e3)
        assert c + b <= w + 1e-6
