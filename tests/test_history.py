"""``meshscope history`` (issue 50 item 2): 30 synthetic runs with known changes — rank 1
slowed from run 12, 10% more compute from run 20, 200 MB more peak memory from run 25 — and
the step-to-step noise of synth's seeded compute, plus a 31st run on another device. The
history names each change at the run it was injected and nothing else, keeps the other
device's run apart, and the gate fails on each change but not on the healthy runs before."""
from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT, meshscope

sys.path.insert(0, str(ROOT))
from bench import history_synth  # noqa: E402

from meshscope.analysis.compare import gate  # noqa: E402
from meshscope.history import baseline  # noqa: E402
from meshscope.history.changes import change_points  # noqa: E402
from meshscope.history.review import review  # noqa: E402
from meshscope.history.series import open_runs, ordered, trends  # noqa: E402

SLOW, COMPUTE, MEMORY = 12, 20, 25          # 1-based: the first run with each change


@pytest.fixture(scope="session")
def series_runs(tmp_path_factory):
    """The 31 runs, built and analysed once (about 15 s on one core)."""
    out = tmp_path_factory.mktemp("history")
    history_synth.make_series(out / "runs", 30, slow_from=SLOW, compute_from=COMPUTE,
                              memory_from=MEMORY)
    return out / "runs"


@pytest.fixture(scope="session")
def sides(series_runs):
    # Opened in reverse: the history orders them by run.json's start time.
    return ordered(open_runs(sorted(series_runs.iterdir(), reverse=True)), "start")


@pytest.fixture(scope="session")
def whole(sides):
    return review(sides)


def _at(r) -> dict[int, set[str]]:
    """1-based run → the quantities that changed there."""
    return {s.at + 1: {c.quantity for c in s.changes} for s in r.shifts}


def test_each_change_is_named_at_its_run_and_nothing_else(whole):
    assert whole.series.names == [f"run{i:02d}" for i in range(1, 31)]
    at = _at(whole)
    assert set(at) == {SLOW, COMPUTE, MEMORY}
    # The slowed rank: the step, its compute (rank 1's own) and the others' wait in dp.
    assert {"step_time", "compute", "exposed_comm.dp"} <= at[SLOW]
    assert "peak_memory" not in at[SLOW]
    assert {"step_time", "compute"} <= at[COMPUTE] and "peak_memory" not in at[COMPUTE]
    assert at[MEMORY] == {"peak_memory"}
    levels = {c.quantity: c for s in whole.shifts if s.at + 1 == MEMORY for c in s.changes}
    assert levels["peak_memory"].delta == pytest.approx(history_synth.MEMORY_GROWTH_BYTES)
    compute = next(c for s in whole.shifts if s.at + 1 == COMPUTE for c in s.changes
                   if c.quantity == "compute")
    assert compute.rel == pytest.approx(0.10, abs=0.02)


def test_each_change_point_says_what_changed_there(whole):
    by_run = {s.at + 1: s for s in whole.shifts}
    slow = by_run[SLOW]
    assert (slow.before_run, slow.after_run) == ("run11", "run12")
    assert any("Rank 1 computes" in x for x in slow.sentences), slow.sentences
    assert any("Compute grew" in x for x in by_run[COMPUTE].sentences)


def test_the_run_on_another_device_is_kept_apart_and_said(whole):
    kept = dict(whole.series.kept_apart)
    assert list(kept) == ["run31"]
    assert any(history_synth.OTHER_DEVICE in why for why in kept["run31"])
    assert [o.names for o in whole.others] == [["run31"]]


def test_a_series_spans_a_layout_only_when_told_and_never_a_device(sides):
    """Two shipped samples of one model and world differ in layout (dp=4 against dp=2,pp=2):
    apart by default, one series with ``--across layout schedule``; the run on another device
    stays apart whatever the history is told."""
    from meshscope.analysis.compare.sides import open_side
    from meshscope.history.series import ACROSS, split, unlike

    a, b = (open_side(ROOT / "samples" / name) for name in ("dp4-ddp", "dp2-pp2-1f1b"))
    plain = unlike(a, b)
    assert any(line.startswith("layout: dp=4 → dp=2,pp=2") for line in plain), plain
    told = unlike(a, b, ("layout", "schedule"))
    assert not [x for x in told if x.startswith(("layout:", "schedule:"))]
    assert set(told) <= set(plain)
    everything = split(sides, tuple(ACROSS))
    assert [x.names for x in everything[1:]] == [["run31"]]


def test_healthy_runs_have_no_change_point(sides):
    healthy = sides[:SLOW - 1]
    assert not [cp for t in trends(healthy) for cp in change_points(t)]


def test_change_points_are_deterministic(sides, whole):
    t = next(t for t in whole.trends if t.name == "step_time")
    assert change_points(t) == change_points(t)
    assert [cp.at + 1 for cp in change_points(t)] == [SLOW, COMPUTE]


@pytest.mark.parametrize("upto,condition", [
    (SLOW, "step_time>+5%"), (COMPUTE, "compute>+5%"), (MEMORY, "peak_memory>+100MB")])
def test_the_gate_fails_on_each_change_and_not_before_it(sides, upto, condition):
    cond = gate.parse(condition)
    newest = sides[:upto]
    assert baseline.evaluate(cond, newest).failed
    assert not baseline.evaluate(cond, sides[:upto - 1]).failed


def test_the_baseline_sees_what_the_run_before_alone_does_not(sides):
    """Run 21 against the five runs before it (a median of runs still before the change)
    fails; run 24 against run 23 alone (both after it) does not."""
    cond = gate.parse("compute>+5%")
    assert baseline.evaluate(cond, sides[:COMPUTE + 1], n=5).failed
    assert not baseline.evaluate(cond, sides[:COMPUTE + 4], n=1).failed


def test_the_command_exits_as_compare_gate(series_runs):
    """Exit 1 through the real executable on the run where rank 1 slowed; 0 (in-process) on the
    healthy runs before it. The command's bad inputs (exit 2) are test_exit_code_grid's."""
    from click.testing import CliRunner

    from meshscope.cli import main

    runs = sorted(p for p in series_runs.iterdir())
    failed = meshscope("history", *runs[:SLOW], "--fail-if", "step_time>+5%")
    assert failed.returncode == 1, failed.stderr
    assert "FAIL: step_time>+5%" in failed.stdout
    passed = CliRunner().invoke(main, ["history", *map(str, runs[:SLOW - 1]), "--fail-if",
                                       "step_time>+5%", "--json"])
    assert passed.exit_code == 0, passed.output
    doc = json.loads(passed.stdout)
    assert [g["failed"] for g in doc["gate"]] == [False] and not doc["change_points"]


def _page(app, search: str) -> dict:
    from meshscope.dashboard.app import page_request

    r = app.server.test_client().post("/_dash-update-component",
                                      json=page_request(app, "/history", search))
    assert r.status_code == 200
    return r.get_json()["response"]["page"]


def _by_id(node, found=None) -> dict:
    found = {} if found is None else found
    if isinstance(node, list):
        for x in node:
            _by_id(x, found)
    elif isinstance(node, dict):
        props = node.get("props")
        if isinstance(props, dict) and isinstance(props.get("id"), str):
            found[props["id"]] = props
        for v in node.values():
            _by_id(v, found)
    return found


def test_the_history_page_marks_the_change_points_and_links_their_compare(series_runs):
    """The dashboard over the 31 runs: /history?quantity=peak_memory draws the trend with a
    noise band and one change point, at run 25, whose click and link open the compare of
    runs 24 and 25; the run on another device is listed as kept apart; the quantity is in
    the URL (a link per quantity)."""
    from meshscope.dashboard.app import create_app

    app = create_app(series_runs)
    ids = _by_id(_page(app, "?quantity=peak_memory"))
    fig = ids["history-trend"]["figure"]
    marks = [t for t in fig["data"] if t.get("name") == "change point"]
    assert [m["x"] for m in marks] == [[MEMORY]]
    assert marks[0]["customdata"] == ["/compare?run=run24&run=run25"]
    assert any(t.get("fill") == "tonexty" for t in fig["data"])      # the noise band
    links = {i: p["href"] for i, p in ids.items() if i.startswith("history-change-")
             and "href" in p}
    assert sorted(links.values()) == ["/compare?run=run11&run=run12",
                                      "/compare?run=run19&run=run20",
                                      "/compare?run=run24&run=run25"]
    assert ids["history-q-step_time"]["href"] == "/history?quantity=step_time"
    assert "history-kept-apart" in ids
    first = "&".join(f"run=run{i:02d}" for i in range(1, SLOW))
    healthy = _by_id(_page(app, f"?{first}&quantity=step_time"))
    assert healthy["history-series"]["children"]
    assert not [t for t in healthy["history-trend"]["figure"]["data"]
                if t.get("name") == "change point"]
    assert "history-no-change" in healthy
