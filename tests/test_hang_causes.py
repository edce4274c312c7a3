"""Why ranks stopped (issue 47, item 2): each cause named from dumps whose cause is known by
construction, analysed as a user would (``meshscope analyze DUMPS --json``), and a healthy job
where none fires.

The dumps are built to the schema of PyTorch's own pickle (torch 2.13's ``_dump_fr_trace``:
``version``, ``pg_config``, entries with ``process_group``, ``collective_seq_id``,
``profiling_name``, sizes, dtypes, ``state``, ``time_created_ns``, ``frames``), as
``fr_fixtures`` writes them. A CPU job cannot make the two device-side causes — an entry left
``scheduled`` (enqueued, never started on a device) while its peers' started, or a collective
started on every rank and completed on none — because gloo completes or raises on the host:
those two are built here to the schema, and say so.
"""
from __future__ import annotations

import json

import pytest

import fr_fixtures
from conftest import meshscope

WORLD = 4
BASE = 1_790_000_000_000_000_000
OPS = ["all_reduce", "all_reduce", "all_gather", "all_reduce", "all_reduce"]
SIZES = {"all_reduce": ([[64, 8]], [[64, 8]]), "all_gather": ([[16]], [[64]])}


def _entry(seq: int, op: str, state: str, rank: int, *, ins=None, frames=()) -> dict:
    i, o = SIZES[op]
    return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"nccl:{op}", "time_created_ns": BASE + seq * 10**8 + rank * 1000,
            "input_sizes": ins or i, "input_dtypes": ["Float"], "output_sizes": ins or o,
            "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed",
            "timeout_ms": 600000, "is_p2p": False, "frames": list(frames)}


def _dump(entries: list[dict]) -> dict:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                   "ranks": str(list(range(WORLD)))}},
            "pg_status": {}, "entries": entries}


def healthy() -> dict[int, dict]:
    return {r: _dump([_entry(s + 1, op, "completed", r) for s, op in enumerate(OPS)])
            for r in range(WORLD)}


def _edit(dumps: dict[int, dict], rank: int, seq: int, **fields) -> None:
    e = next(e for e in dumps[rank]["entries"] if e["collective_seq_id"] == seq)
    e.update(fields)


def _last_in_flight(dumps: dict[int, dict], state: str) -> None:
    """The last collective (#5) in ``state`` on every rank: the job stopped inside it."""
    for r in dumps:
        _edit(dumps, r, 5, state=state, retired=False)


def host_stopped_empty():
    """Rank 2's buffer holds nothing: its host never issued a collective in the window."""
    d = healthy()
    _last_in_flight(d, "started")
    d[2]["entries"] = []
    return d


def host_stopped_after():
    """Rank 1 completed #4 and issued nothing more; its peers started #5 and wait. Its dump
    holds the stack of its last collective."""
    d = healthy()
    _last_in_flight(d, "started")
    d[1]["entries"] = d[1]["entries"][:4]
    d[1]["entries"][-1]["frames"] = [
        {"name": "all_reduce", "filename": "torch/distributed/c10d.py", "line": 2500},
        {"name": "train_step", "filename": "train.py", "line": 42}]
    return d


def device_stopped():
    """Rank 3 enqueued #5 and never started it (its earlier entries completed); its peers
    started #5 and wait."""
    d = healthy()
    _last_in_flight(d, "started")
    _edit(d, 3, 5, state="scheduled")
    return d


def transport_stalled():
    """#5 started on every rank, completed on none: each is inside it."""
    d = healthy()
    _last_in_flight(d, "started")
    return d


def size_mismatch():
    """Rank 0 issued #4 (an all_reduce) with another size than its peers."""
    d = healthy()
    _edit(d, 0, 4, input_sizes=[[32, 8]], output_sizes=[[32, 8]])
    return d


def op_divergence():
    """Rank 3 issued an all_gather where its peers issued their all_reduce #2."""
    d = healthy()
    i, o = SIZES["all_gather"]
    _edit(d, 3, 2, profiling_name="nccl:all_gather", input_sizes=i, output_sizes=o)
    return d


def order_swapped():
    """Rank 2 issued #3 and #4 in the other order than its peers (an all_gather and an
    all_reduce swapped)."""
    d = healthy()
    e3 = next(e for e in d[2]["entries"] if e["collective_seq_id"] == 3)
    e4 = next(e for e in d[2]["entries"] if e["collective_seq_id"] == 4)
    for key in ("profiling_name", "input_sizes", "output_sizes"):
        e3[key], e4[key] = e4[key], e3[key]
    return d


def no_dump():
    """Rank 3 left no dump; the others' default group lists it."""
    d = healthy()
    _last_in_flight(d, "started")
    del d[3]
    return d


CASES = {"healthy": (healthy, None, None),
         "host-stopped-empty": (host_stopped_empty, "host-stopped", [2]),
         "host-stopped-after": (host_stopped_after, "host-stopped", [1]),
         "device-stopped": (device_stopped, "device-stopped", [3]),
         "transport-stalled": (transport_stalled, "transport-stalled", [0, 1, 2, 3]),
         "size-mismatch": (size_mismatch, "mismatch", [0]),
         "op-divergence": (op_divergence, "divergence", [3]),
         "order-swapped": (order_swapped, "divergence", [2]),
         "no-dump": (no_dump, "no-dump", [3])}


@pytest.fixture(scope="module")
def cases_root(tmp_path_factory):
    return tmp_path_factory.mktemp("causes")


@pytest.fixture(scope="module")
def analysed(cases_root):
    """Each case's dumps written as PyTorch's pickles and analysed through the CLI, each in
    its own folder of ``cases_root``."""
    root = cases_root
    out = {}
    for name, (make, _, _) in CASES.items():
        fr_fixtures.write_dumps(root / name, make())
        proc = meshscope("analyze", root / name, "--json")
        assert proc.returncode == 0, (name, proc.stderr[-1500:])
        text = meshscope("analyze", root / name).stdout
        out[name] = (json.loads(proc.stdout), text)
    return out


def test_a_healthy_job_has_no_cause(analysed):
    doc, text = analysed["healthy"]
    assert doc["hang_causes"] == [] and doc["hangs"] == []
    assert not [f for f in doc["findings"] if f["id"] in ("hang", "desync")]
    assert "Cause:" not in text


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[1]])
def test_each_cause_is_named_with_its_ranks_group_and_collective(analysed, name):
    doc, text = analysed[name]
    _, cause, ranks = CASES[name]
    rows = [c for c in doc["hang_causes"] if c["cause"] == cause]
    assert len(rows) == 1, doc["hang_causes"]
    row = rows[0]
    assert row["ranks"] == ranks and row["remedy"] and row["evidence"]
    assert [c["cause"] for c in doc["hang_causes"]] == [cause], doc["hang_causes"]
    if cause != "no-dump":
        assert row["process_group"] == "0" and row["group_desc"] == "default_pg"
        # the collective as torch's analyser shows it: op, group, #seq, sizes and dtypes
        assert row["collective"].startswith(f"nccl:{row['op'].split(':')[-1]} on group 0 "
                                            f"(default_pg) #{row['seq']}, in ")
        assert "Float" in row["collective"]
    # the text says it once, with what to do next
    assert text.count(f"Cause: {cause} — ") == 1 and "  next: " in text
    found = [f for f in doc["findings"] if f["id"] in ("hang", "desync")]
    if cause != "no-dump":
        assert found and f"cause: {cause.replace('-', ' ')}" in found[0]["title"], found
        assert found[0]["remedy"] == row["remedy"]
        assert {"table": "hang_causes", "rank": None, "step": None, "keys": {"cause": cause},
                "page": "health"} in found[0]["cites"]


def test_what_each_cause_rests_on(analysed):
    """The evidence names what separates the causes (issue 47's cases)."""
    ev = {n: next(c for c in analysed[n][0]["hang_causes"] if c["cause"] == CASES[n][1])
          ["evidence"] for n in CASES if CASES[n][1]}
    assert "its buffer holds no collective at all" in ev["host-stopped-empty"]
    after = ev["host-stopped-after"]
    assert "its newest entry is nccl:all_reduce #4" in after and "nothing after it" in after
    assert "train.py:42 in train_step" in after                     # the dump's stack
    assert "0.1 s before its peers issued" in after                 # #5 came 100 ms later
    assert "never started it on the device" in ev["device-stopped"]
    assert "ranks 0, 1, 2 started it" in ev["device-stopped"]
    assert "none completed it" in ev["transport-stalled"]
    assert "32x8 Float" in ev["size-mismatch"] and "64x8 Float" in ev["size-mismatch"]
    assert "nccl:all_gather" in ev["op-divergence"] and "#2" in ev["op-divergence"]
    assert "issued it at #4 instead" in ev["order-swapped"] or \
        "issued it at #3 instead" in ev["order-swapped"]


def test_the_moe_hang_names_its_host_stopped_ranks_once():
    """The 16-rank MoE job of ``fr_fixtures`` (ranks 5 and 13 stop after a reduce_scatter):
    one host-stopped cause for both, and the four verdicts folded into one line."""
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp) / "moe"
        fr_fixtures.write_dumps(folder, fr_fixtures.moe_dumps())
        doc = json.loads(meshscope("analyze", folder, "--json", check=True).stdout)
        text = meshscope("analyze", folder, check=True).stdout
    assert [(c["cause"], c["ranks"]) for c in doc["hang_causes"]] == [("host-stopped", [5, 13])]
    assert doc["hang_causes"][0]["collective"].startswith("nccl:all_to_all on group ")
    assert text.count("Flight Recorder: 4 collectives some ranks never reached") == 1
    assert "HANG:" not in text



def test_the_health_page_shows_why_and_never_calls_a_stall_healthy(analysed, cases_root):
    """A stall no rank is missing from (every rank inside the last collective) has no
    verdict row: the Health page still shows its cause, never "No hang and no desync"."""
    from meshscope.dashboard import state as st
    from meshscope.dashboard.app import BUILDERS
    from meshscope.dashboard.data import open_report
    from meshscope.dashboard.pages.common import PageContext
    from meshscope.dashboard.runs import RunIndex

    index = RunIndex(cases_root)

    def items(name):
        ctx = PageContext(open_report(index.get(name)),
                          st.ViewState(page="health", runs=(name,)))
        return {i.id: i for s in BUILDERS["health"](ctx) for i in s.items}
    stalled = items("transport-stalled")
    assert "fr-healthy" not in stalled
    table = stalled["hang-causes-table"]
    assert table.rows[0][0] == "transport-stalled" and table.rows[0][1] == "0, 1, 2, 3"
    healthy = items("healthy")
    assert "fr-healthy" in healthy and "hang-causes-table" not in healthy


def test_a_rank_that_exited_and_one_that_left_no_dump_are_told_by_their_errors(tmp_path):
    """The dp4-ddp sample, edited as a crash leaves a run: rank 2's dump written as it raised,
    rank 3's dump gone and its stderr log ending in a traceback. The causes quote each error."""
    import shutil

    from conftest import ROOT

    run = tmp_path / "crashed"
    shutil.copytree(ROOT / "samples" / "dp4-ddp", run, ignore=shutil.ignore_patterns("report"))
    dump = json.loads((run / "comms" / "rank2.json").read_text())
    dump.update(reason="exception", error="RuntimeError: CUDA error: an illegal memory access")
    (run / "comms" / "rank2.json").write_text(json.dumps(dump))
    (run / "comms" / "rank3.json").unlink()
    (run / "logs" / "rank3.stderr.log").write_text(
        "Traceback (most recent call last):\n  File \"worker.py\", line 9, in main\n"
        "    step()\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    doc = json.loads(meshscope("analyze", run, "--json", check=True).stdout)
    by = {c["cause"]: c for c in doc["hang_causes"]}
    assert by["exited"]["ranks"] == [2]
    assert "as it raised: RuntimeError: CUDA error: an illegal memory access" in \
        by["exited"]["evidence"]
    assert by["no-dump"]["ranks"] == [3]
    assert "rank 3's log ends with torch.OutOfMemoryError: CUDA out of memory" in \
        by["no-dump"]["evidence"]


def _stage_backward_traceback(error: BaseException) -> str:
    """The traceback the runner prints (``traceback.print_exc``) when torch's own pipelining
    ``stage_backward`` runs a backward that raises ``error``: torch wraps it in a
    ``RuntimeError`` whose message starts on the line after its name."""
    import traceback

    import torch
    from torch.distributed.pipelining._backward import stage_backward

    class Fail(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum()

        @staticmethod
        def backward(ctx, grad):
            raise error

    x = torch.ones(2, 3, requires_grad=True)
    try:
        stage_backward(Fail.apply(x), None, [x])
    except RuntimeError:
        return traceback.format_exc()
    raise AssertionError("torch's stage_backward did not raise")


@pytest.mark.parametrize("wrapped, exited", [
    (RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:25321. This is typically caused by a remote worker crashing."),
     False),
    (MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True)])
def test_a_pipeline_stage_s_wrapped_error_is_judged_by_the_error_it_wraps(tmp_path, wrapped,
                                                                         exited):
    """torch's pipelining wraps a stage's failed backward in ``RuntimeError: <newline> Failed
    to run stage backward: …``; the error it wraps comes earlier in the traceback. A rank whose
    peer crashed fails so (a clean-clone CI run's dp=2,pp=2 crash job: rank 2 raised this while
    its log's last line naming an error was the bare ``RuntimeError:``, and it was called a
    cause). The dp4-ddp sample edited so: rank 1 raised the injected crash; rank 2's dump holds
    torch's wrapper and its log the traceback of torch's own ``stage_backward``. A lost peer
    wrapped is a symptom; an error of its own wrapped is the rank's cause, named."""
    import shutil

    from conftest import ROOT

    from meshscope.analysis.records.hang_causes import last_error

    run = tmp_path / "crashed"
    shutil.copytree(ROOT / "samples" / "dp4-ddp", run, ignore=shutil.ignore_patterns("report"))
    log = _stage_backward_traceback(wrapped)
    wrapper = log.rstrip().splitlines()
    head = max(i for i, ln in enumerate(wrapper) if ln.startswith("RuntimeError:"))
    assert wrapper[head].strip() == "RuntimeError:"                   # torch's own form
    assert "Failed to run stage backward:" in wrapper[head + 1]
    (run / "logs" / "rank2.stderr.log").write_text(log)
    assert last_error(run / "logs" / "rank2.stderr.log") == f"{type(wrapped).__name__}: {wrapped}"
    for rank, error in ((1, "InjectedCrash: injected crash on rank 1 at step 3"),
                        (2, "RuntimeError: " + "\n".join(wrapper[head + 1:]))):
        dump = json.loads((run / "comms" / f"rank{rank}.json").read_text())
        dump.update(reason="exception", error=error)
        (run / "comms" / f"rank{rank}.json").write_text(json.dumps(dump))
    doc = json.loads(meshscope("analyze", run, "--json", check=True).stdout)
    by = {c["cause"]: c for c in doc["hang_causes"]}
    assert by["exited"]["ranks"] == ([1, 2] if exited else [1])
    if exited:
        assert "its log: MemoryError: CUDA out of memory" in by["exited"]["evidence"]


def test_the_shipped_healthy_runs_have_no_cause():
    """Every shipped sample — healthy runs of the runner, their Flight Recorder dumps read —
    names no cause and no hang."""
    from conftest import ROOT

    for folder in sorted((ROOT / "samples").glob("*/report")):
        doc = json.loads((folder / "summary.json").read_text())
        assert doc["flight_recorder_ranks"], folder
        assert doc["hang_causes"] == [], (folder, doc["hang_causes"])
        assert not [f for f in doc["findings"] if f["id"] in ("hang", "desync")]


def test_a_report_of_dumps_alone_says_there_was_no_trace_to_check(analysed):
    """A report of Flight Recorder dumps alone (no trace) has no trust verdict: it says
    there was no trace to check — not that it was written before the checks."""
    doc, text = analysed["healthy"]
    assert doc["trust"] is None and doc["schema_version"] >= 5
    assert "evidence: no trace to check" in text


def test_ranks_left_out_by_fr_rank_are_not_called_missing(cases_root, analysed):
    """``--fr-rank`` reads the dumps of the ranks asked for: the others were not read, not
    lost — no no-dump cause names them."""
    doc = json.loads(meshscope("analyze", cases_root / "host-stopped-after", "--json",
                               "--no-cache", "--fr-rank", "0", "--fr-rank", "1",
                               check=True).stdout)
    assert not [c for c in doc["hang_causes"] if c["cause"] == "no-dump"], doc["hang_causes"]
