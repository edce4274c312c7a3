"""Ingest: rank from the file name, the parquet cache, parallel ingest, collective metadata."""
import collections
import gzip
import io
import json
import math
import pathlib
import shutil
import time

import pandas as pd
import pytest

from meshscope.analysis.ingest import event_table
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import pool as ingest_pool
from meshscope.analysis.ingest import start_method
from meshscope.analysis.ingest import cache as trace_cache
from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest.progress import Progress
from conftest import ROOT, meshscope, shared_trace

SAMPLE = ROOT / "samples" / "dp2-pp2-1f1b" / "traces"
NO_INFO = "gpu/hta/distributed_info_unavailable/distributed_info_not_found.json.gz"
NCCL_DATA = "gpu/hta/nccl_parser_config/nccl_data.json.gz"


def _raw_events(path):
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


# --- rank -------------------------------------------------------------------------------

def test_rank_regex(tmp_path):
    trace = tmp_path / "node-a.gpu5.json.gz"
    shutil.copy(shared_trace(NO_INFO), trace)
    # Nothing names a rank: ingest reads it as rank 0 and says so; the analysis refuses it
    # when it is one of several files (tests/test_ingest_formats.py).
    alone = ingest.load_trace(trace)
    assert alone.rank == 0 and alone.meta[ingest.RANKLESS_KEY] is True
    assert any("read as rank 0" in n for n in alone.notes)
    assert ingest.load_trace(trace, rank_regex=r"gpu(\d+)").rank == 5
    with pytest.raises(InputError, match="does not match --rank-regex"):
        ingest.load_trace(trace, rank_regex=r"worker(\d+)")
    with pytest.raises(ValueError, match="exactly one group"):
        ingest.load_trace(trace, rank_regex=r"(gpu)(\d+)")
    with pytest.raises(ValueError, match="not a regular expression"):
        ingest.load_trace(trace, rank_regex=r"gpu(\d+")


def test_distributed_info_comes_first_but_rank_regex_before_it(tmp_path):
    """Without --rank-regex a trace is the rank its distributedInfo says (whatever its name);
    with it, the name's rank (the user's choice), and the disagreement is named."""
    trace = tmp_path / "gpu7.rank3.json.gz"
    shutil.copy(shared_trace(NCCL_DATA), trace)
    assert ingest.load_trace(trace).rank == 0
    got = ingest.load_trace(trace, rank_regex=r"gpu(\d+)")
    assert got.rank == 7
    assert got.problems == [f"{trace}: distributedInfo.rank is 0, but its name says rank 7 "
                            f"(--rank-regex): read as rank 7"]
    assert ingest.load_trace(trace, rank_regex=r"node(\d+)").rank == 0, "no match: info"


def test_cli_rank_regex(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(shared_trace(NO_INFO), folder / "host1-gpu3.json.gz")
    # One file without a rank is rank 0 (tests/test_ingest_formats.py); two are refused.
    proc = meshscope("analyze", folder, "--json", check=True)
    assert json.loads(proc.stdout)["ranks"] == [0]
    shutil.copy(shared_trace(NO_INFO), folder / "host1-gpu4.json.gz")
    proc = meshscope("analyze", folder, "--json")
    assert proc.returncode == 2 and "--rank-regex" in proc.stderr
    assert "Traceback" not in proc.stderr
    (folder / "host1-gpu4.json.gz").unlink()
    proc = meshscope("analyze", folder, "--json", "--rank-regex", r"gpu(\d+)", check=True)
    assert json.loads(proc.stdout)["ranks"] == [3]
    proc = meshscope("analyze", folder, "--rank-regex", "gpu")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "exactly one group" in lines[0]


# --- cache ------------------------------------------------------------------------------

def _entries(cache) -> list:
    """The cache's event tables (each has its [memory] events' table beside it,
    ``<key>.memory.parquet``)."""
    return sorted(p for p in cache.glob("*.parquet") if not p.name.endswith(".memory.parquet"))


def test_cache_hit_is_identical_and_skips_parsing(tmp_path):
    src = SAMPLE / "rank0.json.gz"
    cache = tmp_path / "cache"
    fresh = ingest.load_trace(src)
    before = ingest.PARSE_COUNT
    first = ingest.load_trace(src, cache_dir=cache)
    assert ingest.PARSE_COUNT == before + 1
    entries = _entries(cache)
    assert len(entries) == 1
    pair = sorted(cache.glob("*"))
    assert pair == sorted([entries[0], trace_cache.memory_entry(cache, entries[0].stem)])
    mtimes = [p.stat().st_mtime_ns for p in pair]
    second = ingest.load_trace(src, cache_dir=cache)
    assert ingest.PARSE_COUNT == before + 1, "a cache hit must not parse the JSON"
    assert [p.stat().st_mtime_ns for p in pair] == mtimes and sorted(cache.glob("*")) == pair
    for other in (first, second):
        pd.testing.assert_frame_equal(other.events, fresh.events, check_exact=True)
        pd.testing.assert_frame_equal(other.memory, fresh.memory, check_exact=True)
        assert other.meta == fresh.meta and other.rank == fresh.rank == 0


def test_a_cache_entry_is_on_disk_before_its_rename(tmp_path):
    """Atomic is not durable: a rename changes the folder only. A load that stores its tables,
    watched by ``strace``: each temporary file is flushed (``fsync``) before the rename that
    puts it in place — the [memory] events' table before the event table, so an event table
    in place always has it — and the cache folder after both."""
    import sys

    from syscalls import fs_calls

    cache = tmp_path / "cache"
    script = ("import pathlib, sys\n"
              "from meshscope.analysis.ingest import events\n"
              "events.load_trace(pathlib.Path(sys.argv[1]), cache_dir=pathlib.Path(sys.argv[2]))")
    calls = fs_calls([sys.executable, "-c", script, str(SAMPLE / "rank0.json.gz"), str(cache)],
                     tmp_path / "strace.log")
    entries = _entries(cache)
    memory = trace_cache.memory_entry(cache, entries[0].stem)
    assert len(entries) == 1 and sorted(cache.iterdir()) == sorted([entries[0], memory])
    renames = []
    for dest in (memory, entries[0]):
        put = [i for i, c in enumerate(calls) if c[0] == "rename" and c[2] == str(dest)]
        assert len(put) == 1, calls
        tmp = calls[put[0]][1]
        assert pathlib.Path(tmp).parent == cache and pathlib.Path(tmp).name.startswith(".tmp-")
        assert ("fsync", tmp) in calls[:put[0]]
        renames.append(put[0])
    assert renames[0] < renames[1]
    assert ("fsync", str(cache)) in calls[renames[1] + 1:]


def test_cache_key_follows_content_and_settings(tmp_path):
    trace = tmp_path / "rank0.json"
    trace.write_bytes(gzip.decompress((SAMPLE / "rank0.json.gz").read_bytes()))
    cache = tmp_path / "cache"
    a = ingest.load_trace(trace, cache_dir=cache)
    ingest.load_trace(trace, cache_dir=cache, comm_kernel_re=__import__("re").compile("x"))
    assert len(_entries(cache)) == 2                        # another pattern, another entry
    doc = json.loads(trace.read_text())
    doc["traceEvents"] = doc["traceEvents"][:-100]
    trace.write_text(json.dumps(doc))
    b = ingest.load_trace(trace, cache_dir=cache)
    assert len(_entries(cache)) == 3                        # edited file, new entry
    assert len(b.events) < len(a.events)


def test_bad_cache_is_ignored(tmp_path):
    src = SAMPLE / "rank1.json.gz"
    cache = tmp_path / "cache"
    good = ingest.load_trace(src, cache_dir=cache)
    (entry,) = _entries(cache)
    entry.write_bytes(b"not parquet")
    before = ingest.PARSE_COUNT
    again = ingest.load_trace(src, cache_dir=cache)
    assert ingest.PARSE_COUNT == before + 1
    trace_cache.memory_entry(cache, entry.stem).unlink()    # an event table without its pair
    before = ingest.PARSE_COUNT
    assert len(ingest.load_trace(src, cache_dir=cache).events) == len(good.events)
    assert ingest.PARSE_COUNT == before + 1
    pd.testing.assert_frame_equal(again.events, good.events)
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would go")
    assert len(ingest.load_trace(src, cache_dir=blocker / "cache").events) == len(good.events)
    assert trace_cache.read(tmp_path / "nowhere", "0" * 40) is None


def test_cli_cache_and_no_cache(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run)
    shutil.rmtree(run / "report")
    out1 = meshscope("analyze", run, "--json", "--no-cache", check=True)
    assert not list((run / "report" / ".cache").glob("*.parquet")), "no event table kept"
    (run / "report" / ".cache" / "report.key").unlink()     # the report itself is not reused
    meshscope("analyze", run, "--json", check=True)
    entries = sorted((run / "report" / ".cache").glob("*.parquet"))
    assert len(_entries(run / "report" / ".cache")) == 4 and len(entries) == 8
    mtimes = [e.stat().st_mtime_ns for e in entries]
    out3 = meshscope("analyze", run, "--json", check=True)
    assert [e.stat().st_mtime_ns for e in entries] == mtimes
    s1, s3 = json.loads(out1.stdout), json.loads(out3.stdout)
    s1.pop("generated"), s3.pop("generated")
    assert s1 == s3


def test_a_cached_trace_is_refused_under_a_lower_budget(tmp_path, monkeypatch):
    """A budget refuses a trace while it is read; a table cached by a reading under the
    default budgets is not taken instead (it was, until the budgets joined the cache key):
    read again with an event budget below its count, the trace is refused as a first reading
    is, and the cache entry made under the defaults is used again afterwards."""
    from meshscope.analysis.ingest import budgets

    for var in budgets.ENV.values():
        monkeypatch.delenv(var, raising=False)
    trace = sorted(SAMPLE.glob("*.json.gz"))[0]
    cache = tmp_path / "cache"
    first = ingest.load_trace(trace, cache_dir=cache)
    count = len(first.events)
    assert count > 100 and len(_entries(cache)) == 1
    monkeypatch.setenv(budgets.ENV["events"], "100")
    for cache_dir in (None, cache):                  # a first reading, and one with a cache
        with pytest.raises(InputError, match=r"more than 100 events.*--max-events") as e:
            ingest.load_trace(trace, cache_dir=cache_dir)
        assert str(trace) in str(e.value)
    monkeypatch.delenv(budgets.ENV["events"])
    parsed = ingest.PARSE_COUNT
    again = ingest.load_trace(trace, cache_dir=cache)
    assert ingest.PARSE_COUNT == parsed and len(again.events) == count


# --- parallel ingest --------------------------------------------------------------------

def test_parallel_ingest_keeps_file_order(tmp_path):
    files = sorted(SAMPLE.glob("*.json.gz"))
    broken = tmp_path / "rank9.json"
    broken.write_text('{"traceEvents": [')
    files = files[:2] + [broken] + files[2:]
    got = list(ingest_pool.load_traces(files, workers=2))
    assert [f for f, _ in got] == files
    assert isinstance(got[2][1], str) and "rank9.json" in got[2][1] and "truncated" in got[2][1]
    ranks = [r.rank for _, r in got if not isinstance(r, str)]
    assert ranks == [0, 1, 2, 3]
    serial = ingest.load_trace(files[3])
    pd.testing.assert_frame_equal(got[3][1].events, serial.events)
    assert ingest_pool.worker_count(1) == 1 and ingest_pool.worker_count(64, 2) == 2


_REAL_LOAD = ingest_pool._load


def _dies_in_a_worker(path, *job):
    """``_load`` that kills the worker process that gets rank1's file (a worker, forked or
    started by the fork server, has a multiprocessing parent; this test's process has none)."""
    import multiprocessing
    import os

    if multiprocessing.parent_process() is not None and path.name == "rank1.json.gz":
        os._exit(9)
    return _REAL_LOAD(path, *job)


def test_parallel_ingest_beside_other_threads_and_dying_workers(monkeypatch):
    """With other threads running, workers come from a fork server; a worker that dies leaves
    its files to be read in this process."""
    import threading

    files = sorted(SAMPLE.glob("*.json.gz"))
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert start_method.context().get_start_method() != "fork"
        got = list(ingest_pool.load_traces(files, workers=2))
    finally:
        stop.set()
        thread.join()
    assert [r.rank for _, r in got] == [0, 1, 2, 3]

    monkeypatch.setattr(ingest_pool, "_load", _dies_in_a_worker)
    got = list(ingest_pool.load_traces(files, workers=2))
    assert [f for f, _ in got] == files and [r.rank for _, r in got] == [0, 1, 2, 3]


def test_progress_only_on_a_terminal_after_the_delay():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    with Progress(3, "quiet", stream=io.StringIO(), delay_s=0) as bar:
        time.sleep(0.05)
        bar.advance()
        assert not bar.shown                                 # not a terminal
    tty = Tty()
    with Progress(3, "fast", stream=tty, delay_s=5) as bar:
        bar.advance(3)
    assert not bar.shown and tty.getvalue() == ""           # done before the delay
    with Progress(3, "slow", stream=tty, delay_s=0.01) as bar:
        # The bar is drawn by a timer thread that first imports rich: on a busy machine that
        # takes longer than any fixed sleep, so wait for it (bounded) rather than hope.
        deadline = time.monotonic() + 60
        while not bar.shown and time.monotonic() < deadline:
            time.sleep(0.01)
        bar.advance()
        assert bar.shown
    assert tty.getvalue()


# --- collective metadata ----------------------------------------------------------------

def test_collective_metadata_on_nccl_trace():
    path = shared_trace(NCCL_DATA)
    ev = ingest.load_trace(path).events
    kernels = ev[(ev["cat"] == "kernel") & ev["coll_name"].notna()]
    assert collections.Counter(kernels["coll_name"]) == {"allreduce": 15, "broadcast": 6}
    assert kernels["name"].str.startswith("ncclKernel_").all()
    rpc = ev[ev["name"] == "record_param_comms"]
    assert collections.Counter(rpc["coll_name"]) == {"allreduce": 15, "broadcast": 6, "wait": 6}
    comm = pd.concat([kernels, rpc[rpc["coll_name"] != "wait"]])
    assert (comm["pg_ranks"] == "0,1").all() and (comm["group_size"] == 2).all()
    assert (comm["pg_name"] == "0").all() and (comm["pg_desc"] == "default_pg").all()
    assert (comm["seq"] == -1).all()                        # this torch wrote no "Seq"
    # msg_bytes against the raw arguments, read here independently of ingest.
    sizes = {"Float": 4, "Long": 8, "Int": 4, "Byte": 1}
    raw = [e for e in _raw_events(path) if e.get("ph") == "X" and e.get("cat") == "kernel"
           and "Collective name" in e.get("args", {})]
    want = sorted(max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"])
                  * sizes[e["args"]["dtype"]] for e in raw)
    assert sorted(kernels["msg_bytes"].astype(int)) == want
    assert ev.loc[ev["coll_name"].isna(), ["msg_bytes", "group_size"]].isna().all().all()
    assert (ev.loc[ev["coll_name"].isna(), "seq"] == -1).all()


def test_all_gather_bytes_are_the_gathered_size():
    """vLLM on 8 B200s: one _allgather_base of bf16, 25136 elements in, 201088 out."""
    ev = ingest.load_trace(shared_trace("gpu/tracelens/traces/b200/eager_trace.json.gz")).events
    k = ev[(ev["cat"] == "kernel") & ev["coll_name"].notna()].iloc[0]
    assert (k["coll_name"], k["dtype"], k["in_nelems"], k["out_nelems"]) == \
        ("_allgather_base", "bfloat16", 25136, 201088)
    assert k["msg_bytes"] == 201088 * 2 and k["group_size"] == 8
    assert (k["pg_name"], k["pg_desc"], k["pg_ranks"]) == ("3", "undefined", "0,1,2,3,4,5,6,7")


def test_collective_metadata_on_gloo_trace():
    path = SAMPLE / "rank0.json.gz"
    ev = ingest.load_trace(path).events
    gloo = ev[ev["name"] == "gloo:all_reduce"]
    assert len(gloo) > 0 and (gloo["coll_name"] == "all_reduce").all()
    assert (gloo["dtype"] == "float32").all() and gloo["group_size"].isna().all()
    raw = [e for e in _raw_events(path) if e.get("name") == "gloo:all_reduce"]
    want = [math.prod(e["args"]["Input Dims"][0]) for e in raw]
    assert list(gloo["in_nelems"]) == want and list(gloo["msg_bytes"]) == [4 * n for n in want]
    p2p = ev[ev["name"].isin(["gloo:send", "gloo:recv"])]
    assert set(p2p["coll_name"]) == {"send", "recv"} and (p2p["msg_bytes"] == 2 * 64 * 64 * 4).all()
    assert ev.loc[ev["name"].str.startswith("c10d::"), "coll_name"].isna().all()


def _write(path, doc, deep_marker=None):
    text = json.dumps(doc)
    if deep_marker:
        text = text.replace(json.dumps(deep_marker), "[" * 50_000 + "]" * 50_000)
    path.write_bytes(gzip.compress(text.encode(), 1))
    return path


def test_damaged_events_are_dropped_counted_and_named(tmp_path, monkeypatch):
    """Rank 1 of the sample with hand-made damage, each kind on known events: the table is the
    undamaged one without exactly the dropped events, and the problems count each kind. (The
    nesting budget is raised past the decoder's limit, so that the deep event reaches it: at
    the default budget the whole file is refused, ``tests/test_json_stream.py``.)"""
    from meshscope.analysis.ingest import budgets
    monkeypatch.setenv(budgets.ENV["nesting"], str(1_000_000))
    src = SAMPLE / "rank1.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X"
           and str(e.get("name")).startswith("aten::")]
    gloo = [e for e in doc["traceEvents"] if str(e.get("name")).startswith("gloo:")]
    victims = {"no ts": ops[0:3], "negative dur": ops[3:5], "name 42": ops[5:6],
               "dur 1e300": ops[6:7], "ts 1e300": ops[7:8], "deep": ops[8:9]}
    dropped = {(e["name"], e["ts"]) for es in victims.values() for e in es}
    for e in victims["no ts"]:
        e.pop("ts")
    for e in victims["negative dur"]:
        e["dur"] = -2.5
    victims["name 42"][0]["name"] = 42
    victims["dur 1e300"][0]["dur"] = 1e300
    victims["ts 1e300"][0]["ts"] = 1e300
    victims["deep"][0].setdefault("args", {})["x"] = "DEEP"
    ops[20].setdefault("args", {})["correlation"] = 2**70          # ignored, event kept
    gloo[0]["args"]["Input Dims"] = [[2**40, 2**40]]               # 2^80 elements: ignored
    doc["traceEvents"].insert(3, "not an event")
    trace = ingest.load_trace(_write(tmp_path / "rank1.json.gz", doc, "DEEP"))
    base = ingest.load_trace(src).events
    keep = [(n, t) not in dropped for n, t in zip(base["name"], base["ts_us"])]
    want = base[keep].reset_index(drop=True)
    got = trace.events
    assert len(got) == len(base) - 9
    pd.testing.assert_frame_equal(got.drop(columns=["in_nelems", "msg_bytes", "correlation"]),
                                  want.drop(columns=["in_nelems", "msg_bytes", "correlation"]))
    assert got.loc[got["name"] == gloo[0]["name"], "in_nelems"].isna().sum() == 1
    name = str(tmp_path / "rank1.json.gz")
    assert sorted(trace.problems) == sorted([
        f"{name}: ts: 3 events dropped (missing)",
        f"{name}: dur: 2 events dropped (a negative duration)",
        f"{name}: name: 1 event dropped (not a string)",
        f"{name}: dur: 1 event dropped (a duration longer than the trace)",
        f"{name}: ts: 1 event dropped (a start time outside the trace's span)",
        f"{name}: traceEvents: 1 event dropped (nested deeper than the decoder's limit)",
        f"{name}: traceEvents: 1 event dropped (an element that is not an object)",
        f"{name}: args.correlation: ignored in 1 event (not an integer within 64 bits)",
        f"{name}: args.Input Dims: ignored in 1 event (a negative dimension or more than "
        f"2^63-1 elements)"])


def test_a_trace_losing_more_than_five_percent_is_refused(tmp_path):
    doc = json.loads(gzip.decompress((SAMPLE / "rank0.json.gz").read_bytes()))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    for e in xs[: len(xs) // 10]:                                  # 10% without a duration
        e.pop("dur")
    with pytest.raises(InputError, match=r"too damaged to analyse: (\d|,)+ of (\d|,)+ events "
                                         r"unusable; dur: missing"):
        ingest.load_trace(_write(tmp_path / "rank0.json.gz", doc))
    for e in xs:
        e["dur"] = -1
    with pytest.raises(InputError, match="no complete .* events left: dur: a negative duration"):
        ingest.load_trace(_write(tmp_path / "rank0.json.gz", doc))


def test_odd_events_are_skipped_and_counted(tmp_path):
    trace = tmp_path / "rank0.json"
    good = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 + i,
             "dur": 5} for i in range(60)]
    trace.write_text(json.dumps({"traceEvents": good + [
        "not an event",
        {"ph": "X", "cat": "cpu_op", "name": "odd args", "pid": 1, "tid": 1, "ts": 11,
         "dur": 1, "args": ["a", "list"]},
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 12, "dur": 3,
         "args": {"device": 0, "stream": 7, "correlation": 42}},
        {"ph": "i", "name": "instant", "ts": 1},
    ], "distributedInfo": {"rank": 0}}))
    t = ingest.load_trace(trace)
    assert list(t.events["name"][60:]) == ["odd args", "k"]
    assert list(t.events["lane"][60:]) == ["cpu:1:1", "gpu:0:7"]
    assert list(t.events["correlation"][60:]) == [-1, 42]
    assert {k: v for k, v in t.meta.items() if k != ingest.FORMAT_KEY} == \
        {"distributedInfo": {"rank": 0}}
    assert sorted(t.problems) == [f"{trace}: traceEvents: 1 event dropped (an element that is "
                                  f"not an object)", f"{trace}: ts: 1 event dropped (missing)"]


def test_a_cached_load_reports_the_same_problems(tmp_path):
    doc = json.loads(gzip.decompress((SAMPLE / "rank1.json.gz").read_bytes()))
    next(e for e in doc["traceEvents"] if e.get("ph") == "X")["dur"] = -1
    path = _write(tmp_path / "rank1.json.gz", doc)
    first = ingest.load_trace(path, cache_dir=tmp_path / "cache")
    before = ingest.PARSE_COUNT
    again = ingest.load_trace(path, cache_dir=tmp_path / "cache")
    assert ingest.PARSE_COUNT == before, "served from the cache"
    assert again.problems == first.problems == [f"{path}: dur: 1 event dropped (a negative "
                                                f"duration)"]


@pytest.mark.parametrize("info,rank,problem", [
    ({"rank": True, "world_size": 4}, 5, "distributedInfo.rank: true is not a rank"),
    ({"rank": 9, "world_size": 4}, 5, "distributedInfo.rank: 9 is not a rank (an integer from "
                                      "0 to 3)"),
    ({"rank": 1, "world_size": "four"}, 1, "distributedInfo.world_size: \"four\" is not a "
                                           "world size"),
    ("rank 1", 5, "distributedInfo: expected an object"),
])
def test_distributed_info_that_is_not_a_rank_is_named(tmp_path, info, rank, problem):
    """An unusable rank then comes from the file name (here rank5); the trace is analysed."""
    doc = json.loads(gzip.decompress((SAMPLE / "rank1.json.gz").read_bytes()))
    doc["distributedInfo"] = info
    trace = ingest.load_trace(_write(tmp_path / "rank5.json.gz", doc))
    assert trace.rank == rank
    assert [p for p in trace.problems if problem in p], trace.problems


# In a fresh process: every new thread reserves 1 GiB of address space for its stack, and an
# address-space cap (RLIMIT_AS) leaves 512 MiB above what the process already maps — so the
# pool's workers fork, but its manager thread cannot start ("can't start new thread"), as under
# a dashboard analysis's memory cap. Prints the ranks read and the child processes left.
NO_THREAD_SCRIPT = r"""
import json, pathlib, resource, sys, threading
import psutil
from meshscope.analysis.ingest import events, pool
files = sorted(pathlib.Path(sys.argv[1]).glob("*.json.gz"))
events.load_trace(files[0])                      # everything imported before the cap
threading.stack_size(1 << 30)
cap = psutil.Process().memory_info().vms + (512 << 20)
resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    threading.Thread(target=lambda: None).start()
    print(json.dumps({"premise": False}))
    sys.exit(0)
except RuntimeError:
    pass
got = [r if isinstance(r, str) else r.rank for _, r in pool.load_traces(files, workers=2)]
print(json.dumps({"premise": True, "ranks": got,
                  "children": len(psutil.Process().children(recursive=True))}))
"""


def test_a_pool_without_room_for_its_thread_reads_the_files_here():
    """The pool's workers fork at its first submit and a manager thread then starts; when it
    cannot (an address-space cap), the files are read in this process and the forked workers
    are ended — before, they waited on their queue for ever and the process never exited."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NO_THREAD_SCRIPT, str(SAMPLE)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["premise"], "a thread still started under the cap: the premise does not hold"
    assert got["ranks"] == [0, 1, 2, 3] and got["children"] == 0, got


# --- the size of a rank's event table (issue 24) ----------------------------------------------

def _tiny_trace(path, n: int, names: int = 16, threads: int = 4):
    """``n`` complete CPU events of ``names`` distinct names on ``threads`` threads, the
    smallest a profiler writes (``bench/tiny_events.py``), as a .json.gz."""
    events = [{"ph": "X", "name": f"op{i % names}", "cat": "cpu_op", "ts": i, "dur": 1,
               "pid": 1, "tid": i % threads} for i in range(n)]
    path.write_bytes(gzip.compress(json.dumps(
        {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}).encode(), 1))
    return path


# Bytes an event of a tiny event's frame, column by column: four name columns as
# categoricals of a few categories (1-byte codes), ts_us, dur_us, end_us (8 each), device (1),
# correlation (8), the six collective-metadata and call_args strings as categoricals (1),
# in_nelems, out_nelems, group_size, msg_bytes as nullable Int64 (8 + a mask byte), seq (8).
FRAME_BYTES_PER_TINY_EVENT = 4 + 24 + 1 + 8 + 6 + 4 * 9 + 8


def test_a_tiny_event_costs_the_frame_its_columns_and_no_more(tmp_path):
    """The frame of 20,000 tiny events (the count known by construction) holds 87 bytes an
    event by its own ``memory_usage(deep=True)``: the strings a tiny event leaves null are
    1-byte codes, not 8-byte string offsets (the frame was 130 bytes an event with them as
    strings). The Arrow table it came from: at most 120 (name, cat, lane, kind and the six
    strings as int32 codes, the numbers as 8 bytes; it was 138)."""
    n = 20_000
    path = _tiny_trace(tmp_path / "rank0.json.gz", n)
    table, _, _ = ingest._parse(path, path.read_bytes(), None)
    assert table.num_rows == n
    assert table.nbytes / n <= 120, table.nbytes / n
    frame = ingest.load_trace(path).events
    assert len(frame) == n
    per_event = frame.memory_usage(deep=True).sum() / n
    assert per_event <= FRAME_BYTES_PER_TINY_EVENT + 0.5, \
        frame.memory_usage(deep=True) / n
    for col in event_table.CATEGORICAL:
        assert isinstance(frame[col].dtype, pd.CategoricalDtype), col
    assert frame["coll_name"].isna().all() and frame["call_args"].isna().all()
    assert sorted(set(frame["name"])) == sorted(f"op{k}" for k in range(16))


def test_the_metadata_strings_keep_their_values_as_categoricals(tmp_path):
    """The collective metadata and call_args of the few events that carry them come through
    the dictionary-encoded table and its cache unchanged; the other events' are missing."""
    events = [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 5, "pid": 1,
               "tid": 1, "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}},
              {"ph": "X", "name": "record_param_comms", "cat": "cpu_op", "ts": 10, "dur": 5,
               "pid": 1, "tid": 1, "args": {"Collective name": "allreduce", "dtype": "Float",
                                             "In msg nelems": 8, "Out msg nelems": 8,
                                             "Group size": 2, "Process Group Name": "0",
                                             "Process Group Description": "default_pg",
                                             "Process Group Ranks": "[0, 1]"}},
              {"ph": "X", "name": "aten::add", "cat": "cpu_op", "ts": 20, "dur": 5, "pid": 1,
               "tid": 1}]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    for cache in (None, tmp_path / "cache", tmp_path / "cache"):     # parsed, stored, read
        ev = ingest.load_trace(path, cache_dir=cache).events
        assert list(ev["name"]) == ["aten::mm", "record_param_comms", "aten::add"]
        assert json.loads(ev["call_args"].iloc[0]) == {
            "dims": [[2, 3], [3, 4]], "types": ["float", "float"], "scalars": None}
        assert ev["call_args"].iloc[1:].isna().all()
        comm = ev.iloc[1]
        assert (comm["coll_name"], comm["dtype"], comm["pg_name"], comm["pg_desc"],
                comm["pg_ranks"]) == ("allreduce", "float32", "0", "default_pg", "0,1")
        assert (comm["in_nelems"], comm["group_size"], comm["msg_bytes"]) == (8, 2, 32)
        for col in ("coll_name", "dtype", "pg_name", "pg_desc", "pg_ranks"):
            assert ev[col].iloc[[0, 2]].isna().all(), col
