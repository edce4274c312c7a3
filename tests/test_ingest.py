"""Ingest: rank from the file name, the parquet cache, parallel ingest, collective metadata."""
import gzip
import io
import json
import math
import shutil
import time

import pandas as pd
import pytest

from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import pool as ingest_pool
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
    with pytest.raises(InputError, match="--rank-regex") as err:
        ingest.load_trace(trace)
    assert str(trace) in str(err.value)
    assert ingest.load_trace(trace, rank_regex=r"gpu(\d+)").rank == 5
    with pytest.raises(InputError, match="does not match --rank-regex"):
        ingest.load_trace(trace, rank_regex=r"worker(\d+)")
    with pytest.raises(ValueError, match="exactly one group"):
        ingest.load_trace(trace, rank_regex=r"(gpu)(\d+)")
    with pytest.raises(ValueError, match="not a regular expression"):
        ingest.load_trace(trace, rank_regex=r"gpu(\d+")


def test_distributed_info_comes_first(tmp_path):
    trace = tmp_path / "gpu7.json.gz"
    shutil.copy(shared_trace(NCCL_DATA), trace)
    assert ingest.load_trace(trace, rank_regex=r"gpu(\d+)").rank == 0


def test_cli_rank_regex(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(shared_trace(NO_INFO), folder / "host1-gpu3.json.gz")
    proc = meshscope("analyze", folder, "--json")
    assert proc.returncode == 2 and "--rank-regex" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = meshscope("analyze", folder, "--json", "--rank-regex", r"gpu(\d+)", check=True)
    assert json.loads(proc.stdout)["ranks"] == [3]
    proc = meshscope("analyze", folder, "--rank-regex", "gpu")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "exactly one group" in lines[0]


# --- cache ------------------------------------------------------------------------------

def test_cache_hit_is_identical_and_skips_parsing(tmp_path):
    src = SAMPLE / "rank0.json.gz"
    cache = tmp_path / "cache"
    fresh = ingest.load_trace(src)
    before = ingest.PARSE_COUNT
    first = ingest.load_trace(src, cache_dir=cache)
    assert ingest.PARSE_COUNT == before + 1
    entries = list(cache.glob("*.parquet"))
    assert len(entries) == 1
    mtime = entries[0].stat().st_mtime_ns
    second = ingest.load_trace(src, cache_dir=cache)
    assert ingest.PARSE_COUNT == before + 1, "a cache hit must not parse the JSON"
    assert entries[0].stat().st_mtime_ns == mtime and list(cache.glob("*")) == entries
    for other in (first, second):
        pd.testing.assert_frame_equal(other.events, fresh.events, check_exact=True)
        assert other.meta == fresh.meta and other.rank == fresh.rank == 0


def test_cache_key_follows_content_and_settings(tmp_path):
    trace = tmp_path / "rank0.json"
    trace.write_bytes(gzip.decompress((SAMPLE / "rank0.json.gz").read_bytes()))
    cache = tmp_path / "cache"
    a = ingest.load_trace(trace, cache_dir=cache)
    ingest.load_trace(trace, cache_dir=cache, comm_kernel_re=__import__("re").compile("x"))
    assert len(list(cache.glob("*.parquet"))) == 2          # another pattern, another entry
    doc = json.loads(trace.read_text())
    doc["traceEvents"] = doc["traceEvents"][:-100]
    trace.write_text(json.dumps(doc))
    b = ingest.load_trace(trace, cache_dir=cache)
    assert len(list(cache.glob("*.parquet"))) == 3          # edited file, new entry
    assert len(b.events) < len(a.events)


def test_bad_cache_is_ignored(tmp_path):
    src = SAMPLE / "rank1.json.gz"
    cache = tmp_path / "cache"
    good = ingest.load_trace(src, cache_dir=cache)
    (entry,) = cache.glob("*.parquet")
    entry.write_bytes(b"not parquet")
    before = ingest.PARSE_COUNT
    again = ingest.load_trace(src, cache_dir=cache)
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
    assert not (run / "report" / ".cache").exists()
    meshscope("analyze", run, "--json", check=True)
    entries = sorted((run / "report" / ".cache").glob("*.parquet"))
    assert len(entries) == 4
    mtimes = [e.stat().st_mtime_ns for e in entries]
    out3 = meshscope("analyze", run, "--json", check=True)
    assert [e.stat().st_mtime_ns for e in entries] == mtimes
    s1, s3 = json.loads(out1.stdout), json.loads(out3.stdout)
    s1.pop("generated"), s3.pop("generated")
    assert s1 == s3


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
    """``_load`` that kills the worker process that gets rank1's file."""
    import os

    if os.getpid() != _dies_in_a_worker.parent and path.name == "rank1.json.gz":
        os._exit(9)
    return _REAL_LOAD(path, *job)


def test_parallel_ingest_beside_other_threads_and_dying_workers(monkeypatch):
    """With other threads running, workers come from a fork server; a worker that dies leaves
    its files to be read in this process."""
    import os
    import threading

    files = sorted(SAMPLE.glob("*.json.gz"))
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert ingest_pool._context().get_start_method() != "fork"
        got = list(ingest_pool.load_traces(files, workers=2))
    finally:
        stop.set()
        thread.join()
    assert [r.rank for _, r in got] == [0, 1, 2, 3]

    monkeypatch.setattr(ingest_pool, "_load", _dies_in_a_worker)
    monkeypatch.setattr(_dies_in_a_worker, "parent", os.getpid(), raising=False)
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
        time.sleep(0.3)
        bar.advance()
        assert bar.shown
    assert tty.getvalue()


# --- collective metadata ----------------------------------------------------------------

def test_collective_metadata_on_nccl_trace():
    path = shared_trace(NCCL_DATA)
    ev = ingest.load_trace(path).events
    kernels = ev[(ev["cat"] == "kernel") & ev["coll_name"].notna()]
    assert kernels["coll_name"].value_counts().to_dict() == {"allreduce": 15, "broadcast": 6}
    assert kernels["name"].str.startswith("ncclKernel_").all()
    rpc = ev[ev["name"] == "record_param_comms"]
    assert rpc["coll_name"].value_counts().to_dict() == {"allreduce": 15, "broadcast": 6,
                                                         "wait": 6}
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


def test_odd_events_are_skipped_not_fatal(tmp_path):
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        "not an event",
        {"ph": "X", "cat": "cpu_op", "name": "odd args", "pid": 1, "tid": 1, "ts": 11,
         "dur": 1, "args": ["a", "list"]},
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 12, "dur": -3,
         "args": {"device": 0, "stream": 7, "correlation": 42}},
        {"ph": "i", "name": "instant", "ts": 1},
    ], "distributedInfo": {"rank": 0}}))
    t = ingest.load_trace(trace)
    assert list(t.events["name"]) == ["aten::mm", "odd args", "k"]
    assert list(t.events["lane"]) == ["cpu:1:1", "cpu:1:1", "gpu:0:7"]
    assert list(t.events["correlation"]) == [-1, -1, 42]
    assert t.events["dur_us"].iloc[2] == 0.0
    assert t.meta == {"distributedInfo": {"rank": 0}}
