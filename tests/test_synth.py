"""bench/synth.py: synthetic run directories that the analysis takes as the runner's own.

The traces are read here with plain ``json`` (not meshscope's ingest), and every check is a
relation the generator promises by construction: the schema, gloo's collective semantics (a
group's all-reduce ends on every member at one moment, after its last arrival), causality of
point-to-point transfers, Flight Recorder entries inside their ``c10d::`` calls, and a slow
rank whose compute is longer by the injected amount.
"""
from __future__ import annotations

import collections
import functools
import gzip
import json
import statistics
import sys

import pandas as pd
import pytest

from conftest import ROOT, meshscope
from meshscope.collectors.schema import validate_run_json

sys.path.insert(0, str(ROOT))
from bench.synth import WARMUP_STEPS, make_run  # noqa: E402

EVENTS = 2000
SLOW_MS = 20.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    return {
        "dp": make_run(root / "dp8", ranks=8, events_per_step=EVENTS, slow_rank=5,
                       slow_ms=SLOW_MS),
        "dp_even": make_run(root / "dp8-even", ranks=8, events_per_step=EVENTS),
        "dp_pp": make_run(root / "dp4-pp2", ranks=8, layout="dp=4,pp=2",
                          events_per_step=EVENTS, slow_rank=2, slow_ms=SLOW_MS),
    }


@functools.lru_cache(maxsize=32)
def _trace(run, rank) -> dict:
    return json.loads(gzip.decompress((run / "traces" / f"rank{rank}.json.gz").read_bytes()))


def _complete(trace) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def _steps(run) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(f) for f in sorted((run / "steps").glob("*.parquet"))])


@pytest.mark.parametrize("name", ["dp", "dp_pp"])
def test_directory_is_complete_and_valid(runs, name):
    run = runs[name]
    desc = validate_run_json(run)
    n = desc["world_size"]
    for sub, suffix in (("traces", ".json.gz"), ("steps", ".parquet"), ("comms", ".json")):
        assert sorted(p.name for p in (run / sub).iterdir()) == \
            sorted(f"rank{r}{suffix}" for r in range(n))
    # Every group in run.json is one the traces' distributedInfo names, with the same ranks.
    named = {}
    for r in range(n):
        info = _trace(run, r)["distributedInfo"]
        assert info["rank"] == r and info["world_size"] == n
        for g in info["pg_config"]:
            assert r in g["ranks"] and g["pg_size"] == len(g["ranks"])
            named[g["pg_name"]] = g["ranks"]
    for g in desc["process_groups"]:
        assert named[g["name"]] == g["ranks"]
    steps = _steps(run)
    assert len(steps) == n * desc["steps"]
    assert desc["profile_steps"] == [WARMUP_STEPS, desc["steps"] - 1]


@pytest.mark.parametrize("name", ["dp", "dp_pp"])
def test_events_per_step_as_asked(runs, name):
    trace = _trace(runs[name], 0)
    counted = [e for e in trace["traceEvents"] if e.get("ph") in ("X", "s", "f")]
    profiled = sum(1 for e in counted if e["name"].startswith("ProfilerStep#"))
    assert profiled == 3
    assert abs(len(counted) / profiled - EVENTS) < 0.05 * EVENTS


@pytest.mark.parametrize("name", ["dp", "dp_pp"])
def test_the_shipped_analysis_reads_it_without_problems(runs, name, tmp_path):
    run = runs[name]
    proc = meshscope("analyze", run, "--json", "--out", tmp_path / "report", check=True)
    summary = json.loads(proc.stdout)
    assert summary["ranks"] == list(range(8))
    assert summary["problems"] == [] and summary["missing_ranks"] == []
    assert "warning" not in proc.stderr


def _allreduces(run, rank):
    """(c10d::allreduce_ call, gloo:all_reduce span) pairs of a rank, in order."""
    ev = _complete(_trace(run, rank))
    calls = sorted((e for e in ev if e["name"] == "c10d::allreduce_"), key=lambda e: e["ts"])
    spans = sorted((e for e in ev if e["name"] == "gloo:all_reduce"), key=lambda e: e["ts"])
    assert len(calls) == len(spans)
    return list(zip(calls, spans))


@pytest.mark.parametrize("name", ["dp", "dp_pp"])
def test_collectives_match_across_their_group(runs, name):
    """Same count and sizes on every rank of a dp group; each instance ends at one moment on
    all of them, after the last rank arrived (its c10d call)."""
    run = runs[name]
    desc = json.loads((run / "run.json").read_text())
    dp_groups = [g["ranks"] for g in desc["process_groups"] if g["dimension"] == "dp"]
    for group in dp_groups:
        per_rank = [_allreduces(run, r) for r in group]
        assert len({len(p) for p in per_rank}) == 1 and per_rank[0]
        for instance in zip(*per_rank):
            sizes = {tuple(span["args"]["Input Dims"][0]) for _, span in instance}
            assert len(sizes) == 1
            ends = [span["ts"] + span["dur"] for _, span in instance]
            last_arrival = max(call["ts"] for call, _ in instance)
            assert max(ends) - min(ends) < 0.01          # µs: the same moment
            assert min(ends) > last_arrival


def test_point_to_point_transfers_pair_up_and_respect_causality(runs):
    """Every c10d::send of a stage has the peer's c10d::recv_ (group-local peer in Concrete
    Inputs, as torch records it), and no receive finishes before its send was posted."""
    run = runs["dp_pp"]
    desc = json.loads((run / "run.json").read_text())
    pp_groups = [g["ranks"] for g in desc["process_groups"] if g["dimension"] == "pp"]
    for group in pp_groups:
        sent, received = collections.defaultdict(list), collections.defaultdict(list)
        for local, rank in enumerate(group):
            ev = sorted(_complete(_trace(run, rank)), key=lambda e: e["ts"])
            for i, e in enumerate(ev):
                if e["name"] in ("c10d::send", "c10d::recv_"):
                    peer = group[int(e["args"]["Concrete Inputs"][2])]
                    if e["name"] == "c10d::send":
                        sent[(rank, peer)].append(e["ts"])
                    else:
                        wait = next(w for w in ev[i:] if w["name"] == "gloo:recv")
                        received[(peer, rank)].append(wait["ts"] + wait["dur"])
        assert sent and sorted(sent) == sorted(received)
        for pair, posts in sent.items():
            assert len(posts) == len(received[pair])
            for posted, done in zip(sorted(posts), sorted(received[pair])):
                assert done > posted


@pytest.mark.parametrize("name", ["dp", "dp_pp"])
def test_flight_recorder_agrees_with_the_trace(runs, name):
    """Per group, sequence numbers 1, 2, … on every member; each profiled all-reduce's entry
    was created inside the c10d::allreduce_ call of the trace (clock of baseTimeNanoseconds)."""
    run = runs[name]
    n = json.loads((run / "run.json").read_text())["world_size"]
    seqs = collections.defaultdict(dict)
    for r in range(n):
        dump = json.loads((run / "comms" / f"rank{r}.json").read_text())
        assert dump["schema_version"] == 1 and dump["rank"] == r
        entries = dump["flight_recorder"]["entries"]
        by_group = collections.defaultdict(list)
        for e in entries:
            by_group[tuple(e["process_group"])].append(e["collective_seq_id"])
        for group, ids in by_group.items():
            assert ids == list(range(1, len(ids) + 1))
            seqs[group][r] = ids
        trace = _trace(run, r)
        base_us = trace["baseTimeNanoseconds"] / 1000
        calls = [call for call, _ in _allreduces(run, r)]
        created = [e["time_created_ns"] / 1000 - base_us for e in entries
                   if e["profiling_name"] == "gloo:all_reduce"][-len(calls):]
        for call, t in zip(calls, created):
            assert call["ts"] <= t <= call["ts"] + call["dur"]
    for group, per_rank in seqs.items():   # every member of a group saw the same count
        assert len({len(ids) for ids in per_rank.values()}) == 1


def _compute_per_step_ms(run, rank) -> list[float]:
    """Union of the main thread's cpu_ops per profiled step (ms), from the raw trace."""
    ev = _complete(_trace(run, rank))
    steps = sorted((e for e in ev if e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    ops = sorted(((e["ts"], e["ts"] + e["dur"]) for e in ev
                  if e["cat"] == "cpu_op" and not e["name"].startswith("c10d::")))
    out = []
    for s in steps:
        lo, hi = s["ts"], s["ts"] + s["dur"]
        total, end = 0.0, lo
        for a, b in ops:
            if b <= lo or a >= hi:
                continue
            a = max(a, end)
            if b > a:
                total += b - a
                end = b
        out.append(total / 1000)
    return out


@pytest.mark.parametrize("name, slow", [("dp", 5), ("dp_pp", 2)])
def test_the_slow_rank_computes_slow_ms_more_per_step(runs, name, slow):
    run = runs[name]
    desc = json.loads((run / "run.json").read_text())
    stage_of = {int(r): c["pp"] for r, c in desc["mesh"]["coordinates"].items()}
    peers = [r for r in stage_of if stage_of[r] == stage_of[slow] and r != slow]
    mine = _compute_per_step_ms(run, slow)
    theirs = [statistics.median(col) for col in zip(*(_compute_per_step_ms(run, r)
                                                      for r in peers))]
    for m, t in zip(mine, theirs):
        # The ops cover about 90% of a block's compute time; the rest is the noise (3%).
        assert 0.8 * SLOW_MS < m - t < 1.05 * SLOW_MS


def test_everyone_waits_for_the_slow_rank_in_the_step_timers(runs):
    """Data parallelism makes every rank wait for the slowest at the all-reduce: the whole
    job's profiled steps are longer by about the injected delay than those of the same run
    without it."""
    def profiled_ms(run):
        s = _steps(run)
        return s[s["step"] >= WARMUP_STEPS].groupby("step")["wall_time_us"].median() / 1000

    slow, even = profiled_ms(runs["dp"]), profiled_ms(runs["dp_even"])
    for step in slow.index:
        assert 0.75 * SLOW_MS < slow[step] - even[step] < 1.05 * SLOW_MS


def test_same_arguments_same_bytes(runs, tmp_path):
    again = make_run(tmp_path / "again", ranks=8, events_per_step=EVENTS, slow_rank=5,
                     slow_ms=SLOW_MS, workers=1)
    for sub in ("traces", "comms"):
        for f in (runs["dp"] / sub).iterdir():
            assert (again / sub / f.name).read_bytes() == f.read_bytes(), f.name


def test_unusable_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="has 8 ranks, not 6"):
        make_run(tmp_path / "a", ranks=6, layout="dp=4,pp=2")
    with pytest.raises(ValueError, match="dp and pp only"):
        make_run(tmp_path / "b", ranks=4, layout="tp=4")
    with pytest.raises(ValueError, match="slow_rank 9"):
        make_run(tmp_path / "c", ranks=4, slow_rank=9)
