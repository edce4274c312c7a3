"""``meshscope export RUN --perfetto``: the merged, aligned timeline as a Chrome/Perfetto trace.

Loaded back as JSON (the ``perfetto`` package's trace processor downloads its binary at run
time, which this offline machine cannot; the JSON structure is validated instead, against the
trace event format's rules): one named process per rank, every complete event of each rank's
trace, the clock offsets of the report applied (checked on a copy whose rank 1 clock was moved
by a known 10 s), and one flow per matched operation through exactly its ranks (on hand-made
traces whose matches are known by construction, and on the samples' collective table when the
report has one).
"""
from __future__ import annotations

import gzip
import json
import pathlib
import shutil
from collections import Counter, defaultdict

import pandas as pd
import pytest

from conftest import meshscope
from meshscope.analysis.report.perfetto import COLLECTIVES_TID, SEGMENTS_TID, export

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SAMPLE = "dp2-pp2-slow-rank1"
SHIFT_US = 10_000_000


def _load(path: pathlib.Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.loads(f.read())


def _raw_trace(path: pathlib.Path) -> dict:
    with gzip.open(path, "rb") as f:
        return json.loads(f.read())


def _x_events(doc: dict, pid: int) -> list[dict]:
    """The rank's trace events in the export (not the threads the report adds)."""
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid
            and e.get("tid") not in (COLLECTIVES_TID, SEGMENTS_TID)]


def _check_format(doc: dict) -> None:
    """The trace event format's rules for what the export writes (ph, ts/dur in µs)."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] == "ms"
    for e in doc["traceEvents"]:
        assert e["ph"] in {"X", "M", "s", "t", "f"}, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], (int, float))
        if e["ph"] in "stf":
            assert isinstance(e["id"], int) and e["bp"] == "e" and isinstance(e["tid"], int)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The sample exported from a copy: ``export`` keeps its parsed traces in the report's
    ``.cache``, and ``samples/`` is read-only to the suite."""
    root = tmp_path_factory.mktemp("pf")
    run, out = root / SAMPLE, root / "trace.json.gz"
    shutil.copytree(SAMPLES / SAMPLE, run, ignore=shutil.ignore_patterns(".cache"))
    proc = meshscope("export", run, "--perfetto", out, check=True)
    return _load(out), proc


def test_one_named_process_per_rank(exported):
    doc, proc = exported
    _check_format(doc)
    run = json.loads((SAMPLES / SAMPLE / "run.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == list(range(run["world_size"]))
    for rank, c in run["mesh"]["coordinates"].items():
        assert names[int(rank)] == f"rank {rank} (pp{c['pp']}·dp{c['dp']})"
    assert f"{run['world_size']} ranks" in proc.stdout


def test_every_complete_event_of_every_trace_is_there(exported):
    doc, _ = exported
    for f in sorted((SAMPLES / SAMPLE / "traces").glob("rank*.json.gz")):
        raw = _raw_trace(f)
        rank = raw["distributedInfo"]["rank"]
        want = Counter(e["name"] for e in raw["traceEvents"] if e.get("ph") == "X")
        got = Counter(e["name"] for e in _x_events(doc, rank))
        assert got == want, f.name


@pytest.fixture(scope="module")
def shifted_run(tmp_path_factory):
    """A copy of the sample whose rank 1 trace clock runs 10 s ahead, with a report saying
    the analysis applied exactly that offset."""
    run = tmp_path_factory.mktemp("skew") / SAMPLE
    shutil.copytree(SAMPLES / SAMPLE, run, ignore=shutil.ignore_patterns(".cache"))
    f = run / "traces" / "rank1.json.gz"
    raw = _raw_trace(f)
    for e in raw["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + SHIFT_US
    with gzip.open(f, "wt") as out:
        json.dump(raw, out)
    ranks = json.loads((run / "report" / "summary.json").read_text())["ranks"]
    pd.DataFrame({"rank": ranks, "offset_us": [SHIFT_US if r == 1 else 0.0 for r in ranks],
                  "uncertainty_us": 1.0,
                  "applied_us": [SHIFT_US if r == 1 else 0.0 for r in ranks]}).to_parquet(
        run / "report" / "clock_offsets.parquet", index=False)
    return run


def test_the_reports_clock_offsets_are_applied(exported, shifted_run, tmp_path):
    original, _ = exported
    s = export(shifted_run, tmp_path / "t.json", report_dir=shifted_run / "report")
    doc = _load(tmp_path / "t.json")
    assert doc["otherData"]["meshscope"]["clock_offsets_applied_us"]["1"] == SHIFT_US
    assert s.applied_us[1] == SHIFT_US and s.applied_us[0] == 0.0
    for rank in (0, 1):
        a = sorted((e["name"], round(e["ts"], 1)) for e in _x_events(original, rank))
        b = sorted((e["name"], round(e["ts"], 1)) for e in _x_events(doc, rank))
        assert a == b, rank


def _kineto(rank: int, ops: list[tuple[str, float, float]], clock_us: float = 0.0) -> dict:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 10 + rank,
               "tid": 1, "ts": 1000.0 + clock_us, "dur": 9000.0}]
    events += [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 10 + rank, "tid": 1,
                "ts": t + clock_us, "dur": d} for n, t, d in ops]
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 3},
            "traceEvents": events}


@pytest.fixture
def hand_made(tmp_path):
    """Three ranks; one all_reduce on all three (rank 2 arrives last), one send 0 -> 1, and a
    row of rank 2 whose match has no peer (left out of flows); rank 1's trace runs 500 µs
    ahead. The instance table is on the aligned clock, as ``analyze`` writes it
    (``crossrank.clocks.align_instances``); the traces are each on their own clock."""
    run = tmp_path / "hand"
    (run / "report").mkdir(parents=True)
    for r in range(3):
        doc = _kineto(r, [("aten::mm", 1100.0, 800.0), ("c10d::allreduce_", 2000.0, 300.0)],
                      clock_us=500.0 if r == 1 else 0.0)
        (run / f"rank{r}.json").write_text(json.dumps(doc))
    rows = [  # rank, match_id, op, arrival, end (aligned: rank 1's own clock − 500 µs)
        (0, "0,1,2|seq=1", "all_reduce", 2000.0, 2400.0),
        (1, "0,1,2|seq=1", "all_reduce", 2100.0, 2400.0),   # 2600 / 2900 on its own clock
        (2, "0,1,2|seq=1", "all_reduce", 2300.0, 2400.0),
        (0, "p2p|0>1|3|0", "send", 5000.0, 5100.0),
        (1, "p2p|0>1|3|0", "recv", 4900.0, 5200.0),         # 5400 / 5700 on its own clock
        (2, "", "all_reduce", 7000.0, 7100.0),
    ]
    pd.DataFrame(rows, columns=["rank", "match_id", "op", "arrival_us", "end_us"]).assign(
        step=3, dim="dp").to_parquet(run / "report" / "instances.parquet", index=False)
    pd.DataFrame({"rank": [0, 1, 2], "offset_us": [0.0, 500.0, 0.0],
                  "uncertainty_us": [0.0, 5.0, 0.0], "applied_us": [0.0, 500.0, 0.0]}) \
        .to_parquet(run / "report" / "clock_offsets.parquet", index=False)
    return run


def test_one_flow_per_matched_operation_through_its_ranks_in_arrival_order(hand_made):
    s = export(hand_made, hand_made / "out.json", report_dir=hand_made / "report")
    doc = _load(hand_made / "out.json")
    _check_format(doc)
    assert s.flows == 2
    flows = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] in "stf":
            flows[e["id"]].append((e["ph"], e["pid"], e["ts"]))
    chains = sorted(flows.values(), key=len)
    # send 0 -> 1: from the send's post (5000) to the recv's end (5200 aligned), although
    # rank 1 posted its recv first (4900 aligned).
    assert chains[0] == [("s", 0, 5000.0), ("f", 1, 5199.999)]
    assert chains[1] == [("s", 0, 2000.0), ("t", 1, 2100.0), ("f", 2, 2300.0)]
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == COLLECTIVES_TID]
    assert len(slices) == 5          # the unmatched row is not drawn
    recv = next(e for e in slices if e["pid"] == 1 and e["name"].startswith("recv"))
    assert (recv["ts"], recv["dur"]) == (4900.0, 300.0)


@pytest.fixture(scope="module")
def skewed_analysed(tmp_path_factory):
    """A real run (the slow-rank sample) whose rank 1 clock runs 10 s ahead — its trace
    shifted as the damage corpus's ``clock-skew-plus-10s`` case does — analysed from
    scratch by ``meshscope analyze``: the offsets, the instance table and the timeline table
    are the analysis' own, not built here."""
    from damage_corpus import _shift_clock, edit_trace
    run = tmp_path_factory.mktemp("skew-real") / SAMPLE
    shutil.copytree(SAMPLES / SAMPLE, run, ignore=shutil.ignore_patterns("report"))
    edit_trace(run, 1, _shift_clock)
    meshscope("analyze", run, check=True)
    out = run.parent / "skewed.json"
    export(run, out, report_dir=run / "report")
    return run, _load(out)


def _slices(doc: dict, rank: int) -> list[dict]:
    return sorted((e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == rank
                   and e.get("tid") == COLLECTIVES_TID), key=lambda e: e["ts"])


def test_a_clock_10s_ahead_puts_its_collectives_on_its_own_events(exported, skewed_analysed):
    """Rank 1's clock runs 10 s ahead: in the export its collective slices sit on its own
    (aligned) events — each inside the span of rank 1's trace events and overlapping one of
    them — and where the undamaged run has them, within the offset's uncertainty."""
    run, doc = skewed_analysed
    offsets = pd.read_parquet(run / "report" / "clock_offsets.parquet").set_index("rank")
    assert abs(offsets.loc[1, "applied_us"] - SHIFT_US) < 1e3
    original, _ = exported
    for rank in (0, 1):
        events = sorted((e["ts"], e["ts"] + e["dur"]) for e in _x_events(doc, rank))
        lo, hi = events[0][0], max(b for _, b in events)
        slices = _slices(doc, rank)
        assert slices, rank
        for sl in slices:
            a, b = sl["ts"], sl["ts"] + sl["dur"]
            assert lo - 1.0 <= a and b <= hi + 1.0, (rank, sl)
            assert any(x <= b + 1.0 and y >= a - 1.0 for x, y in events), (rank, sl)
        # Against the unshifted sample: the same slices within the estimate's uncertainty.
        before = _slices(original, rank)
        assert len(before) == len(slices)
        tol = float(offsets.loc[1, "uncertainty_us"]) + 1e3
        assert max(abs(x["ts"] - y["ts"]) for x, y in zip(before, slices)) < tol, rank


def test_a_clock_10s_ahead_leaves_the_timeline_page_on_one_axis(skewed_analysed):
    """The timeline page on the same run draws the report's aligned table: rank 1's
    communication, waits and bubble inside its step (on this pipeline the breakdown counts
    all of its exposed communication as bubble, and the page draws the breakdown's sets), its
    wait arrows within the step's axis; without that table it says so (nothing is rebuilt
    from the traces)."""
    from meshscope.dashboard import state as st
    from meshscope.dashboard.data import open_report
    from meshscope.dashboard.pages import timeline
    from meshscope.dashboard.pages.common import PageContext
    from meshscope.dashboard.runs import RunIndex

    run, _ = skewed_analysed
    step = 4
    ctx = PageContext(open_report(RunIndex(run.parent).get(SAMPLE)),
                      st.ViewState(page="timeline", runs=(SAMPLE,), step=step))
    seg, arrows, applied = timeline._segments(ctx, step)
    assert abs(applied[1] - SHIFT_US) < 1e3
    span = float(seg["end_us"].max())
    assert arrows and all(0.0 <= a <= b <= span + 1.0 for _, _, a, b in arrows)
    comm1 = seg[(seg["rank"] == 1) & (seg["kind"] != "compute")]
    assert set(comm1["kind"]) >= {"wait", "bubble"}
    assert comm1["start_us"].min() >= 0.0 and comm1["end_us"].max() <= span + 1.0
    # Nothing is rebuilt from the traces: a report without its timeline table says so.
    older = run.parent / "without-timeline" / SAMPLE
    shutil.copytree(run, older, ignore=shutil.ignore_patterns(".cache", "timeline.parquet"))
    ctx = PageContext(open_report(RunIndex(older.parent).get(SAMPLE)),
                      st.ViewState(page="timeline", runs=(SAMPLE,), step=step))
    assert timeline._segments(ctx, step) is None
    notes = [item for sec in timeline.sections(ctx) for item in sec.items
             if getattr(item, "id", None) == "timeline-none"]
    assert len(notes) == 1 and "timeline.parquet" in notes[0].text


def test_samples_matched_collectives_each_have_a_flow(exported):
    report = SAMPLES / SAMPLE / "report"
    # The shipped reports are past schema 1: they hold the match ids the flows are drawn from
    # (a skip waited for this; issue 52 turned it into an assertion).
    assert (report / "instances.parquet").is_file()
    doc, _ = exported
    coll = pd.read_parquet(report / "collectives.parquet")
    flows = defaultdict(set)
    for e in doc["traceEvents"]:
        if e["ph"] in "stf":
            flows[e["id"]].add(e["pid"])
    chains = Counter(frozenset(v) for v in flows.values())
    want = Counter(frozenset(int(r) for r in str(g).split(",")) for g in coll["pg_ranks"])
    for ranks, n in want.items():
        assert chains[ranks] >= n, sorted(ranks)


def test_a_folder_without_traces_is_one_line_and_exit_2(tmp_path):
    proc = meshscope("export", tmp_path, "--perfetto", tmp_path / "x.json")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"meshscope: error: {tmp_path}: no trace files " \
                                  f"(*.json, *.json.gz) found"


def test_the_report_says_which_clock_each_table_is_on(skewed_analysed):
    """summary.json's table_clocks: the instance table is on the aligned clock — on the
    skewed run, rank 1's instances sit within the other ranks' span, not 10 s after it."""
    run, _ = skewed_analysed
    s = json.loads((run / "report" / "summary.json").read_text())
    assert s["table_clocks"]["instances"] == "aligned"
    inst = pd.read_parquet(run / "report" / "instances.parquet")
    others = inst[inst["rank"] != 1]
    mine = inst[inst["rank"] == 1]
    assert mine["arrival_us"].min() >= others["arrival_us"].min() - 1e6
    assert mine["end_us"].max() <= others["end_us"].max() + 1e6


def test_report_breakdown_thread_is_the_reports_timeline_or_a_note(tmp_path):
    """The export draws the report's own timeline rows (one slice each, on the "report
    breakdown" thread); a report whose timeline table predates the step anchor gets no such
    thread and a note saying why — the segments are never rebuilt from the traces."""
    run = tmp_path / SAMPLE                     # a copy: export writes the report's .cache
    shutil.copytree(SAMPLES / SAMPLE, run, ignore=shutil.ignore_patterns(".cache"))
    seg = pd.read_parquet(run / "report" / "timeline.parquet")
    s = export(run, tmp_path / "a.json", report_dir=run / "report")
    doc = _load(tmp_path / "a.json")
    got = Counter(e["pid"] for e in doc["traceEvents"]
                  if e["ph"] == "X" and e.get("tid") == SEGMENTS_TID)
    assert got == Counter(seg["rank"].astype(int).tolist())
    assert not any("step anchor" in n for n in s.notes)
    old = tmp_path / "old-report"
    shutil.copytree(run / "report", old, ignore=shutil.ignore_patterns(".cache"))
    seg.drop(columns=["step_start_us"]).to_parquet(old / "timeline.parquet", index=False)
    s = export(run, tmp_path / "b.json", report_dir=old)
    doc = _load(tmp_path / "b.json")
    assert not [e for e in doc["traceEvents"] if e.get("tid") == SEGMENTS_TID]
    assert any("step anchor" in n for n in s.notes)
