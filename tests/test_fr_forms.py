"""Every Flight Recorder form through the one restricted, bounded reader (issue 47, item 1).

Where each file comes from:

- PyTorch's pickles of each format version are built here by ``pickle.dumps`` of a plain dict
  to that version's schema, as torch's writer lays it out (the writer needs NCCL for the
  older versions; no torch wheel but 2.13 is on this machine):
  - ``1.1``: ``NCCLTraceBuffer::dump`` in ``torch/csrc/distributed/c10d/NCCLUtils.hpp`` of
    early 2024 (keys ``entries``, ``version``; entries ``pg_id``, ``seq_id``,
    ``profiling_name``, sizes, ``state``, ``time_discovered_*``, ``retired``, ``frames``);
  - ``1.4``: the same function a few weeks later (``record_id``, ``op_id``,
    ``nccl_comm_state``, ``pg_config`` keyed by the integer ``pg_id``, a list of ranks);
  - ``2.2``: ``TraceUtils.h`` / ``NCCLUtils.hpp`` of mid 2024 (``process_group``,
    ``collective_seq_id`` / ``p2p_seq_id`` / ``is_p2p``, dtypes, ``timeout_ms``,
    ``pg_config`` by name: ``{name, desc, ranks: "[0, 1]"}``); ``2.0`` / ``2.1`` are that
    schema without ``is_p2p``;
  - ``2.3`` adds ``pg_status``, ``2.4`` ``thread_id`` / ``thread_name``, ``2.7``
    ``nccl_version``, ``2.10`` (torch 2.13's ``FlightRecorder.hpp`` /
    ``FlightRecorderDetail.hpp``, installed here) ``comm_lib_version``.
  torch 2.13's analyser (``torch.distributed.flight_recorder``'s ``build_db``) is the oracle
  for every version it reads (2.2 onwards: it needs ``collective_seq_id`` and ``is_p2p``).
- TorchComms' FlightRecorderHook files are built to its writer
  (github.com/meta-pytorch/torchcomms, ``comms/torchcomms/hooks/FlightRecorder.cpp``:
  ``dump_file`` pickles, ``dump_json`` JSON; ranks ``"0,1"``, ``p2p_seq_id`` 0, ``is_p2p``
  false, ``profiling_name`` ``nccl:<op>``, the group's description the backend's name):
  torchcomms is not installed here and needs a GPU backend.
- The debug server's dump folder is built to ``torch/distributed/debug/_frontend.py``'s
  ``PeriodicDumper`` and ``_debug_handlers.py``'s ``FlightRecorderHandler.dump`` /
  ``StacksHandler.dump`` (torch 2.13): the server cannot run here (it needs jinja2, tabulate
  and aiohttp or requests, none installed); its tables' content is torch's own ``build_db``
  on the 2.10 pickles below, laid out as tabulate's ``plain`` format does (``_plain``).
"""
from __future__ import annotations

import json
import pickle

import pandas as pd
import pytest

from meshscope.analysis.records import flight_recorder as fr_analysis
from meshscope.analysis.records.fr_table import FlightRecords
from meshscope.analysis.report import inputs
from meshscope.collectors.flight_recorder import read_torch_dump
from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.torch_dumps import torch_dump_form

WORLD = 4
HUNG = 3            # rank 3 never issues all_reduce #3 of the default group


def _entry(version: tuple[int, int], i: int, seq: int, state: str) -> dict:
    """One all_reduce entry of format ``version`` (module docstring)."""
    e = {"profiling_name": "nccl:all_reduce", "input_sizes": [[4, 5]],
         "output_sizes": [[4, 5]], "state": state, "time_created_ns": 1_000 + i,
         "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
         "retired": state == "completed", "duration_ms": None,
         "frames": [{"name": "train_step", "filename": "train.py", "line": 40 + i}]}
    if version < (2, 0):
        e.update(pg_id=0, seq_id=seq)
        if version >= (1, 4):
            e.update(record_id=i, op_id=seq)
        return e
    e.update(record_id=i, pg_id=0, process_group=("0", "default_pg"),
             collective_seq_id=seq, p2p_seq_id=0, op_id=seq)
    if version >= (2, 1):
        e.update(input_dtypes=["Float"], output_dtypes=["Float"])
    if version >= (2, 2):
        e.update(is_p2p=False, timeout_ms=600_000)
    if version >= (2, 4):
        e.update(thread_id="140000", thread_name="pt_main_thread")
    return e


def dump_of(version: str, rank: int) -> dict:
    """Rank ``rank``'s dump of format ``version``: all_reduce #1…#3, the last one still
    running; rank ``HUNG`` stops after #2."""
    v = tuple(int(x) for x in version.split("."))
    last = 2 if rank == HUNG else 3
    entries = [_entry(v, i, seq, "completed" if seq < last else "started")
               for i, seq in enumerate(range(1, last + 1))]
    d: dict = {"entries": entries, "version": version}
    if (1, 4) <= v < (2, 0):
        d["pg_config"] = {0: list(range(WORLD))}
    elif v >= (2, 0):
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg",
                                "ranks": str(list(range(WORLD)))}}
    if v >= (2, 3):
        d["pg_status"] = {"0": {"last_enqueued_collective": last,
                                "last_started_collective": last,
                                "last_completed_collective": last - 1}}
    if (2, 7) <= v < (2, 10):
        d["nccl_version"] = "2.21.5"
    elif v >= (2, 10):
        d["comm_lib_version"] = "2.27.5"
    return d


READ = ["1.1", "1.4", "2.0", "2.1", "2.2", "2.3", "2.4", "2.7", "2.10"]


def _write(folder, version: str, prefix: str = "nccl_trace_rank_", ranks=range(WORLD)):
    folder.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        (folder / f"{prefix}{r}").write_bytes(pickle.dumps(dump_of(version, r)))
    return folder


def _hangs(records: FlightRecords) -> set[tuple]:
    hangs = fr_analysis.diagnose(records, None, pd.DataFrame())
    rows = hangs[hangs["verdict"] == "missing"] if len(hangs) else hangs
    return {(h["process_group"], int(h["seq"]), tuple(h["ranks_missing"]))
            for _, h in rows.iterrows()}


@pytest.mark.parametrize("version", READ)
def test_every_format_version_is_read_and_the_hang_named(tmp_path, version):
    folder = _write(tmp_path / version, version)
    dumps = [read_torch_dump(folder / f"nccl_trace_rank_{r}", r, "pickle")
             for r in range(WORLD)]
    assert [len(d.flight_recorder.entries) for d in dumps] == [3, 3, 3, 2]
    e = dumps[0].flight_recorder.entries[-1]
    assert (e.collective_seq_id, e.p2p_seq_id, e.is_p2p) == (3, 0, False)
    group = "0"
    assert e.process_group[0] == group
    records = FlightRecords.of(dumps)
    assert records.ranks == list(range(WORLD))
    assert _hangs(records) == {(group, 3, (HUNG,))}


@pytest.mark.parametrize("version", ["2.2", "2.3", "2.4", "2.7", "2.10"])
def test_torch_analyser_agrees_on_the_versions_it_reads(tmp_path, version):
    """torch 2.13's own analyser (``build_db``) on the very files: the same group, sequence
    number and missing rank as meshscope. It reads 2.2 onwards: before, entries have no
    ``is_p2p`` (its ``find_coalesced_group_with_non_p2p`` raises KeyError on 2.0 / 2.1) or no
    ``collective_seq_id`` (1.x)."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    folder = _write(tmp_path / version, version)
    args = JobConfig().parse_args([str(folder), "--prefix", "nccl_trace_rank_"])
    details, got_version = read_dir(args)
    assert got_version == version
    db = build_db(details, args, got_version)
    theirs = {(c.group_id, c.collective_seq_id, tuple(sorted(c.missing_ranks)))
              for c in db.collectives if c.missing_ranks}
    ours = _hangs(FlightRecords.of(read_torch_dump(folder / f"nccl_trace_rank_{r}", r,
                                                   "pickle") for r in range(WORLD)))
    assert theirs == ours == {("0", 3, (HUNG,))}


def test_a_version_with_integer_keyed_groups_is_read_its_keys_as_text(tmp_path):
    """Format 1.4 keys ``pg_config`` by the group's integer id: the plain-data reader takes
    each such key as its text before it is hashed (no file can make the keys collide), so
    the groups are read; an integer key whose text is already a key is refused."""
    from meshscope.collectors import plain_pickle

    folder = _write(tmp_path / "v14", "1.4", ranks=[0])
    dump = read_torch_dump(folder / "nccl_trace_rank_0", 0, "pickle")
    assert dump.flight_recorder.pg_config["0"].ranks == list(range(WORLD))
    with pytest.raises(plain_pickle.UnsafePickleError, match="already a key"):
        plain_pickle.loads(pickle.dumps({"0": 1, 0: 2}), int_keys=True)
    with pytest.raises(plain_pickle.UnsafePickleError, match="a dict key of type int"):
        plain_pickle.loads(pickle.dumps({0: 2}))             # not asked for: refused


@pytest.mark.parametrize("change, field, words", [
    (lambda d: d.pop("version"), "$.version", "missing"),
    (lambda d: d.update(version="banana"), "$.version", "not a Flight Recorder format"),
    (lambda d: d.update(version="3.0"), "$.version", "newer than this meshscope reads"),
    (lambda d: d["entries"][1].pop("collective_seq_id"), "$.entries[1].collective_seq_id",
     "format version 2.10"),
    (lambda d: d["entries"][0].pop("process_group"), "$.entries[0].process_group",
     "format version 2.10"),
])
@pytest.mark.parametrize("form", ["pickle", "json"])
def test_a_dump_that_cannot_be_mapped_is_refused_in_one_line(tmp_path, change, field, words,
                                                             form):
    d = dump_of("2.10", 0)
    change(d)
    path = tmp_path / ("_dump_0" + (".json" if form == "json" else ""))
    path.write_bytes(pickle.dumps(d) if form == "pickle" else json.dumps(d).encode())
    with pytest.raises(RunDirError) as err:
        read_torch_dump(path, 0, form)
    assert str(err.value).startswith(f"{path}: {field}") and words in str(err.value)


def test_an_old_versions_missing_field_is_named_with_the_version(tmp_path):
    d = dump_of("1.1", 0)
    del d["entries"][2]["seq_id"]
    path = tmp_path / "_dump_0"
    path.write_bytes(pickle.dumps(d))
    with pytest.raises(RunDirError, match=r"_dump_0: \$\.entries\[2\]\.collective_seq_id: "
                                          r"missing in a Flight Recorder dump of format "
                                          r"version 1\.1"):
        read_torch_dump(path, 0, "pickle")


def test_the_cli_refuses_an_unmappable_dump_without_a_traceback(tmp_path):
    from click.testing import CliRunner
    from meshscope.cli import main

    d = dump_of("2.10", 0)
    d["version"] = "7.1"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "_dump_0").write_bytes(pickle.dumps(d))
    result = CliRunner().invoke(main, ["analyze", str(tmp_path / "in"), "--out",
                                       str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "Traceback" not in result.output and "$.version" in result.output \
        and "7.1" in result.output


# -- TorchComms' FlightRecorderHook --------------------------------------------------------

def torchcomms_dump(rank: int, last: int) -> dict:
    """A FlightRecorderHook dump (module docstring): comm "world" on NCCL, two ranks."""
    entries = []
    for i, seq in enumerate(range(0, last + 1)):
        entries.append({
            "record_id": i, "pg_id": 0, "process_group": ["world", "nccl"],
            "thread_name": "main", "thread_id": "1", "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce",
            "time_created_ns": 10 + i, "input_sizes": [[8]], "input_dtypes": ["Float"],
            "output_sizes": [[8]], "output_dtypes": ["Float"],
            "state": "scheduled" if seq == last else "completed",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": seq < last, "timeout_ms": 600000, "is_p2p": False})
    return {"version": "2.10", "comm_lib_version": "", "entries": entries,
            "pg_config": {"world": {"name": "world", "desc": "nccl", "ranks": "0,1"}},
            "pg_status": {}}


@pytest.mark.parametrize("encoding", ["pickle", "json"])
def test_torchcomms_hook_files_are_read_into_the_same_dump(tmp_path, encoding):
    """``dump_file``'s pickles at ``comm_lib_trace_rank_<R>``, or ``dump_json``'s JSON saved
    under the same kind of name (no ``.json``): recognised by name and first byte, read as
    the same ``Dump``, the writer named in the notes; rank 1 never reached op #2."""
    for r, last in ((0, 2), (1, 1)):
        d = torchcomms_dump(r, last)
        raw = pickle.dumps(d) if encoding == "pickle" else json.dumps(d).encode()
        (tmp_path / f"comm_lib_trace_rank_{r}").write_bytes(raw)
    assert torch_dump_form(tmp_path / "comm_lib_trace_rank_0", "pickle") is None
    got = inputs.gather(tmp_path)
    assert got.flight.ranks == [0, 1] and got.problems == []
    assert any("TorchComms" in n for n in got.notes)
    assert got.flight.pg_ranks == {"world": [0, 1]}
    assert _hangs(got.flight) == {("world", 2, (1,))}


# -- the debug server's dump folder --------------------------------------------------------

def _plain(rows, headers) -> str:
    """tabulate's ``plain`` format (numbers right-aligned, text left, two spaces between
    columns, None as empty), as the debug server's ``dump`` writes its tables."""
    def cell(v):
        return "" if v is None else str(v)
    cols = [[h] + [cell(r[i]) for r in rows] for i, h in enumerate(headers)]
    num = [all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows)
           and rows for i in range(len(headers))]
    widths = [max(len(x) for x in c) for c in cols]
    lines = []
    for k in range(len(rows) + 1):
        lines.append("  ".join(c[k].rjust(w) if n else c[k].ljust(w)
                               for c, w, n in zip(cols, widths, num)).rstrip())
    return "\n".join(lines)


def _debug_folder(tmp_path, *, absent=()):
    """``fr_trace_<stamp>.txt`` and ``stacks_<stamp>.txt`` as the server writes them, from
    torch's ``build_db`` on the 2.10 pickles (rank ``HUNG`` missed all_reduce #3)."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir
    from torch.distributed.flight_recorder.components.types import (Collective, Group,
                                                                     Membership, NCCLCall)

    src = _write(tmp_path / "src", "2.10")
    args = JobConfig().parse_args([str(src), "--prefix", "nccl_trace_rank_"])
    args.allow_incomplete_ranks = True
    details, version = read_dir(args)
    db = build_db(details, args, version)
    out = tmp_path / "debug"
    out.mkdir()
    head = []
    if absent:
        head = [f"PARTIAL DATA: {WORLD - len(absent)}/{WORLD} workers responded"] + \
               [f"  Rank {r}: ConnectionError: refused" for r in absent] + [""]
    text = "\n".join(head + [
        "=== FR Trace ===", "--- Groups ---", _plain(db.groups, Group._fields),
        "--- Memberships ---", _plain(db.memberships, Membership._fields),
        "--- Collectives ---", _plain(db.collectives, Collective._fields),
        "--- NCCL Calls ---", _plain(db.ncclcalls, NCCLCall._fields),
        "", "=== FR Trace NCCL ===\nFailed to fetch NCCL trace"])
    (out / "fr_trace_20260101_120000.txt").write_text(text)
    (out / "fr_trace_20260101_115900.txt").write_text("an older dump, not read")
    stacks = []
    for r in range(WORLD):
        stacks += [f"=== Rank {r}: http://host:{4000 + r} ===",
                   "Thread 0x00007f (most recent call first):",
                   f'  File "train.py", line {90 + r} in {"wait" if r == HUNG else "step"}',
                   '  File "train.py", line 120 in main']
    (out / "stacks_20260101_120000.txt").write_text("\n".join(stacks))
    (out / "wait_counters_20260101_120000.txt").write_text("=== Rank 0: x ===\n{}")
    return out


def test_the_debug_servers_folder_is_read_with_its_stacks(tmp_path):
    got = inputs.gather(_debug_folder(tmp_path))
    assert got.has_dumps and got.flight.ranks == list(range(WORLD)) and got.problems == []
    assert any("debug server" in n and "fr_trace_20260101_120000.txt" in n for n in got.notes)
    assert _hangs(got.flight) == {("0", 3, (HUNG,))}
    assert got.flight.last_frames[HUNG][:2] == ["train.py:93 in wait", "train.py:120 in main"]
    assert got.flight.pg_ranks == {"0": list(range(WORLD))}


def test_the_debug_servers_missing_workers_are_named(tmp_path):
    got = inputs.gather(_debug_folder(tmp_path, absent=(2,)))
    assert 2 not in got.flight.ranks
    assert any("did not respond" in p and "rank 2" in p for p in got.problems)
    assert any("rank 2 left no dump" in n for n in got.notes)


def test_a_damaged_debug_table_is_named(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "fr_trace_20260101_120000.txt").write_text("=== FR Trace ===\n--- Groups ---\n")
    got = inputs.gather(folder)
    assert got.flight.ranks == [] and any("--- Memberships ---" in p for p in got.problems)


# -- a folder of only some ranks' dumps ----------------------------------------------------

def test_ranks_without_a_dump_are_named_and_the_verdict_qualified(tmp_path):
    """Ranks 4-7 of an 8-rank job (the default group's ranks in pg_config) left no dump."""
    folder = tmp_path / "some"
    folder.mkdir()
    for r in range(4):
        d = dump_of("2.10", r)
        d["pg_config"]["0"]["ranks"] = str(list(range(8)))
        (folder / f"_dump_{r}").write_bytes(pickle.dumps(d))
    got = inputs.gather(folder)
    assert got.flight.expected_ranks() == list(range(8))
    assert got.flight.missing_ranks() == [4, 5, 6, 7]
    note = got.flight.missing_note()
    assert note.startswith("Flight Recorder: ranks 4–7 left no dump (4 of 8 expected") and \
        "a hang among them cannot be judged" in note
    assert note in got.notes
    assert FlightRecords.of(read_torch_dump(folder / f"_dump_{r}", r, "pickle")
                            for r in range(4)).missing_note(world_size=10).startswith(
        "Flight Recorder: ranks 4–9 left no dump")


def test_every_rank_present_gives_no_note(tmp_path):
    got = inputs.gather(_write(tmp_path / "all", "2.10"))
    assert got.flight.missing_ranks() == [] and got.flight.missing_note() is None
    assert not any("left no dump" in n for n in got.notes)


# -- filters by process group and by rank --------------------------------------------------

def _two_groups(tmp_path):
    folder = tmp_path / "two"
    folder.mkdir()
    for r in range(WORLD):
        d = dump_of("2.10", r)
        extra = dict(d["entries"][0], process_group=("1", "mesh_dp"), collective_seq_id=1,
                     record_id=9, time_created_ns=5_000, state="scheduled")
        d["entries"].append(extra)
        d["pg_config"]["1"] = {"name": "1", "desc": "mesh_dp", "ranks": str(list(range(4)))}
        (folder / f"_dump_{r}").write_bytes(pickle.dumps(d))
    return folder


def test_fr_group_and_fr_rank_select_entries_and_dumps(tmp_path):
    got = inputs.gather(_two_groups(tmp_path))
    assert len(got.flight) == 4 * 4 - 1
    dp = inputs.select_flight(got, ("mesh_dp",), ())
    assert len(dp.flight) == WORLD and dp.flight.pg_ranks == {"1": [0, 1, 2, 3]}
    assert dp.flight.last_op[0] == "nccl:all_reduce #1 in group 1 (mesh_dp), scheduled"
    world = inputs.select_flight(got, ("0",), ())
    assert len(world.flight) == 11 and world.flight.last_op[HUNG].startswith(
        "nccl:all_reduce #2 in group 0 (default_pg)")
    assert _hangs(world.flight) == {("0", 3, (HUNG,))}
    some = inputs.select_flight(got, (), (0, 3))
    assert some.flight.ranks == [0, 3] and any("--fr-group / --fr-rank" in n
                                               for n in some.notes)
    odd = inputs.select_flight(got, ("nope",), (9,))
    assert any(p.startswith("--fr-group nope:") for p in odd.problems)
    assert any(p.startswith("--fr-rank 9:") for p in odd.problems)


def test_the_cli_flags_reach_the_analysis(tmp_path):
    from click.testing import CliRunner
    from meshscope.cli import main

    folder = _two_groups(tmp_path)
    result = CliRunner().invoke(main, ["analyze", str(folder), "--out", str(tmp_path / "o"),
                                       "--json", "--fr-group", "default_pg", "--fr-rank", "0",
                                       "--fr-rank", "3"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["flight_recorder_ranks"] == [0, 3]

