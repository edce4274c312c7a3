"""PyTorch's own Flight Recorder dumps as an input of ``meshscope analyze``: a folder of
``_dump_<R>`` pickles (or their JSON form), alone or beside Kineto traces, read as plain data
only; the hang verdict of a job whose answer is known by construction (tests/fr_fixtures.py),
checked against PyTorch's own analyser (``torchfrtrace``'s builder) on the same files.

The runner's own hang dumps in PyTorch's format are tested with the runs of
tests/test_diagnosis.py (multi-process)."""
from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import shutil
import tracemalloc

import pytest

from conftest import ROOT, meshscope
from fr_fixtures import EP, TP, group_names, moe_dumps, write_dumps

HUNG = (5, 13)


def _analyze(path, *args):
    proc = meshscope("analyze", path, "--json", "--no-cache", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _expected_missing(naming: str) -> set:
    """By construction (tests/fr_fixtures.py): the hang step's all_to_all (ep sequence number
    3) lacks rank 5 in its ep group and rank 13 in its; the second reduce_scatter of that step
    (tp sequence number 6) lacks each in its tp pair."""
    names = group_names(naming)
    of = {r: (tuple(t), tuple(e)) for t in TP for e in EP for r in t if r in e}
    out = set()
    for r in HUNG:
        tp, ep = of[r]
        out |= {(names[ep], 3, (r,)), (names[tp], 6, (r,))}
    return out


def _verdict_set(rows) -> set:
    return {(h["process_group"], h["seq"], tuple(h["ranks_missing"])) for h in rows
            if h["verdict"] == "missing"}


@pytest.mark.parametrize("naming,form", [("counter", "pickle"), ("hashed", "pickle"),
                                         ("counter", "json")])
def test_a_folder_of_pytorch_dumps_names_every_hung_rank_and_the_first_missed_collective(
        tmp_path, naming, form):
    """16 ranks of an NCCL MoE job, ranks 5 and 13 stuck before the ep all_to_all while the
    others go on to the next tp reduce_scatter. The verdict names both hung ranks and the
    all_to_all (the earliest collective by the issuing ranks' creation times), per group with
    its name — whatever the groups are called: with hashed names the tp pairs of ranks 5 and 13
    sort before their ep groups, and a verdict ordered by name pointed at the reduce_scatter.
    The device is the dumps' (NCCL: a GPU job), the world their default group's (16), and no
    rank is missing: all 16 dumps are there."""
    folder = tmp_path / "fr"
    write_dumps(folder, moe_dumps(naming=naming), form=form)
    s = _analyze(folder)
    assert s["device"] == "gpu" and s["missing_ranks"] == [] and s["problems"] == []
    assert any("world size 16" in n and "nccl" in n for n in s["notes"]), s["notes"]
    assert _verdict_set(s["hangs"]) == _expected_missing(naming)
    hang = s["findings"][0]
    assert hang["id"] == "hang" and [f["id"] for f in s["findings"]] == ["hang"]
    ev = hang["evidence"]
    assert ev["hung_ranks"] == [5, 13] and ev["waiting_ranks"] == []
    names = group_names(naming)
    first = ev["first_missed"]
    assert [(f["process_group"], f["op"], f["ranks_missing"]) for f in first[:2]] == [
        (names[(1, 3, 5, 7)], "nccl:all_to_all", [5]),
        (names[(9, 11, 13, 15)], "nccl:all_to_all", [13])]
    assert {f["op"] for f in first[2:]} == {"nccl:reduce_scatter"}
    assert hang["title"].startswith("Ranks 5 and 13 never reached nccl:all_to_all")
    assert f"group {names[(1, 3, 5, 7)]} (mesh_ep) #3 without rank 5" in hang["title"]


def test_a_healthy_job_s_dumps_have_no_verdict(tmp_path):
    """The same job without the hang: every rank issued every collective — no verdict, no
    finding (a false alarm would be a bug)."""
    folder = tmp_path / "fr"
    write_dumps(folder, moe_dumps(hang_step=None))
    s = _analyze(folder)
    assert s["hangs"] == [] and s["findings"] == [] and s["missing_ranks"] == []
    assert s["device"] == "gpu"


def _torch_verdicts(folder) -> set:
    """PyTorch's own analyser (``torchfrtrace``: its loader and builder) on the dumps in
    ``folder``: (group, sequence number, missing ranks) of each collective it finds some ranks
    never joined."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    logging.getLogger("Flight Recorder").setLevel(logging.WARNING)
    args = JobConfig().parse_args([str(folder), "--prefix", "_dump_"])
    details, version = read_dir(args)
    db = build_db(details, args, version)
    return {(c.group_id, c.collective_seq_id, tuple(sorted(c.missing_ranks)))
            for c in db.collectives if c.missing_ranks}


@pytest.mark.parametrize("hang_step", [2, None])
def test_pytorchs_own_analyser_finds_the_same_collectives(tmp_path, hang_step):
    """torchfrtrace's builder on the very files meshscope read: the same collectives, the same
    missing ranks — and, on the healthy twin, none."""
    folder = tmp_path / "fr"
    write_dumps(folder, moe_dumps(hang_step=hang_step))
    theirs = _torch_verdicts(folder)
    ours = _verdict_set(_analyze(folder)["hangs"])
    assert ours == theirs
    assert bool(theirs) == (hang_step is not None)


class _Exploit:
    """Unpickling this would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_pickle_is_refused_and_nothing_runs(tmp_path):
    """A ``_dump_0`` whose unpickling would call ``os.system``: alone, the analysis stops with
    one line naming the file and what it names (exit code 2); given as the file itself, the
    same; among a job's good dumps, it is a problem of its rank and the others are judged.
    The command never runs. A pickle that is no dict of PyTorch's keys (the exploit itself at
    the top) is not even taken for a dump: named, never unpickled."""
    marker = tmp_path / "pwned"
    for folder, payload, said in (
            ("alone", {"version": "2.10", "entries": [_Exploit(marker)]},
             "refused to load posix.system"),
            ("bare", _Exploit(marker), "not a pickle of PyTorch's dump")):
        alone = tmp_path / folder
        alone.mkdir()
        (alone / "_dump_0").write_bytes(pickle.dumps(payload))
        for path in (alone, alone / "_dump_0"):
            proc = meshscope("analyze", path, "--no-cache")
            assert proc.returncode == 2, proc.stderr
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and str(alone / "_dump_0") in lines[0], lines
            assert said in lines[0], lines
            assert not marker.exists()
    alone = tmp_path / "alone"
    job = tmp_path / "job"
    write_dumps(job, moe_dumps())
    shutil.copy(alone / "_dump_0", job / "_dump_3")
    s = _analyze(job)
    assert not marker.exists()
    assert len(s["problems"]) == 1 and str(job / "_dump_3") in s["problems"][0]
    assert "posix.system" in s["problems"][0] and s["missing_ranks"] == [3]
    assert s["findings"][0]["evidence"]["hung_ranks"] == [5, 13]


def test_two_dumps_of_one_rank_are_named_not_guessed(tmp_path):
    folder = tmp_path / "fr"
    dumps = moe_dumps()
    write_dumps(folder, dumps)
    (folder / "_dump_3.json").write_text(json.dumps(dumps[3]))
    proc = meshscope("analyze", folder, "--no-cache")
    assert proc.returncode == 2
    assert "2 Flight Recorder dumps give rank 3" in proc.stderr
    assert str(folder / "_dump_3") in proc.stderr and str(folder / "_dump_3.json") in proc.stderr


def test_a_file_named_like_the_dumps_but_holding_something_else_is_named(tmp_path):
    """A dump cut to nothing (a job killed while writing) is named, not passed over."""
    folder = tmp_path / "fr"
    write_dumps(folder, moe_dumps(hang_step=None))
    (folder / "_dump_7").write_bytes(b"")
    s = _analyze(folder)
    assert [p for p in s["problems"] if str(folder / "_dump_7") in p and "empty" in p]
    assert s["missing_ranks"] == [7]


def test_what_a_dump_declares_is_never_allocated(tmp_path):
    """Budgets as for every input: a pickle of a few hundred bytes whose memo makes it stand
    for 2**60 objects is refused; counts, sizes and ranks of absurd size are numbers, never
    allocations (the whole read and verdict stay within a few MiB of Python memory); a rank
    no job has, given by a file's name, is refused."""
    from meshscope.analysis.records import flight_recorder as verdicts
    from meshscope.analysis.report import inputs

    folder = tmp_path / "fr"
    folder.mkdir()
    x = [1]
    for _ in range(60):
        x = [x, x]
    (folder / "_dump_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [],
                                                   "pg_status": {"0": x}}))
    huge = moe_dumps(hang_step=None)[1]
    for e in huge["entries"]:
        e["collective_seq_id"] += 2**62
        e["input_sizes"] = [[2**40, 2**40]]
    huge["pg_config"]["0"]["ranks"] = "[0, 1, 99999999999]"
    (folder / "_dump_1").write_bytes(pickle.dumps(huge))
    (folder / "_dump_99999999").write_bytes(pickle.dumps(moe_dumps(hang_step=None)[2]))
    tracemalloc.start()
    try:
        got = inputs.gather(folder)
        verdicts.diagnose(got.flight, None, got.steps)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert got.flight.ranks == [1] and got.flight.world_size is None
    assert any("_dump_0" in p and "referred to from many places" in p for p in got.problems)
    assert any("_dump_99999999" in p and "beyond any job" in p for p in got.problems)


def test_dumps_beside_kineto_traces_give_the_collectives_their_groups(tmp_path):
    """A folder of Kineto traces (named ``rank<R>.json``, like a dump's JSON form: told apart
    by their content) with the job's dumps in PyTorch's JSON form beside them: the traces are
    analysed, and each gloo collective takes its process group and sequence number from the
    dumps — matched by (group, sequence number) instead of by order on the world group, as
    without them."""
    sample = ROOT / "samples" / "dp2-pp2-1f1b"
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(4):
        with gzip.open(sample / "traces" / f"rank{r}.json.gz") as f:
            (folder / f"rank{r}.json").write_bytes(f.read())
    # A pickle of someone's own beside the traces, its name ending in a number: no dump.
    (folder / "checkpoint_100").write_bytes(pickle.dumps({"model": [1.0] * 8}))
    bare = _analyze(folder)
    assert bare["cross_rank"]["matched_on"] == "world" and bare["problems"] == []
    shutil.rmtree(folder / "report")
    for r in range(4):
        fr = json.loads((sample / "comms" / f"rank{r}.json").read_text())["flight_recorder"]
        (folder / f"_dump_{r}.json").write_text(json.dumps(fr))
    s = _analyze(folder)
    assert s["ranks"] == [0, 1, 2, 3] and s["problems"] == []
    assert s["cross_rank"]["matched_on"] == "group_seq"
    assert s["hangs"] == [] and not {"hang", "desync"} & {f["id"] for f in s["findings"]}
    assert any("4 of 4 PyTorch dumps read" in n for n in s["notes"])


def test_the_dashboard_serves_a_folder_of_dumps_as_a_run(tmp_path):
    """The dashboard lists a folder of PyTorch's dumps as a run; analysed, every page builds,
    the overview says where its findings come from and names both hung ranks, the health page
    lists the four verdicts, and the static report carries the hang."""
    from meshscope.dashboard import state as st
    from meshscope.dashboard.app import BUILDERS
    from meshscope.dashboard.data import open_report
    from meshscope.dashboard.pages.common import PageContext
    from meshscope.dashboard.runs import RunIndex
    from meshscope.dashboard.static_report import render_html

    write_dumps(tmp_path / "runs" / "moe", moe_dumps())
    index = RunIndex(tmp_path / "runs")
    assert list(index.runs) == ["moe"] and not index.get("moe").analysed
    assert index.get("moe").kind == "flight recorder dumps"
    _analyze(tmp_path / "runs" / "moe")
    items = {}
    for page in BUILDERS:
        ctx = PageContext(open_report(index.get("moe")), st.ViewState(page=page, runs=("moe",)))
        items[page] = {i.id: i for s in BUILDERS[page](ctx) for i in s.items}
    facts = dict(items["overview"]["run-facts"].items)
    assert facts["device"] == "gpu" and "Flight Recorder dumps alone" in facts["source"]
    assert "No trace" in items["overview"]["straggler"].text
    title = items["overview"]["findings-table"].rows[0][2]
    assert title.startswith("Ranks 5 and 13 never reached nccl:all_to_all")
    assert len(items["health"]["fr-table"].rows) == 4
    # no traces: the timeline says so and offers no Perfetto download (it answered 500)
    assert "perfetto-download" not in items["timeline"]
    assert "no trace to show or export" in items["timeline"]["timeline-none"].text
    assert "Ranks 5 and 13 never reached nccl:all_to_all" in render_html(
        open_report(index.get("moe")))
