"""The dashboard's GPU page and the overview's GPU section, built on the server (no browser)
from real GPU traces of the shared corpus, analysed by ``meshscope analyze`` into a runs folder
as a user would: every figure and table holds the report's own numbers (``idle``,
``step_categories``, ``kernels``, ``kernel_categories``, ``sync_calls``, ``stream_idle``,
``gemms``); a CPU run gets one note; the static report carries the page for GPU runs only.

Runs: ``kineto_tb_samples/resnet50_num_workers_0`` (one rank, PyTorch 1.8 bare-array trace: a
47 ms data-loader stall per step), ``hta/trace_filter`` (two ranks, hundreds of GEMM shapes),
a small hand-made trace with one ``aten::mm`` per step on an A100, the same without its shapes,
and the shipped CPU sample ``dp4-ddp``.
"""
from __future__ import annotations

import html
import json
import pathlib
import shutil

import pandas as pd
import pytest

from conftest import meshscope, shared_trace
from gpu_trace_builder import Trace
from meshscope.dashboard import sections as S
from meshscope.dashboard.app import BUILDERS, create_app, page_request
from meshscope.dashboard.data import open_report
from meshscope.dashboard.pages import device
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.state import ViewState
from meshscope.dashboard.static_report import render_html

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESNET = "resnet50_num_workers_0"
TWO_RANKS = "trace_filter"
GEMM = "one-gemm"
NO_SHAPES = "no-shapes"
CPU = "dp4-ddp"


def _gemm_trace(folder: pathlib.Path, shapes: bool = True) -> None:
    """Two steps, each an ``aten::mm`` of 4096×4096 by 4096×4096 in fp32 (137.4 GFLOP) whose
    one kernel runs 10 ms: 13.7 TFLOP/s on an A100. ``shapes`` False: the same trace recorded
    without ``record_shapes``."""
    t = Trace(rank=0)
    for i, start in enumerate((0.0, 20_000.0)):
        t.step(i + 1, start, 15_000.0)
        t.host("aten::mm", start + 100, 50, **({"Input Dims": [[4096, 4096], [4096, 4096]],
                                                 "Input type": ["float", "float"]}
                                                if shapes else {}))
        t.launch(start + 110, 20, start + 200, 10_000.0)
    t.write(folder)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    resnet = shared_trace(f"gpu/kineto_tb_samples/{RESNET}")
    two = shared_trace(f"gpu/hta/{TWO_RANKS}")
    root = tmp_path_factory.mktemp("gpu-runs") / "runs"
    shutil.copytree(resnet, root / RESNET)
    shutil.copytree(two, root / TWO_RANKS)
    _gemm_trace(root / GEMM)
    _gemm_trace(root / NO_SHAPES, shapes=False)
    shutil.copytree(ROOT / "samples" / CPU, root / CPU,
                    ignore=shutil.ignore_patterns("traces", ".cache"))
    for run in (RESNET, TWO_RANKS, GEMM, NO_SHAPES):
        meshscope("analyze", root / run, check=True)
    return root


@pytest.fixture(scope="module")
def index(runs):
    return RunIndex(runs)


def _report(runs, run, name) -> pd.DataFrame:
    return pd.read_parquet(runs / run / "report" / f"{name}.parquet")


def _items(index, run_id, page="gpu", **state):
    ctx = PageContext(open_report(index.get(run_id)),
                      ViewState(page=page, runs=(run_id,), **state))
    sections = BUILDERS[page](ctx)
    S.to_dash(sections)
    return {i.id: i for s in sections for i in s.items}


@pytest.mark.parametrize("run", [RESNET, TWO_RANKS])
def test_idle_bars_are_the_idle_tables_means_per_rank(runs, index, run):
    idle = _report(runs, run, "idle")
    means = idle.groupby("rank").mean()
    fig = _items(index, run)["idle-graph"].figure
    assert [t.name for t in fig.data] == list(device.IDLE_CAUSES.values())
    for trace, cause in zip(fig.data, device.IDLE_CAUSES):
        assert list(trace.x) == pytest.approx(
            (means[f"idle_{cause}_us"] / 1e3).tolist(), abs=1e-4), cause
        assert len(trace.y) == len(means)
    # The causes stack up to the rank's idle, which is the breakdown's idle.
    per_rank = json.loads((runs / run / "report" / "summary.json").read_text())["per_rank_mean"]
    for i, r in enumerate(means.index):
        total = sum(t.x[i] for t in fig.data)
        assert total == pytest.approx(means.loc[r, "idle_us"] / 1e3, abs=1e-3)
        assert total == pytest.approx(
            next(m["idle_us"] for m in per_rank if m["rank"] == r) / 1e3, abs=1e-3)
    assert fig.layout.xaxis.title.text.startswith("ms")


def test_the_data_loader_stall_is_the_largest_part(index):
    items = _items(index, RESNET)
    fig = items["idle-graph"].figure
    loader = next(t for t in fig.data if t.name == "data loader")
    assert 40 < loader.x[0] < 55                               # the 47 ms stall per step
    assert loader.x[0] == max(t.x[0] for t in fig.data)
    assert "the largest part: data loader, " in items["gpu-headline"].text


def test_step_categories_are_the_plugins_per_step(runs, index):
    cats = _report(runs, RESNET, "step_categories").sort_values("step")
    fig = _items(index, RESNET)["categories-graph"].figure
    assert [t.name for t in fig.data] == list(device.STEP_CATEGORIES.values())
    for trace, key in zip(fig.data, device.STEP_CATEGORIES):
        assert list(trace.x) == [f"step {s}" for s in cats["step"]]
        assert list(trace.y) == pytest.approx((cats[f"{key}_us"] / 1e3).tolist(), abs=1e-4)
    for i, w in enumerate(cats["window_us"] / 1e3):
        assert sum(t.y[i] for t in fig.data) == pytest.approx(w, abs=1e-3)


@pytest.mark.parametrize("run, rank", [(RESNET, None), (TWO_RANKS, 1)])
def test_kernel_table_rows_are_the_kernel_tables(runs, index, run, rank):
    k = _report(runs, run, "kernels")
    want = k[k["rank"] == (rank or 0)]
    table = _items(index, run, rank=rank)["kernels-table"]
    assert table.columns[:6] == ["kernel", "category", "count", "total ms", "mean µs",
                                 "share %"]
    assert len(table.rows) == len(want)
    for row, (_, r) in zip(table.rows, want.iterrows()):
        name = row[0]
        full = name.title if isinstance(name, S.Cell) else name
        assert full == r["name"]
        assert len(str(name)) <= device.NAME_CHARS
        assert row[1:6] == [r["category"], r["count"], f"{r['total_us'] / 1e3:.2f}",
                            f"{r['mean_us']:.1f}", f"{r['share_pct']:.1f}"]


def test_long_kernel_names_are_cut_with_the_full_name_as_tooltip(runs, index):
    table = _items(index, RESNET)["kernels-table"]
    cut = [r[0] for r in table.rows if isinstance(r[0], S.Cell)]
    assert cut                    # cuDNN's names with their template and argument lists
    for c in cut:
        assert c.text.endswith(("…", "(…)", ">")) and len(c.text) <= device.NAME_CHARS
    # the dashboard and the static report both carry the whole name as the cell's title
    body = json.dumps(S.to_dash([S.Section(None, [table])])[0].to_plotly_json(), default=str)
    assert json.dumps(cut[0].title)[1:-1] in body
    assert f'title="{html.escape(cut[0].title)}"' in render_html(open_report(index.get(RESNET)))


def test_kernel_categories_are_the_reports(runs, index):
    kc = _report(runs, RESNET, "kernel_categories").sort_values("total_us", ascending=False)
    rows = _items(index, RESNET)["kernel-categories-table"].rows
    assert [r[0] for r in rows] == kc["category"].tolist()
    assert [r[2] for r in rows] == [f"{v / 1e3:.2f}" for v in kc["total_us"]]


def test_sync_table_groups_the_synchronisations(runs, index):
    calls = _report(runs, RESNET, "sync_calls")
    rows = _items(index, RESNET)["sync-table"].rows
    assert sum(r[3] for r in rows) == len(calls)
    assert sum(float(r[5]) for r in rows) == pytest.approx(
        calls["idle_after_us"].sum() / 1e3, abs=0.01 * len(rows))
    top = calls.groupby(["name", "parent_op"])["idle_after_us"].sum().idxmax()
    assert tuple(rows[0][:2]) == top                      # cudaStreamSynchronize in aten::to


def test_stream_idle_is_htas_breakdown(runs, index):
    """Of the rank the page shows (the rank picker; the first without one): the table
    follows the picker (issue 51)."""
    s = _report(runs, TWO_RANKS, "stream_idle")
    for rank, items in ((0, _items(index, TWO_RANKS)), (1, _items(index, TWO_RANKS, rank=1))):
        mine = s[s["rank"] == rank]
        rows = items["stream-idle-table"].rows
        assert len(mine) and [(r[0], r[1]) for r in rows] == list(zip(mine["rank"],
                                                                      mine["stream"]))
        assert [r[3] for r in rows] == [f"{v / 1e3:.2f}" for v in mine["host_wait_us"]]


def test_the_rank_in_the_url_picks_the_per_rank_sections(index):
    items = _items(index, TWO_RANKS, rank=1)
    assert items["categories-graph"].figure.layout.title.text.startswith(
        "Each profiled step of rank 1")
    assert items["idle-graph"].figure.data[0].y == ("rank 0", "rank 1")


def _gemm_rows(g: pd.DataFrame) -> list[list]:
    def opt(v, f):
        return "—" if v != v else f.format(v)
    return [[r["op"], S.Cell(" · ".join("×".join(map(str, d)) for d in json.loads(r["shapes"])
                                        if d), r["shapes"]),
             r["dtype"] or "—", r["calls"], f"{r['flops'] / 1e9:.2f}",
             f"{r['kernel_us'] / 1e3:.3f}", opt(r["tflops"], "{:.1f}"),
             opt(r["peak_tflops"], "{:.1f}"), opt(100 * r["efficiency"], "{:.1f}")]
            for _, r in g.iterrows()]


def test_gemm_table_is_the_gemms(runs, index):
    g = _report(runs, RESNET, "gemms").sort_values("flops", ascending=False, kind="stable")
    assert len(g) > 0                    # the PyTorch 1.8 sample records its shapes
    table = _items(index, RESNET)["gemms-table"]
    assert table.rows == _gemm_rows(g)
    g = _report(runs, GEMM, "gemms")
    rows = _items(index, GEMM)["gemms-table"].rows
    assert rows == _gemm_rows(g)
    assert [str(c) for c in rows[0][:4]] == ["aten::mm", "4096×4096 · 4096×4096", "float", "2"]
    assert rows[0][6] == "13.7" and rows[0][7] != "—"          # 2 × 137.4 GFLOP in 20 ms


def test_a_large_gemm_table_shows_the_most_flops(runs, index):
    g = _report(runs, TWO_RANKS, "gemms")
    g = g[g["rank"] == 0]
    table = _items(index, TWO_RANKS, rank=0)["gemms-table"]
    assert len(g) > device.MAX_GEMM_ROWS
    assert len(table.rows) == device.MAX_GEMM_ROWS
    assert [r[4] for r in table.rows] == [f"{v / 1e9:.2f}" for v in
                                          g["flops"].nlargest(device.MAX_GEMM_ROWS)]
    assert f"of {len(g)} are shown" in table.caption


def test_no_gemm_shapes_says_how_to_record_them(index):
    assert "record_shapes=True" in _items(index, NO_SHAPES)["gemms-none"].text


def test_a_cpu_run_gets_one_note(index):
    items = _items(index, CPU)
    assert list(items) == ["gpu-none"]
    assert "GPU figures" in items["gpu-none"].text and "has none" in items["gpu-none"].text
    assert "overview-idle-graph" not in _items(index, CPU, page="overview")
    assert 'id="page-gpu"' not in render_html(open_report(index.get(CPU)))


def test_overview_says_where_the_gpus_idle_time_goes(runs, index):
    items = _items(index, RESNET, page="overview")
    idle = _report(runs, RESNET, "idle")
    bars = items["overview-idle-graph"].figure
    assert sum(t.x[0] for t in bars.data) == pytest.approx(idle["idle_us"].mean() / 1e3,
                                                           abs=1e-3)
    assert items["gpu-headline"].text.startswith("Rank 0's GPU idles ")
    assert items["gpu-link"].href == f"/gpu?run={RESNET}"


def test_static_report_has_the_gpu_page(index):
    html = render_html(open_report(index.get(RESNET)))
    assert 'id="page-gpu"' in html and 'href="#page-gpu"' in html
    for fig_id in ("idle-graph", "categories-graph", "overview-idle-graph"):
        assert f'id="{fig_id}"' in html
    assert 'id="kernels-table"' in html and 'id="sync-table"' in html


def test_the_server_answers_the_gpu_page(runs):
    app = create_app(runs)
    r = app.server.test_client().post("/_dash-update-component",
                                      json=page_request(app, "/gpu", f"?run={TWO_RANKS}"))
    assert r.status_code == 200
    body = r.get_data(as_text=True)
    assert "idle-graph" in body and "kernels-table" in body and "rank-select" in body
    assert str(runs) not in body


def test_the_nav_bar_offers_the_gpu_page_for_a_gpu_run(runs):
    """A GPU run's summary says ``device: gpu``: its pages link the GPU page; with no run
    selected (the runs list) the bar has no GPU link, there being no run to say so."""
    assert json.loads((runs / TWO_RANKS / "report" / "summary.json").read_text())["device"] \
        == "gpu"
    app = create_app(runs)
    for path, search, linked in (("/overview", f"?run={TWO_RANKS}", True),
                                 ("/gpu", f"?run={TWO_RANKS}", True), ("/", "", False)):
        r = app.server.test_client().post("/_dash-update-component",
                                          json=page_request(app, path, search))
        assert r.status_code == 200
        nav = json.dumps(r.get_json()["response"]["nav"])
        assert ('"id": "nav-gpu"' in nav) == linked, path
        assert '"id": "nav-overview"' in nav


def test_the_gpu_page_of_many_ranks_is_tabs_below_its_headline(index):
    """The two-rank GPU report said to be of 64 ranks (its summary's rank list): the headline
    stays above, each section becomes a tab of ``gpu-tabs`` — the idle's figures in the
    first, the step categories in another, drawn when opened. The report as it is (two ranks,
    a healthy input) has no tab."""
    import copy

    from meshscope.dashboard.data import RunReport

    rep = open_report(index.get(TWO_RANKS))
    summary = copy.deepcopy(rep.summary)
    summary["ranks"] = list(range(64))
    many = RunReport(entry=rep.entry, summary=summary, tables=dict(rep.tables),
                     written=rep.written, run_info=rep.run_info, mtime_ns=1)
    out = BUILDERS["gpu"](PageContext(many, ViewState(page="gpu", runs=(TWO_RANKS,))))
    assert out[0].tabs is None and [i.id for i in out[0].items] == ["gpu-headline"]
    assert {s.tabs for s in out[1:]} == {"gpu-tabs"}
    ids = [[i.id for i in s.items] for s in out[1:]]
    assert "idle-graph" in ids[0] and "categories-graph" not in ids[0]
    assert any("categories-graph" in x for x in ids[1:])
    assert not [s for s in BUILDERS["gpu"](PageContext(rep, ViewState(page="gpu",
                                                                      runs=(TWO_RANKS,))))
                if s.tabs]
