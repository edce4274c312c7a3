"""Each headline quantity is one number wherever it is shown (issue 44): not a search for second
spellings (tests/test_definitions_located.py locates the definitions), but the values
themselves, read in every place a reader meets them, on every sample and every set of the
shared GPU corpus:

- the headline step time: summary.json, ``--json``, the CLI text, the overview's facts, the
  static report, compare (the two-run diff and the ranked rows, and its page);
- the run's window step time: summary.json, the CLI text, the overview, compare's ranked rows
  and its page, the GPU page's sentence (a run of several GPU ranks);
- each rank's means over its profiled steps (window, compute, communication, overlapped and
  exposed communication, bubble, idle): summary.json against the breakdown table they are the
  mean of, the CLI's per-rank table and the overview's stacked bars;
- the idle total: the breakdown's (``per_rank_mean``), the idle table's own total (the second
  formula, held equal here), the GPU page's bars and the CLI's GPU idle table;
- the exposed set: what the Timeline draws as communication and bubble on each rank and step
  is the breakdown's exposed communication and bubble (up to the drawing's merging of
  stretches closer than 1/2000 of the step, which only adds: ``MERGED_SHARE``).
"""
from __future__ import annotations

import json
import pathlib

import pytest

from conftest import ROOT
from meshscope.analysis.compare.diff import diff
from meshscope.analysis.compare.sides import open_side
from meshscope.analysis.report import reader, text
from meshscope.dashboard import state as st
from meshscope.dashboard.app import BUILDERS
from meshscope.dashboard.data import open_report
from meshscope.dashboard.pages import compare as compare_page
from meshscope.dashboard.pages import device
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.static_report import render_html
from meshscope.layouts import ranked

SAMPLES = ROOT / "samples"
SAMPLE_NAMES = sorted(p.name for p in SAMPLES.iterdir()
                      if (p / "report" / "summary.json").is_file())
# The drawing merges stretches of one kind closer than 1/segments.RESOLUTION of the step, which
# only adds: at most 2.3% of the step on the samples, 9.5% on HTA's trace_diff control (GPU
# communication kernels a few µs apart). The lower bound is what tells a drawing of another
# set: the pp transfers of a 1F1B sample drawn as communication, not the breakdown's bubble,
# drew 1 ms of a 134 ms bubble.
MERGED_SHARE = 0.10
BREAKDOWN_COLUMNS = ("window_us", "compute_us", "comm_us", "overlapped_comm_us",
                     "exposed_comm_us", "bubble_us", "idle_us")


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def _cli_rows(cli: str) -> dict[int, list[float]]:
    """The CLI's per-rank table: rank → window, compute, comm, overlapped, exposed, bubble,
    idle (ms)."""
    lines = cli[cli.index("Per rank, mean over profiled steps (ms):"):].splitlines()[2:]
    out = {}
    for line in lines:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        out[int(cells[0])] = [float(c) for c in cells[1:8]]
    return out


def _cli_gpu_idle(cli: str) -> dict[int, float]:
    """The CLI's GPU idle table: rank → idle (ms)."""
    head = "Where the GPU's idle time goes, per rank, mean over profiled steps (ms):"
    if head not in cli:
        return {}
    out = {}
    for line in cli[cli.index(head):].splitlines()[2:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        out[int(cells[0])] = float(cells[1])
    return out


def _facts(report, page: str, name: str) -> dict:
    ctx = PageContext(report, st.ViewState(page=page, runs=(name,)))
    return {i.id: i for s in BUILDERS[page](ctx) for i in s.items}


def one_value_everywhere(folder: pathlib.Path, name: str, printed: dict | None = None):
    """Every check of the module docstring on the analysed run ``folder`` (its report in
    ``folder/report``), shown in the dashboard under ``name``; ``printed``: what
    ``meshscope analyze --json`` printed for it, where the test has it."""
    doc = json.loads((folder / "report" / "summary.json").read_text())
    if printed is not None:
        assert printed == doc, name               # --json prints the report's summary.json
    typed = reader.read_summary(doc)
    report = open_report(RunIndex(folder.parent).get(name))
    cli = text.render(doc)
    st_ = typed.step_time
    head, window = st_.us, st_.window_us
    # -- the headline step time
    assert head is not None, name
    assert f"step time {_ms(head)} ({st_.short})" in cli, name
    facts = dict(_facts(report, "overview", name)["run-facts"].items)
    assert facts["step time"] == st_.text(), name
    html = render_html(report)
    assert f"{_ms(head)} ({st_.short})" in html, name
    d = diff(open_side(folder), open_side(folder))
    assert (d.step_time.before, d.step_time.after) == (head, head), name
    c = ranked.compare([folder])
    assert [r.step_time_us for r in c.rows] == [head], name
    names, rows = compare_page.comparison_rows(c)
    table = {label: values for label, values, _ in rows}
    assert table["step time (ms)"] == [head / 1e3], name
    # -- the window
    if window is not None:
        if st_.source != "window":
            assert f"profiled window {window / 1e3:.2f} ms" in cli, name
            assert f"profiled window {_ms(window)}" in facts["other step times"], name
        assert [r.window_us for r in c.rows] == [window], name
        assert [v for k, v in table.items() if k.startswith("profiled window")] == \
            [[window / 1e3]], name
        assert window == pytest.approx(
            report.table("breakdown").groupby("step")["window_us"].max().mean(), rel=1e-12)
    # -- each rank's means, against the table they are the mean of, and the CLI
    bd = report.table("breakdown")
    cli_rows = _cli_rows(cli)
    assert sorted(cli_rows) == [m.rank for m in typed.per_rank_mean], name
    for m in typed.per_rank_mean:
        mine = bd[bd["rank"] == m.rank]
        for i, col in enumerate(BREAKDOWN_COLUMNS):
            assert getattr(m, col) == pytest.approx(float(mine[col].mean()), rel=1e-12,
                                                    abs=1e-9), (name, m.rank, col)
            assert cli_rows[m.rank][i] == pytest.approx(getattr(m, col) / 1e3, abs=0.0051), \
                (name, m.rank, col)
    # ... and the overview's stacked bars: each segment is the rank's mean, the exposed
    # segments add up to its exposed communication
    items = _facts(report, "overview", name)
    if "breakdown-graph" in items:
        bars = {t.name: dict(zip(t.customdata, t.y)) for t in items["breakdown-graph"].figure.data}
        for m in typed.per_rank_mean:
            for label, us in (("bubble", m.bubble_us), ("idle", m.idle_us),
                              ("overlapped comm", m.overlapped_comm_us),
                              ("compute without overlapped comm",
                               m.compute_without_overlap_us)):
                assert bars[label][m.rank] == pytest.approx(us / 1e3, abs=1e-4), \
                    (name, m.rank, label)
            exposed = sum(v[m.rank] for k, v in bars.items() if k.startswith("exposed"))
            assert exposed == pytest.approx(m.exposed_comm_us / 1e3, abs=1e-3), (name, m.rank)
    # -- the idle total: one number, the second formula held equal to it
    idle = report.table("idle")
    total = {m.rank: m.idle_us for m in typed.per_rank_mean}
    if len(idle):
        for rank, mean in idle.groupby("rank")["idle_us"].mean().items():
            assert mean == pytest.approx(total[int(rank)], rel=1e-9, abs=1e-6), (name, rank)
        means = device.idle_means(report)
        assert {int(r): v for r, v in means["idle_us"].items()} == \
            {g.rank: total[g.rank] for g in typed.gpu_idle_per_rank_mean}, name
        for rank, ms in _cli_gpu_idle(cli).items():
            assert ms == pytest.approx(total[rank] / 1e3, abs=0.0051), (name, rank)
        note = device.headline(report)
        if len(means) > 1 and window:
            assert f"of their {window / 1e3:.1f} ms step" in note.text, name
    # -- the exposed set: the Timeline draws the breakdown's
    drawn = report.table("timeline")
    for (rank, step), row in bd.set_index(["rank", "step"]).iterrows():
        mine = drawn[(drawn["rank"] == rank) & (drawn["step"] == step)]
        for kind, want in (("comm", row["exposed_comm_us"]), ("bubble", row["bubble_us"])):
            parts = mine[mine["kind"] == kind]
            length = float((parts["end_us"] - parts["start_us"]).sum())
            assert want - 1e-6 <= length <= want + MERGED_SHARE * row["window_us"], \
                (name, rank, step, kind, length, want)


@pytest.fixture(scope="module")
def samples_copy(tmp_path_factory):
    """The samples as they are shipped, in a folder of their own (the dashboard's index)."""
    import shutil

    root = tmp_path_factory.mktemp("samples")
    for n in SAMPLE_NAMES:
        shutil.copytree(SAMPLES / n, root / n)
    return root


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_every_sample_shows_each_quantity_as_one_number(samples_copy, name):
    one_value_everywhere(samples_copy / name, name)


@pytest.mark.slow
def test_every_shared_gpu_set_shows_each_quantity_as_one_number(real_gpu_sets):
    root, printed = real_gpu_sets
    checked = [n for n, doc in printed.items() if doc is not None]
    assert len(checked) >= 15
    for name in checked:
        one_value_everywhere(root / name, name, printed[name])
