"""The trust verdict (issue 45, item 1): each check fires on a copy of a real trace damaged in
the one way it looks for — with the count the damage made — and stays silent on the undamaged
original, the shipped samples and every shared GPU set of one rank per job; the checks across
ranks on small tables whose answer is known by construction.

The damaged traces are copies of ``hta/ns_resolution_trace`` (a V100 DDP trace of a world of
one, recorded by HTA's authors: 5 profiled steps, 6,095 device events, every kernel launched
inside the trace), and one rank of the ``dp4-ddp`` sample cut inside its last step.
"""
from __future__ import annotations

import gzip
import json
import pathlib
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, meshscope, shared_trace
from meshscope.analysis.report import reader
from meshscope.analysis.trust import run_checks as rc
from meshscope.analysis.trust.rank_checks import rank_checks
from meshscope.analysis.ingest.validate import Damage

TRACE = "gpu/hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"


def _load(path: pathlib.Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _write(doc: dict, folder: pathlib.Path, name: str) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    return folder


def _kernels(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def _negate(doc: dict) -> int:
    ks = _kernels(doc)[100:110]
    for e in ks:
        e["dur"] = -e["dur"]
    return len(ks)


def _before_launch(doc: dict) -> int:
    """Every kernel moved 1 s earlier: each then starts long before the call that launched
    it (no GPU queue is a second deep)."""
    ks = _kernels(doc)
    for e in ks:
        e["ts"] -= 1_000_000
    return len(ks)


def _third_removed(doc: dict) -> int:
    ks = _kernels(doc)
    gone = {id(e) for e in ks[::3]}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if id(e) not in gone]
    return len(gone)


def _far_future(doc: dict) -> int:
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 1e18
    return 1


def _step(doc: dict, n: int) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("name") == f"ProfilerStep#{n}")


def _thirty_seconds(doc: dict) -> int:
    """One operator inside step 103 made to last 30 s."""
    st = _step(doc, 103)
    op = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"
              and st["ts"] < e["ts"] < st["ts"] + st["dur"] / 2)
    op["dur"] = 30e6
    return 1


def _buffer_full(doc: dict) -> int:
    """Every device event from the middle of the last step on removed, as when the
    profiler's activity buffer fills: the host goes on launching, the device's record stops."""
    st = _step(doc, 105)
    cut = st["ts"] + st["dur"] / 2
    gone = [e for e in doc["traceEvents"]
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["ts"] > cut]
    ids = {id(e) for e in gone}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if id(e) not in ids]
    return len(gone)


DAMAGES = {"original": (lambda doc: 0, None, None),
           "buffer-full": (_buffer_full, "cut-short", "caveat"),
           "negated": (_negate, "bad-durations", "caveat"),
           "before-launch": (_before_launch, "launch-skew", "untrustworthy"),
           "third-removed": (_third_removed, "dropped-activity", "untrustworthy"),
           "far-future": (_far_future, "timestamp-precision", "untrustworthy"),
           "thirty-seconds": (_thirty_seconds, "over-long", "untrustworthy")}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """Each damage applied to its own copy and analysed through the CLI (``--json``): name →
    (how many events it damaged, the summary, the text the CLI prints)."""
    src = shared_trace(TRACE)
    root = tmp_path_factory.mktemp("damaged")
    out = {}
    for name, (damage, _, _) in DAMAGES.items():
        doc = _load(src)
        n = damage(doc)
        folder = _write(doc, root / name, src.name)
        proc = meshscope("analyze", folder, "--json")
        assert proc.returncode == 0, (name, proc.stderr[-1500:])
        text = meshscope("analyze", folder)
        out[name] = (n, reader.read_summary(json.loads(proc.stdout)), text.stdout)
    return out


def test_the_undamaged_original_is_trusted(damaged):
    _, s, text = damaged["original"]
    assert s.trust.verdict == "trusted" and s.trust.caveats == []
    assert [r.verdict for r in s.trust.ranks] == ["trusted"]
    # every check of a GPU rank ran (the four across ranks have one rank to look at)
    assert len(s.trust.checked) == 12
    assert "evidence: trusted" in text


@pytest.mark.parametrize("name", [k for k, v in DAMAGES.items() if v[1]])
def test_each_damage_is_named_with_its_count_and_what_it_affects(damaged, name):
    n, s, text = damaged[name]
    _, check, severity = DAMAGES[name]
    caveat = next(c for c in s.trust.caveats if c.check == check)
    assert caveat.severity == severity
    worst = "untrustworthy" if any(c.severity == "untrustworthy" for c in s.trust.caveats) \
        else "caveat"
    assert s.trust.verdict == {"caveat": "usable with caveats",
                               "untrustworthy": "not trustworthy"}[worst]
    assert caveat.ranks == [0] and caveat.affects and caveat.text.startswith("rank 0: ")
    if name == "negated":
        assert caveat.count == n                          # the ten negated kernels
    elif name == "before-launch":
        assert caveat.count >= 0.99 * n and caveat.size_us >= 0.9e6   # ~1 s before launch
    elif name == "third-removed":
        # each removed kernel's launch is left without a kernel (the last few after the last
        # recorded kernel excepted): about a third of the kernel launches
        assert 0.95 * n <= caveat.count <= n and 25.0 <= caveat.share_pct <= 40.0
    elif name == "far-future":
        assert caveat.size_us == float(np.spacing(1e18))   # 128 µs: float64's step there
    elif name == "buffer-full":
        assert caveat.steps == [105] and caveat.size_us > 1_000.0 and "buffer" in caveat.text
    elif name == "thirty-seconds":
        assert caveat.count == 1 and caveat.steps == [103]
        assert caveat.size_us > 29e6                          # 30 s less what the step held
    # the text's head says it, with the numbers it affects, and marks the rank's rows
    head = text.split("\nPer rank")[0]
    assert f"[{severity}] {check}" in head and "affects" in head
    assert "\n     0" + ("†" if worst == "caveat" else "‡") in text
    # the other checks stay silent: each damage is one kind
    others = {c.check for c in s.trust.caveats} - {check}
    if name == "thirty-seconds":
        others -= {"cut-short"}         # the 30 s operator outlasts the trace's last step
    if name == "negated":               # the dropped kernels leave their launches alone
        lost = next(c for c in s.trust.caveats if c.check == "dropped-activity")
        assert lost.count == n
        others -= {"dropped-activity"}
    if name == "buffer-full":           # the kernels queued at the cut lost theirs too
        others -= {"dropped-activity"}
    if name == "far-future":            # times rounded to 128 µs: kernels seem to overlap,
        others -= {"stream-overlap", "zero-durations", "launch-skew", "over-long"}  # etc.
    assert not others, others


def test_a_finding_on_damaged_numbers_says_so(damaged):
    """Removing a third of the kernels damages every GPU-idle number: a finding resting on
    them names the check; the same finding on the original names none."""
    _, s, text = damaged["third-removed"]
    idle = [f for f in s.findings if f.id in ("gpu-idle", "sync-stall", "launch-bound",
                                              "data-loading-stall")]
    assert idle, [f.id for f in s.findings]
    assert all("dropped-activity" in f.caveats for f in idle)
    assert "rests on evidence that failed: dropped-activity" in text
    assert all(not f.caveats for f in damaged["original"][1].findings)


@pytest.fixture(scope="module")
def cut_sample(tmp_path_factory):
    """The dp4-ddp sample with rank 2's trace cut a third into its last profiled step (its
    ProfilerStep range kept whole, as a writer killed mid-step leaves the ranges it had
    opened): analysed through the CLI."""
    root = tmp_path_factory.mktemp("cut") / "dp4-ddp"
    shutil.copytree(ROOT / "samples" / "dp4-ddp", root, ignore=shutil.ignore_patterns("report"))
    path = root / "traces" / "rank2.json.gz"
    doc = _load(path)
    last = max((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith(
        "ProfilerStep#")), key=lambda e: e["ts"])
    cut = last["ts"] + last["dur"] / 3
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if e is last or not isinstance(e.get("ts"), (int, float))
                          or e["ts"] <= cut]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    proc = meshscope("analyze", root, "--json")
    assert proc.returncode == 0, proc.stderr[-1500:]
    return int(last["name"].split("#")[1]), reader.read_summary(json.loads(proc.stdout))


def test_a_rank_cut_inside_its_last_step(cut_sample):
    step, s = cut_sample
    cut = next(c for c in s.trust.caveats if c.check == "cut-short")
    assert cut.ranks == [2] and cut.steps == [step] and cut.severity == "caveat"
    assert {r.rank: r.verdict for r in s.trust.ranks} == {
        0: "trusted", 1: "trusted", 2: "usable with caveats", 3: "trusted"}
    assert s.trust.verdict in ("usable with caveats", "not trustworthy")


def test_every_shipped_sample_is_trusted():
    for folder in sorted((ROOT / "samples").glob("*/report")):
        s = reader.read_summary(json.loads((folder / "summary.json").read_text()))
        assert s.trust is not None, folder
        assert s.trust.verdict == "trusted", (folder, s.trust.caveats)
        assert all(r.verdict == "trusted" for r in s.trust.ranks)


# slow: it reads conftest.real_gpu_sets, the session's analysis of every corpus set, which the
# slow tests share (make test runs those in a pytest run of their own, after the others)
@pytest.mark.slow
def test_every_shared_gpu_set_has_a_verdict_and_whole_jobs_of_one_rank_are_trusted(
        real_gpu_sets):
    """Every set gets a verdict; a set that is the whole job (world size 1, or none stated) is
    trusted; one rank of a larger job is usable with caveats, the missing ranks named — and
    no check of its own trace fails (these are healthy recordings)."""
    _, printed = real_gpu_sets
    for name, doc in printed.items():
        if doc is None:
            continue
        s = reader.read_summary(doc)
        assert s.trust is not None, name
        assert all(r.verdict == "trusted" for r in s.trust.ranks), (name, s.trust.caveats)
        worlds = s.environment.world_sizes
        if not worlds or worlds == [1]:
            assert s.trust.verdict == "trusted", (name, s.trust.caveats)
        else:
            assert [c.check for c in s.trust.caveats] == ["missing-ranks"], name
            missing = s.trust.caveats[0]
            assert missing.of == max(worlds) and missing.count == max(worlds) - len(s.ranks)


# -- the checks on hand-made inputs whose answer is known by construction ------------------

def _events(rows: list[tuple]) -> pd.DataFrame:
    """(name, cat, ts_us, dur_us, lane, device, correlation) rows as an event table."""
    df = pd.DataFrame(rows, columns=["name", "cat", "ts_us", "dur_us", "lane", "device",
                                     "correlation"])
    return df.assign(end_us=df["ts_us"] + df["dur_us"])


def _two_steps_of_kernels(overlap_us: float = 0.0, zero: int = 0) -> pd.DataFrame:
    """Two 1 ms steps; in each, ten launches 100 µs apart and their 90 µs kernels on one
    stream 20 µs after (10 µs between kernels); the second kernel of step 1 starts
    ``overlap_us`` early, the first ``zero`` kernels last 0 µs."""
    rows = [("ProfilerStep#1", "user_annotation", 0.0, 1000.0, "cpu:1:1", False, -1),
            ("ProfilerStep#2", "user_annotation", 1000.0, 1000.0, "cpu:1:1", False, -1)]
    c = 0
    for base in (0.0, 1000.0):
        for i in range(10):
            c += 1
            t = base + 100.0 * i
            rows.append(("cudaLaunchKernel", "cuda_runtime", t, 5.0, "cpu:1:1", False, c))
            start = t + 20.0 - (overlap_us if c == 2 else 0.0)
            rows.append((f"k{c}", "kernel", start, 0.0 if c <= zero else 90.0, "gpu:0:7",
                         True, c))
    return _events(rows)


STEPS = {1: (0.0, 1000.0), 2: (1000.0, 2000.0)}


def _fired(events: pd.DataFrame) -> dict:
    return {m.check.value: m for m in rank_checks(0, events, Damage(), STEPS) if m.failed}


def test_hand_made_healthy_rank_passes_every_check():
    assert _fired(_two_steps_of_kernels()) == {}


def test_stream_overlap_counts_the_overlap_and_grades_it_by_share_of_busy_time():
    small = _fired(_two_steps_of_kernels(overlap_us=15.0))     # 5 µs of 1,800: 0.3% — passes
    assert small == {}
    big = _fired(_two_steps_of_kernels(overlap_us=40.0))       # 30 µs over k1's end: 1.7%
    m = big["stream-overlap"]
    assert m.count == 1 and m.size_us == pytest.approx(30.0) and m.severity == "caveat"
    # 40 µs early also puts k2 20 µs before its launch: the clocks disagree there too
    assert big["launch-skew"].count == 1 and big["launch-skew"].size_us == pytest.approx(20.0)


def test_zero_length_kernels_are_a_caveat_only_when_they_could_hide_enough():
    assert "zero-durations" not in _fired(_two_steps_of_kernels(zero=2))   # 2 µs of 1,620
    m = _fired(_two_steps_of_kernels(zero=12))["zero-durations"]            # 12 µs of 720
    assert m.count == 12 and m.severity == "caveat"


def test_a_step_cut_short_on_its_last_step():
    ev = _two_steps_of_kernels()
    ev = ev[(ev["ts_us"] < 1300.0) | (ev["name"] == "ProfilerStep#2")]
    m = _fired(ev)["cut-short"]
    assert m.steps == (2,) and m.severity == "caveat" and m.size_us > 500.0


def _instances(counts: dict[int, int], group: str = "0,1,2,3") -> pd.DataFrame:
    rows = [{"rank": r, "step": 1, "op": "all_reduce", "p2p": False, "pg_ranks": group}
            for r, n in counts.items() for _ in range(n)]
    return pd.DataFrame(rows)


def _breakdown(steps: dict[int, list[int]]) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r, "step": s} for r, ss in steps.items() for s in ss])


NO_OFFSETS = pd.DataFrame(columns=["rank", "offset_us", "uncertainty_us", "applied_us"])


def _run_fired(**kw) -> dict:
    args = {"ranks": [0, 1, 2, 3], "world_size": 4,
            "breakdown": _breakdown({r: [1, 2] for r in range(4)}),
            "instances": _instances({r: 3 for r in range(4)}), "offsets": NO_OFFSETS,
            "step_us": 10_000.0} | kw
    return {m.check.value: m for m in rc.run_checks(**args) if m.failed}


def test_checks_across_ranks_pass_on_a_healthy_world():
    assert _run_fired() == {}


def test_missing_ranks_and_different_steps():
    m = _run_fired(ranks=[0, 1, 3], world_size=4)["missing-ranks"]
    assert m.ranks == (2,) and m.count == 1 and m.of == 4
    d = _run_fired(breakdown=_breakdown({0: [1, 2], 1: [1, 2], 2: [1, 2], 3: [2, 3]}))
    assert d["different-steps"].ranks == (3,) and d["different-steps"].steps == (1, 3)


def test_collective_counts_differ_within_a_group():
    m = _run_fired(instances=_instances({0: 3, 1: 3, 2: 2, 3: 3}))["collective-counts"]
    assert m.ranks == (2,)
    # two groups of two, each even within itself: no caveat though their counts differ
    even = pd.concat([_instances({0: 3, 1: 3}, "0,1"), _instances({2: 5, 3: 5}, "2,3")])
    assert "collective-counts" not in _run_fired(instances=even)


def test_clock_offsets_corrected_and_graded_by_their_uncertainty():
    offsets = pd.DataFrame({"rank": [0, 1, 2], "offset_us": [0.0, 500.0, 40.0],
                            "uncertainty_us": [0.0, 100.0, 30.0],
                            "applied_us": [0.0, 500.0, 0.0]})
    m = _run_fired(offsets=offsets)["clock-offsets"]
    assert m.ranks == (1,) and m.size_us == 500.0 and m.severity == "caveat"
    unsure = offsets.assign(uncertainty_us=[0.0, 2_000.0, 30.0])    # 20% of a 10 ms step
    assert _run_fired(offsets=unsure)["clock-offsets"].severity == "untrustworthy"


def test_a_report_written_before_the_checks_says_it_was_not_checked():
    """Schema 4 had no trust verdict: it reads as not checked — never as trusted."""
    from meshscope.analysis.report.model import trust_headline as headline

    doc = json.loads((pathlib.Path(__file__).parent / "data" / "summaries" /
                      "v4-dp2-pp2-slow-rank1.json").read_text())
    s = reader.read_summary(doc)
    assert s.schema_version == 4 and s.trust is None
    assert headline(s.trust).startswith("evidence not checked")
    assert all(f.cites == [] and f.caveats == [] for f in s.findings)
