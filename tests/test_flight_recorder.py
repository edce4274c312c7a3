"""Flight Recorder dumps: PyTorch's own pickles read as plain data only, and a crashed run's
records still readable."""
import json
import os
import pickle
import subprocess
import sys

import msgspec
import pandas as pd
import pytest

from meshscope.collectors.flight_recorder import (FR_SCHEMA_VERSION, UnsafePickleError,
                                                  json_schema, load_pickle_dump, read_dump,
                                                  read_torch_dump)
from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.schema import FR_SCHEMA_PATH
from conftest import ROOT, meshscope

DUMP_SCRIPT = r'''
import sys, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
dist.init_process_group("gloo")
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
dist.broadcast(t, 0)
with open(f"{sys.argv[1]}/fr-rank{dist.get_rank()}.pkl", "wb") as f:
    f.write(c10d._dump_fr_trace())
with open(f"{sys.argv[1]}/fr-rank{dist.get_rank()}.json", "wb") as f:
    f.write(c10d._dump_fr_trace_json())
dist.destroy_process_group()
'''


class _Exploit:
    """Unpickling this would run a shell command."""
    def __reduce__(self):
        return (os.system, ("touch /tmp/meshscope-pwned",))


def test_pickle_reader_refuses_code(tmp_path):
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(pickle.dumps({"entries": [_Exploit()]}))
    with pytest.raises(UnsafePickleError) as err:
        load_pickle_dump(bad)
    assert str(bad) in str(err.value) and "posix.system" in str(err.value)
    assert not os.path.exists("/tmp/meshscope-pwned")


def test_pickle_reader_refuses_non_plain_builtins(tmp_path):
    odd = tmp_path / "set.pkl"
    odd.write_bytes(pickle.dumps({"entries": {1, 2}}))
    with pytest.raises(UnsafePickleError, match="set"):
        load_pickle_dump(odd)


@pytest.mark.parametrize("damage,problem", [
    (lambda raw: raw[:2] + b"\x95" + (2**62).to_bytes(8, "little") + raw[11:], "frame of"),
    (lambda raw: raw[:-1] + b"r\xff\xff\xff\x7f.", "memo index"),
    (lambda raw: raw[: len(raw) // 2], "not a plain-data pickle"),
])
def test_pickle_reader_never_allocates_what_a_damaged_pickle_declares(tmp_path, damage,
                                                                      problem):
    """A frame length or memo index beyond the file (what made the unpickler ask for
    exabytes, found by tests/test_fuzz.py) is refused before anything is unpickled."""
    raw = pickle.dumps({"entries": [], "version": "2.10"}, protocol=5)
    path = tmp_path / "fr.pkl"
    path.write_bytes(damage(raw))
    with pytest.raises(UnsafePickleError, match=problem):
        load_pickle_dump(path)



def test_pickle_reader_refuses_a_pickle_that_stands_for_more_than_it_holds(tmp_path):
    """A list of two references to a list of two references … sixty levels down: 500 bytes
    that stand for 2**60 objects to whoever walks them (the check itself walked them, and
    never ended). Refused — each distinct object is walked once; PyTorch's own dumps, which
    share their strings, are read (test_pickle_reader_reads_a_real_pytorch_dump)."""
    x = [1]
    for _ in range(60):
        x = [x, x]
    path = tmp_path / "fr.pkl"
    path.write_bytes(pickle.dumps({"entries": [], "version": "2.10", "pg_status": {"0": x}}))
    assert path.stat().st_size < 1000
    with pytest.raises(UnsafePickleError, match="referred to from many places"):
        load_pickle_dump(path)
    shared = [[1, 2]] * 100                      # sharing within the budget is plain data
    path.write_bytes(pickle.dumps({"entries": [], "pg_status": {"0": shared}}))
    assert load_pickle_dump(path)["pg_status"]["0"] == [[1, 2]] * 100


def _dump(tmp_path, name="rank0.json", **fields):
    dump = {"schema_version": FR_SCHEMA_VERSION, "rank": 0,
            "flight_recorder": {"entries": [{"process_group": ["0", "default_pg"],
                                             "profiling_name": "gloo:all_reduce",
                                             "collective_seq_id": 1, "p2p_seq_id": 0}]}}
    dump.update(fields)
    path = tmp_path / name
    path.write_text(json.dumps(dump))
    return path


@pytest.mark.parametrize("rank,problem", [
    ("missing", "$.rank: Flight Recorder dump without a rank"),
    (None, "$.rank: Expected `int`, got `null`"),
    ("two", "$.rank: Expected `int`, got `str`"),
    ("0", "$.rank: Expected `int`, got `str`"),
    (True, "$.rank: Expected `int`, got `bool`"),
    (-1, "$.rank: Expected `int` >= 0"),
    (2**70, "$.rank: Expected `int` <= 1048575"),
])
def test_dump_without_a_usable_rank_is_named(tmp_path, rank, problem):
    """A dump whose rank is absent or not a rank cannot be placed in any group's comparison:
    read_dump refuses it, naming the file and the field."""
    path = _dump(tmp_path)
    dump = json.loads(path.read_text())
    if rank == "missing":
        dump.pop("rank")
    else:
        dump["rank"] = rank
    path.write_text(json.dumps(dump))
    with pytest.raises(RunDirError) as err:
        read_dump(path)
    assert str(err.value).startswith(f"{path}: {problem}"), err.value
    assert read_dump(_dump(tmp_path)).rank == 0


@pytest.mark.parametrize("change,where", [
    ({"flight_recorder": {"entries": ["a", "b"]}}, "$.flight_recorder.entries[0]: Expected "
                                                   "`object`, got `str`"),
    ({"flight_recorder": {"entries": [{"process_group": ["0"], "profiling_name": "x",
                                       "collective_seq_id": 1, "p2p_seq_id": 0}]}},
     "$.flight_recorder.entries[0].process_group: Expected `array` of length 2"),
    ({"flight_recorder": {"entries": [{"process_group": ["0", "d"], "profiling_name": "x",
                                       "collective_seq_id": "1", "p2p_seq_id": 0}]}},
     "$.flight_recorder.entries[0].collective_seq_id: Expected `int`, got `str`"),
    ({"flight_recorder": {"entries": [{"process_group": ["0", "d"], "profiling_name": "x",
                                       "collective_seq_id": 2**64, "p2p_seq_id": 0}]}},
     "$.flight_recorder.entries[0].collective_seq_id: Expected `int` <= 9223372036854775807"),
    ({"flight_recorder": {"entries": [{"process_group": ["0", "d"], "profiling_name": "x",
                                       "collective_seq_id": 1, "p2p_seq_id": 0,
                                       "input_sizes": [[-4]]}]}},
     "$.flight_recorder.entries[0].input_sizes[0][0]: Expected `int` >= 0"),
    ({"flight_recorder": {"pg_config": {"1": {"ranks": [0, "x"]}}}},
     "$.flight_recorder.pg_config[...].ranks[1]: Expected `int`, got `str`"),
    ({"schema_version": 7}, "$.schema_version: unknown Flight Recorder dump schema 7"),
])
def test_a_dump_with_a_field_of_the_wrong_type_is_named(tmp_path, change, where):
    with pytest.raises(RunDirError) as err:
        read_dump(_dump(tmp_path, **change))
    assert str(err.value).startswith(f"{tmp_path / 'rank0.json'}: {where}"), err.value


def test_a_dump_must_be_the_rank_its_file_names(tmp_path):
    """comms/rank1.json that claims rank 3 would displace rank 3's own dump: refused."""
    path = _dump(tmp_path, name="rank1.json", rank=3)
    with pytest.raises(RunDirError, match=r"\$\.rank: the dump claims rank 3, but its file name "
                                          r"says rank 1"):
        read_dump(path)
    assert read_dump(_dump(tmp_path, name="dump-of-anyone.json", rank=3)).rank == 3


def test_the_shipped_dump_schema_is_the_records_schema():
    """collectors/schemas/flight_recorder.schema.json is generated from the typed records the
    reader checks against (one definition); jsonschema accepts every shipped sample dump by it,
    and refuses what read_dump refuses."""
    import jsonschema

    shipped = json.loads(FR_SCHEMA_PATH.read_text())
    assert shipped == json_schema()
    jsonschema.Draft202012Validator.check_schema(shipped)
    validator = jsonschema.Draft202012Validator(shipped)
    dumps = sorted(ROOT.glob("samples/*/comms/rank*.json"))
    assert dumps
    for path in dumps:
        assert validator.is_valid(json.loads(path.read_text())), path
        read_dump(path)
    bad = json.loads(dumps[0].read_text())
    bad["flight_recorder"]["entries"][0]["collective_seq_id"] = "1"
    assert not validator.is_valid(bad)


@pytest.mark.slow
def test_pickle_reader_reads_a_real_pytorch_dump(tmp_path):
    script = tmp_path / "dump.py"
    script.write_text(DUMP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "100"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", str(script), str(tmp_path)], env=env, check=True,
                   capture_output=True, timeout=120)
    for rank in (0, 1):
        dump = load_pickle_dump(tmp_path / f"fr-rank{rank}.pkl")
        ops = [e["profiling_name"] for e in dump["entries"]]
        assert ops == ["gloo:all_reduce"] * 3 + ["gloo:broadcast"]
        assert [e["collective_seq_id"] for e in dump["entries"]] == [1, 2, 3, 4]
        # Both of PyTorch's forms read as one rank's typed dump, the same entries; the rank
        # is the one the file's name gives (PyTorch's dumps do not hold it).
        forms = [read_torch_dump(tmp_path / f"fr-rank{rank}.{ext}", rank, form)
                 for ext, form in (("pkl", "pickle"), ("json", "json"))]
        assert forms[0].rank == forms[1].rank == rank
        # The two dumps are taken one after the other: the last op may have retired between.
        # The pickle holds each entry's Python stack (``frames``: issue 47's evidence of a
        # stopped host); the JSON form, asked for without stacks, holds none.
        assert all(e.frames for e in forms[0].flight_recorder.entries)
        settled = [[msgspec.structs.replace(e, state=None, retired=None, frames=None)
                    for e in f.flight_recorder.entries] for f in forms]
        assert settled[0] == settled[1] and len(settled[0]) == 4
        assert [e.time_discovered_started_ns for e in forms[1].flight_recorder.entries] == \
            [None] * 4                                  # gloo measures none: 0 in the JSON


@pytest.mark.slow
def test_crashed_run_keeps_the_other_ranks_records(tmp_path):
    run = tmp_path / "crash3"
    proc = meshscope("run", "--layout", "dp=2,pp=2", "--inject", "crash=1:3", "--out", run,
                     timeout=120)
    assert proc.returncode != 0
    for rank in range(4):
        steps = pd.read_parquet(run / "steps" / f"rank{rank}.parquet")
        # Steps 0-2 finished everywhere; rank 1 crashed at the start of step 3.
        assert steps["step"].tolist()[:3] == [0, 1, 2]
        dump = json.loads((run / "comms" / f"rank{rank}.json").read_text())
        assert dump["flight_recorder"]["entries"]
        assert dump["reason"] in ("exception", "terminated")
    # Why (issue 47): rank 1 exited with the injected error; the ranks that lost it or timed
    # out waiting are not called a cause.
    summary = json.loads(meshscope("analyze", run, "--json", check=True).stdout)
    exited = [c for c in summary["hang_causes"] if c["cause"] == "exited"]
    assert [c["ranks"] for c in exited] == [[1]], summary["hang_causes"]
    assert "injected crash on rank 1 at step 3" in exited[0]["evidence"]


def test_two_dumps_at_once_leave_one_file_and_keep_the_first_error(tmp_path):
    """A rank that raises dumps from its main thread while the launcher's SIGTERM makes its
    handler thread dump too (issue 47's injected jobs met it: a temporary file left in fr/ and
    the error overwritten by "terminated"). Real dumps of a one-rank gloo group: the error
    then SIGTERM's dump, which keeps the error; then from two threads at once, twenty times:
    one file each, no temporary left, the error kept."""
    script = tmp_path / "race.py"
    script.write_text(f"""
import json, os, pathlib, threading
import torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541",
                  TORCH_FR_DUMP_TEMP_FILE=r"{tmp_path / 'fr' / '_dump_'}")
dist.init_process_group("gloo", rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
from meshscope.collectors import flight_recorder as fr
run = pathlib.Path(r"{tmp_path / 'run'}"); (run / "comms").mkdir(parents=True)
fr.dump(run, 0, "exception", "RuntimeError: boom")     # the error first, then SIGTERM's
fr.dump(run, 0, "terminated", "stopped")
assert json.loads((run / "comms" / "rank0.json").read_text())["reason"] == "exception"
for _ in range(20):
    ts = [threading.Thread(target=fr.dump, args=(run, 0, "exception", "RuntimeError: boom")),
          threading.Thread(target=fr.dump, args=(run, 0, "terminated", "stopped"))]
    [t.start() for t in ts]; [t.join() for t in ts]
d = json.loads((run / "comms" / "rank0.json").read_text())
print(d["reason"], "|", d["error"], "|", sorted(p.name for p in (run / "comms").iterdir()),
      sorted(p.name for p in pathlib.Path(r"{tmp_path / 'fr'}").iterdir()))
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TORCH_FR_BUFFER_SIZE": "100"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "exception | RuntimeError: boom | ['rank0.json'] ['_dump_0']"


_LEAVING = """
import os, pathlib, signal, sys, threading, time
import torch, torch.distributed as dist
tmp, port, case = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                  TORCH_FR_DUMP_TEMP_FILE=str(tmp / "fr" / "_dump_"))
from meshscope.parallel import worker
# A thread started before the rank blocks SIGTERM (torch's OpenMP pool is one where
# OMP_NUM_THREADS is unset): the signal may reach it instead of the waiting thread.
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if case == "sigterm-thread-leaves":
    worker._record_on_sigterm(lambda: None)
dist.init_process_group("gloo", rank=0, world_size=1)
for _ in range(2000):                                   # a full buffer: a dump takes a while
    dist.all_reduce(torch.ones(4))
from meshscope.collectors import flight_recorder as fr
from meshscope.parallel.process_exit import before_leaving, leave_now
before_leaving(fr.hold_dumps)                           # what worker._main registers
run, started = tmp / "run", threading.Event()
if case == "main-leaves":       # the main thread raised and leaves while SIGTERM's thread dumps
    def dumper():
        started.set()
        fr.dump(run, 0, "terminated", "stopped by the launcher")
    threading.Thread(target=dumper, daemon=True).start()
    started.wait(); time.sleep(0.05)
    leave_now(1)
else:                           # SIGTERM's thread ends the rank while the main thread dumps
    def stopper():
        started.wait(); time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=stopper, daemon=True).start()
    started.set()
    fr.dump(run, 0, "exception", "RuntimeError: boom")
    time.sleep(60)                                      # the SIGTERM thread ends the process
"""


@pytest.mark.parametrize("case, code", [("main-leaves", 1),
                                        ("sigterm-thread-leaves", 128 + 15)])
def test_a_rank_never_ends_in_the_middle_of_a_dump(tmp_path, case, code):
    """A clean-clone CI run found ``fr/._dump_0.<pid>.tmp`` beside the injected hang job's
    dumps: a rank ends with ``os._exit`` (``process_exit.leave_now``) and so stops every other
    thread where it stands. Both ways a real rank ends are built here, on a one-rank gloo
    group with 2,000 entries in its buffer (a dump takes a good part of a second): the main
    thread leaving 50 ms after the SIGTERM thread began a dump, and the SIGTERM thread
    (``worker._record_on_sigterm``) ending the process 50 ms after the main thread began one —
    with a thread started before SIGTERM was blocked, which the signal may reach (a CI run
    without ``OMP_NUM_THREADS``, where torch's OpenMP pool is such a thread, was killed by
    the signal's default action: exit -15, no dump). Either way the process ends with its own
    code only once the dump is whole: the runner's JSON with its entries, PyTorch's pickle, no
    temporary file."""
    script = tmp_path / "leaving.py"
    script.write_text(_LEAVING)
    port = str(29550 + (case == "main-leaves"))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), port, case],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"})
    assert proc.returncode == code, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "fr").iterdir()) == ["_dump_0"]
    assert sorted(p.name for p in (tmp_path / "run" / "comms").iterdir()) == ["rank0.json"]
    ours = json.loads((tmp_path / "run" / "comms" / "rank0.json").read_text())
    theirs = pickle.loads((tmp_path / "fr" / "_dump_0").read_bytes())
    assert len(ours["flight_recorder"]["entries"]) == len(theirs["entries"]) == 2000
