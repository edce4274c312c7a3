"""Every trace format ingest reads, and no trace read as nothing in silence.

Small traces made by hand, whose answer is known by construction: a PyTorch 1.8 Kineto trace
(categories ``Operator``, ``Kernel``, ``Runtime``, ``Memcpy``, ``Memset``, ``Python``), a bare
JSON array of events (Chrome's JSON Array Format), ``B``/``E`` duration pairs (nested, on
several threads, cut across batches, unmatched), a single trace without any rank, and a trace
in which nothing is understood. Then the real traces of ../shared/traces that use these
formats (skipped when the corpus is absent).
"""
import gzip
import json
import pathlib

import pytest

from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest import batch_columns, decode, event_table
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import json_stream, rank_naming
from meshscope.analysis.report import inputs
from conftest import meshscope, shared_trace

KINETO_TB = "gpu/kineto_tb_samples"
PT18_OBJECT = f"{KINETO_TB}/resnet50_profiler_api_num_workers_4/worker0.pt.trace.json.gz"
PT18_ARRAY = f"{KINETO_TB}/resnet50_num_workers_0/worker0.pt.trace.json.gz"
RANKLESS_H100 = "gpu/tracelens/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def _write(path: pathlib.Path, doc) -> pathlib.Path:
    text = json.dumps(doc, indent=1).encode()
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
    return path


# -- PyTorch 1.8 -----------------------------------------------------------------------------

def _pt18_events(steps: int = 2) -> list[dict]:
    """``steps`` ProfilerSteps of 1,000 µs as PyTorch 1.8 wrote them: per step an
    ``aten::mm`` (``Input dims``, small d) launching one kernel through ``cudaLaunchKernel``,
    a ``Memcpy`` and a ``Memset``, and a Python frame."""
    evs = [{"name": "process_name", "ph": "M", "pid": 7, "tid": 0, "args": {"name": "python"}}]
    for s in range(steps):
        t0, corr = 10_000 + 1_000 * s, 100 + 10 * s
        evs += [
            {"ph": "X", "cat": "Operator", "name": f"ProfilerStep#{s + 1}", "pid": 7,
             "tid": "11", "ts": t0, "dur": 1_000, "args": {"Input dims": [], "Device": 0}},
            {"ph": "X", "cat": "Operator", "name": "enumerate(DataLoader)#_SingleProcess"
             "DataLoaderIter.__next__", "pid": 7, "tid": "11", "ts": t0 + 10, "dur": 90,
             "args": {"Input dims": []}},
            {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 7, "tid": "11",
             "ts": t0 + 100, "dur": 200, "args": {"Input dims": [[64, 32], [32, 16]],
                                                  "External id": s}},
            {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": "11",
             "ts": t0 + 150, "dur": 20, "args": {"cbid": 211, "correlation": corr}},
            {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0,
             "tid": "stream 7", "ts": t0 + 200, "dur": 300,
             "args": {"device": 0, "stream": 7, "correlation": corr, "external id": s}},
            {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
             "tid": "stream 7", "ts": t0 + 600, "dur": 50,
             "args": {"device": 0, "stream": 7, "correlation": corr + 1, "bytes": 4096}},
            {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0,
             "tid": "stream 7", "ts": t0 + 700, "dur": 5,
             "args": {"device": 0, "stream": 7, "correlation": corr + 2}},
            {"ph": "X", "cat": "Python", "name": "train.py(42): step", "pid": 7, "tid": "11",
             "ts": t0 + 5, "dur": 900},
            {"ph": "s", "id": corr, "pid": 7, "tid": 11, "ts": t0 + 150, "cat": "async",
             "name": "launch"},
        ]
    return evs


def test_pytorch_18_trace_reads_as_today_s_categories(tmp_path):
    path = _write(tmp_path / "worker0.pt.trace.json.gz",
                  {"schemaVersion": 1, "traceEvents": _pt18_events(2)})
    trace = ingest.load_trace(path)
    ev = trace.events
    assert trace.rank == 0 and trace.on_gpu
    got = dict(zip(ev["name"].str.split("#").str[0], zip(ev["cat"], ev["kind"])))
    assert got == {
        "ProfilerStep": ("user_annotation", "annotation"),
        "enumerate(DataLoader)": ("user_annotation", "annotation"),
        "aten::mm": ("cpu_op", "compute"),
        "cudaLaunchKernel": ("cuda_runtime", "other"),
        "volta_sgemm_128x64_nn": ("kernel", "compute"),
        "Memcpy HtoD (Pageable -> Device)": ("gpu_memcpy", "memory"),
        "Memset (Device)": ("gpu_memset", "memory"),
        "train.py(42): step": ("python_function", "other"),
    }
    steps = ev[ev["name"].str.startswith("ProfilerStep#")]
    assert sorted(steps["name"]) == ["ProfilerStep#1", "ProfilerStep#2"]
    kernels = ev[ev["cat"] == "kernel"]
    assert len(kernels) == 2 and set(kernels["lane"]) == {"gpu:0:7"}
    assert set(kernels["device"]) == {True}
    launches = ev[ev["name"] == "cudaLaunchKernel"]
    assert sorted(launches["correlation"]) == sorted(kernels["correlation"]) == [100, 110]
    fmt = trace.meta[ingest.FORMAT_KEY]
    assert fmt["name"] == "pytorch-1.8" and fmt["layout"] == "object"
    assert fmt["legacy_categories"] == {"Operator": 6, "Runtime": 2, "Kernel": 2, "Memcpy": 2,
                                        "Memset": 2, "Python": 2}
    assert trace.meta["schemaVersion"] == 1
    assert any("read as a PyTorch 1.8 trace" in n and "Operator as cpu_op" in n
               for n in trace.notes)
    assert not trace.problems


def test_pytorch_18_input_dims_reach_the_collective_metadata(tmp_path):
    """1.8's ``Input dims`` (small d) is read where today's ``Input Dims`` is: the shape of a
    gloo range gives its elements."""
    evs = _pt18_events(1) + [
        {"ph": "X", "cat": "Operator", "name": "gloo:all_reduce", "pid": 7, "tid": "12",
         "ts": 10_400, "dur": 100, "args": {"Input dims": [[4, 8]], "Input type": ["float"]}}]
    trace = ingest.load_trace(_write(tmp_path / "rank0.json", {"traceEvents": evs}))
    row = trace.events[trace.events["name"] == "gloo:all_reduce"].iloc[0]
    assert row["kind"] == "communication" and row["in_nelems"] == 32


def test_today_s_trace_is_kineto_without_notes(tmp_path):
    evs = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1,
            "dur": 2}]
    trace = ingest.load_trace(_write(tmp_path / "rank0.json", {"traceEvents": evs}))
    assert trace.meta[ingest.FORMAT_KEY] == {"name": "kineto", "layout": "object",
                                             "legacy_categories": {}, "be_pairs": 0}
    assert trace.notes == []


# -- bare JSON array ---------------------------------------------------------------------------

def _array_text(evs: list[dict], closed: bool = True) -> bytes:
    body = ",\n".join(json.dumps(e) for e in evs)
    return (b"[\n" + body.encode() + (b"\n]\n" if closed else b",\n"))


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "no-closing-bracket"])
def test_bare_json_array(tmp_path, closed):
    """Chrome's JSON Array Format: the file is the array of events, its ``]`` optional."""
    evs = _pt18_events(2)
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(_array_text(evs, closed)))
    trace = ingest.load_trace(path)
    assert len(trace.events) == sum(e["ph"] == "X" for e in evs) == 16
    assert trace.on_gpu
    assert trace.meta == {ingest.FORMAT_KEY: {
        "name": "pytorch-1.8+json-array", "layout": "array",
        "legacy_categories": {"Operator": 6, "Runtime": 2, "Kernel": 2, "Memcpy": 2,
                              "Memset": 2, "Python": 2}, "be_pairs": 0}}
    assert any("bare JSON array" in n for n in trace.notes)
    # The whole-file reader (used when a file cannot be streamed) reads it alike.
    table, _, meta = ingest._parse_whole(path, path.read_bytes(), batch_events=3)
    assert table.num_rows == 16 and meta == {}
    assert ingest.read_format(table)["layout"] == "array"


def test_bare_array_with_text_after_it_is_named(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_bytes(_array_text(_pt18_events(1)) + b'{"x": 1}')
    with pytest.raises(InputError, match="not valid JSON"):
        ingest.load_trace(path)


def test_bare_array_cut_inside_an_event_is_truncated(tmp_path):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(_array_text(_pt18_events(1))[:-40]))
    with pytest.raises(InputError, match=r"truncated JSON \(the file ends early\)"):
        ingest.load_trace(path)


# -- B/E pairs ---------------------------------------------------------------------------------

def _filler(n: int) -> list[dict]:
    return [{"ph": "X", "cat": "cpu_op", "name": f"aten::fill{i}", "pid": 9, "tid": 9,
             "ts": 1_000 + i, "dur": 1} for i in range(n)]


def _be_events() -> list[dict]:
    """Thread (1, 1): ``outer`` 0–50 µs holding ``inner`` 10–20 µs; thread (1, 2), interleaved
    with it: ``other`` 5–45 µs, its ``E`` carrying a name and arguments."""
    return [
        {"ph": "B", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0,
         "args": {"correlation": 5}},
        {"ph": "B", "cat": "kernel", "name": "other", "pid": 1, "tid": 2, "ts": 5,
         "args": {"device": 0}},
        {"ph": "B", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 10},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 20},
        {"ph": "E", "name": "other", "pid": 1, "tid": 2, "ts": 45,
         "args": {"stream": 3, "correlation": 8}},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 50, "args": {"correlation": 6}},
    ]


def _by_name(table) -> dict:
    df = event_table.to_frame(table) if not hasattr(table, "iloc") else table
    return {r.name: (r.ts_us, r.dur_us, r.cat, r.lane, r.correlation)
            for r in df.itertuples()}


BE_EXPECTED = {
    "outer": (0.0, 50.0, "cpu_op", "cpu:1:1", 6),       # E's correlation over B's
    "inner": (10.0, 10.0, "cpu_op", "cpu:1:1", -1),
    "other": (5.0, 40.0, "kernel", "gpu:0:3", 8),        # B's device, E's stream
}


def test_be_pairs_nested_and_per_thread(tmp_path):
    path = _write(tmp_path / "rank0.json", {"traceEvents": _be_events() + _filler(40)})
    trace = ingest.load_trace(path)
    got = _by_name(trace.events)
    assert {k: got[k] for k in BE_EXPECTED} == BE_EXPECTED
    assert trace.meta[ingest.FORMAT_KEY]["be_pairs"] == 3
    assert trace.meta[ingest.FORMAT_KEY]["name"] == "kineto+B/E"
    assert any("3 duration events written as B/E pairs" in n for n in trace.notes)
    assert not trace.problems


def test_be_pairs_across_batches(tmp_path):
    """Batches are cut anywhere: a ``B`` in one, its ``E`` in a later one. Read with batches of
    about one event, in the streaming and in the whole-file reader, the table is the same."""
    path = _write(tmp_path / "rank0.json", {"traceEvents": _be_events() + _filler(40)})
    raw = path.read_bytes()
    stream = json_stream.EventStream(raw, decode.decode, batch_bytes=64)
    sizes = [len(b) for b in stream.batches()]
    assert len(sizes) > 20 and max(sizes) <= 2, "the batches are tiny"
    small, _, _ = ingest._parse(path, raw, None, batch_bytes=64)
    whole, _, _ = ingest._parse_whole(path, raw, batch_events=1)
    usual, _, _ = ingest._parse(path, raw, None)
    for table in (small, whole, usual):
        got = _by_name(table)
        assert {k: got[k] for k in BE_EXPECTED} == BE_EXPECTED
        assert table.num_rows == 43
        assert ingest.read_format(table)["be_pairs"] == 3


def test_unmatched_b_and_e_are_named(tmp_path):
    evs = _be_events() + _filler(100) + [
        {"ph": "E", "pid": 1, "tid": 3, "ts": 70},                 # closes nothing
        {"ph": "B", "cat": "cpu_op", "name": "never", "pid": 1, "tid": 4, "ts": 80},
        {"ph": "B", "cat": "cpu_op", "name": "never2", "pid": 1, "tid": 4, "ts": 81},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 90},                 # thread 1's pairs are done
    ]
    path = _write(tmp_path / "rank0.json", {"traceEvents": evs})
    trace = ingest.load_trace(path)
    assert "never" not in set(trace.events["name"])
    assert len(trace.events) == 103
    assert trace.problems == [
        f"{path}: ph: 2 events dropped (a 'B' that no 'E' on its thread (pid, tid) closes)",
        f"{path}: ph: 2 events dropped (an 'E' that closes no open 'B' on its thread "
        f"(pid, tid))",
    ]


def test_only_unmatched_pairs_is_no_complete_event(tmp_path):
    path = _write(tmp_path / "rank0.json", {"traceEvents": [
        {"ph": "B", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 0}]})
    with pytest.raises(InputError, match=r"no complete .* events left: ph: a 'B' that no 'E'"):
        ingest.load_trace(path)


# -- a trace without any rank ---------------------------------------------------------------

def _one_op(tmp_path, name: str) -> pathlib.Path:
    return _write(tmp_path / name, {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1,
         "dur": 2}]})


def test_single_rankless_trace_is_rank_0_with_a_note(tmp_path):
    trace = ingest.load_trace(_one_op(tmp_path, "model__1016002.json"))
    assert trace.rank == 0 and trace.meta[ingest.RANKLESS_KEY] is True
    assert any("read as rank 0, the only trace" in n for n in trace.notes)
    ident = inputs.identity(trace.path, trace.rank, trace.meta)
    assert ident.rankless
    assert inputs.resolve_identities([ident]) == {trace.path: 0}


def test_several_rankless_traces_are_refused(tmp_path):
    ids = []
    for name in ("model__1.json", "model__2.json", "rank1.json"):
        t = ingest.load_trace(_one_op(tmp_path, name))
        ids.append(inputs.identity(t.path, t.rank, t.meta))
    assert [i.rankless for i in ids] == [True, True, False]
    with pytest.raises(InputError, match=r"no rank: .*--rank-regex") as err:
        inputs.resolve_identities(ids)
    assert "model__1.json" in str(err.value) and "model__2.json" in str(err.value)
    # A caller that collects problems gets one per such file; the others are analysed.
    problems = []
    assert inputs.resolve_identities(ids, problems=problems) == {tmp_path / "rank1.json": 1}
    assert problems == [f"{tmp_path / n}: {rank_naming.NO_RANK}"
                        for n in ("model__1.json", "model__2.json")]


def test_cli_two_rankless_traces_exit_2(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for name in ("model__1.json", "model__2.json"):
        _one_op(folder, name)
    proc = meshscope("analyze", folder, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no rank" in proc.stderr and "--rank-regex" in proc.stderr


# -- a trace in which nothing is understood ------------------------------------------------------

def _unknown(tmp_path) -> pathlib.Path:
    evs = [{"ph": "X", "cat": "mystery", "name": f"m{i}", "pid": 1, "tid": 1, "ts": i,
            "dur": 1} for i in range(3)]
    evs += [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
             "tid": 1, "ts": 0, "dur": 5},
            {"ph": "X", "name": "nameless-cat", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]
    return _write(tmp_path / "rank0.json", {"traceEvents": evs})


def test_nothing_understood_is_a_problem_naming_what_it_held(tmp_path):
    path = _unknown(tmp_path)
    with pytest.raises(InputError) as err:
        ingest.load_trace(path)
    assert str(err.value) == (f"{path}: nothing in it was understood: none of its 5 events is "
                              f"an operator, kernel or memcpy: categories mystery (3), (none) "
                              f"(1), user_annotation (1)")


def test_cli_nothing_understood_exits_2(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    _unknown(folder)
    proc = meshscope("analyze", folder, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "none of its 5 events is an operator, kernel or memcpy" in proc.stderr


# -- the shared traces ---------------------------------------------------------------------------

@pytest.mark.parametrize("rel,name", [(PT18_OBJECT, "pytorch-1.8"),
                                      (PT18_ARRAY, "pytorch-1.8+json-array")],
                         ids=["object", "bare-array"])
def test_shared_pytorch_18_traces(rel, name):
    trace = ingest.load_trace(shared_trace(rel))
    ev = trace.events
    assert trace.on_gpu and trace.rank == 0
    assert trace.meta[ingest.FORMAT_KEY]["name"] == name
    steps = ev[ev["name"].str.startswith("ProfilerStep#")]
    assert sorted(steps["name"], key=lambda s: int(s.split("#")[1])) == \
        [f"ProfilerStep#{i}" for i in range(5, 11)]
    assert set(steps["cat"]) == {"user_annotation"}
    kernels = ev[ev["cat"] == "kernel"]
    assert len(kernels) > 9_000 and set(kernels["lane"]) == {"gpu:0:7"}
    assert (kernels["correlation"] >= 0).all()
    assert {"cpu_op", "cuda_runtime", "gpu_memcpy", "gpu_memset"} <= set(ev["cat"])
    assert not set(ev["cat"]) & set(batch_columns.LEGACY_CATEGORIES)
    assert not trace.problems


def test_cli_rankless_h100_folder_is_rank_0(tmp_path):
    folder = shared_trace(RANKLESS_H100).parent
    assert len(inputs.find_traces(folder)) == 1
    out = tmp_path / "out"
    proc = meshscope("analyze", folder, "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == [0] and summary["device"] == "gpu"
    assert summary["steps"] == [6]
