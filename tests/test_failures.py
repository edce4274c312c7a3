"""A failing rank ends the job promptly, with its error, and leaves no process behind; a hang
ends at the collective timeout with every rank's Flight Recorder buffer on disk."""
import datetime
import gzip
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from meshscope.collectors.schema import validate_run_json
from conftest import ROOT, meshscope, processes_under

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("start", ["forkserver", "exec"])
def test_crash_ends_the_job_naming_the_rank(tmp_path, start):
    """Both ways of starting the ranks (parallel/rank_start.py): forked from the fork server
    (the default), and a fresh interpreter per rank as torchrun does.

    Promptly: the job ends on the crash, not when the peers' collectives time out — from the
    moment rank 1 raised (its Flight Recorder dump's time) to the end in run.json (whole
    seconds) is less than half the collective timeout given."""
    run = tmp_path / "crash"
    timeout_s = 60
    proc = meshscope("run", "--layout", "dp=2,pp=2", "--inject", "crash=1:2", "--timeout",
                     timeout_s, "--out", run, timeout=180, env={"MESHSCOPE_RANK_START": start})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("meshscope: error: the run failed: rank 1 failed")
    assert "InjectedCrash: injected crash on rank 1 at step 2" in last
    assert processes_under(run) == []
    assert sorted(run.glob("**/*.tmp")) == []  # no write the stopped ranks left unfinished
    validate_run_json(run / "run.json")
    desc = json.loads((run / "run.json").read_text())
    assert desc["status"] == "failed" and "rank 1" in desc["error"]
    dumps = {r: json.loads((run / "comms" / f"rank{r}.json").read_text()) for r in range(4)}
    assert dumps[1]["reason"] == "exception" and "InjectedCrash" in dumps[1]["error"]
    ended_s = datetime.datetime.fromisoformat(desc["end_time"]).timestamp()
    assert ended_s - dumps[1]["dumped_at_unix_s"] < timeout_s / 2, (desc["end_time"], dumps[1])


def test_hang_times_out_and_every_rank_dumps_its_flight_recorder(injected_runs):
    """``--inject hang=2:2`` on dp=2,pp=2 with a 10 s collective timeout
    (``injected_runs["hang"]``, shared with tests/test_diagnosis.py)."""
    job = injected_runs["hang"]
    run = job.run
    assert job.returncode != 0 and job.rank == 2
    assert "Timed out" in job.stderr or "timed out" in job.stderr.lower()
    assert processes_under(run) == []
    for r in range(4):
        dump = json.loads((run / "comms" / f"rank{r}.json").read_text())
        assert dump["schema_version"] == 1 and dump["rank"] == r
        entries = dump["flight_recorder"]["entries"]
        assert entries, f"rank {r} recorded no collective"
        # gloo measures no start/completion times: they stay empty, not invented.
        assert all(e["time_discovered_started_ns"] is None for e in entries)
        joined_world = any(e["process_group"][1] == "default_pg" for e in entries)
        # Every rank but 2 joined the extra world all-reduce; rank 2 skipped it.
        assert joined_world == (r != 2), r


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_launchers_form_one_job(tmp_path):
    """Multi-node through torchrun's rendezvous: two launchers on 127.0.0.1, 2 ranks each."""
    run = tmp_path / "multinode"
    endpoint = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "meshscope", "run", "--layout", "dp=2,pp=2", "--nnodes",
           "2", "--rdzv-endpoint", endpoint, "--steps", "4", "--out", str(run)]
    start = lambda n: subprocess.Popen(cmd + ["--node-rank", str(n)], cwd=ROOT, env=env,  # noqa
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
    # Node 1 first, and node 0 only once node 1's launcher has made its scratch files and the
    # logs folder in the shared output directory (the order that made node 0 refuse the
    # directory as "not empty" whenever node 1 won the race).
    second = start(1)
    deadline = time.monotonic() + 120
    while not (run / "logs").is_dir() and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (run / "logs").is_dir(), second.communicate(timeout=60)[0][-3000:]
    nodes = [start(0), second]
    outs = [n.communicate(timeout=180)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs
    validate_run_json(run / "run.json")
    desc = json.loads((run / "run.json").read_text())
    assert desc["nnodes"] == 2 and desc["status"] == "completed"
    assert sorted(p.name for p in (run / "traces").iterdir()) == \
        [f"rank{r}.json.gz" for r in range(4)]
    assert all(g.get("name") for g in desc["process_groups"])
    # Each launcher draws a run id; every rank's trace carries node 0's, the one in run.json.
    for r in range(4):
        trace = json.loads(gzip.decompress((run / "traces" / f"rank{r}.json.gz").read_bytes()))
        assert trace["meshscope"]["run_id"] == desc["run_id"], r


# A rank whose collective failed because another rank died writes its own error file; the
# launcher's SIGTERM can end it half way (its SIGTERM thread exits the process while the main
# thread writes). The script below exits the process after the first piece of the JSON, the
# moment that race hit in CI, through the handler named on its command line.
_EXIT_WHILE_WRITING = """
import json, os, sys
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
from meshscope.parallel.worker import _AtomicErrorFile

def exit_after_first_chunk(self, obj, _one_shot=False):
    yield "{"
    os._exit(143)

json.JSONEncoder.iterencode = exit_after_first_chunk
handler = {"torch": ErrorHandler, "meshscope": _AtomicErrorFile}[sys.argv[1]]()
try:
    raise RuntimeError("Connection closed by peer")
except RuntimeError as e:
    handler.record_exception(e)
"""


def _stopped_while_writing(tmp_path, handler: str):
    """torch's own reading of the error file a rank left when it exited mid-write."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    error_file = tmp_path / "rank0.error.json"
    proc = subprocess.run([sys.executable, "-c", _EXIT_WHILE_WRITING, handler],
                          env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, proc.stderr
    return ProcessFailure(local_rank=0, pid=4321, exitcode=-15,
                          error_file=str(error_file))


def test_torchs_error_file_is_unreadable_when_the_rank_is_stopped_while_writing_it(tmp_path):
    """The premise of the next test: torch's stock handler leaves an empty file, and torch's
    launcher raises on it (the JSONDecodeError traceback a crashed job printed in CI)."""
    with pytest.raises(json.JSONDecodeError):
        _stopped_while_writing(tmp_path, "torch")


def test_the_workers_error_file_is_whole_or_absent_when_stopped_while_writing_it(tmp_path):
    failure = _stopped_while_writing(tmp_path, "meshscope")
    assert failure.error_file == "<N/A>"  # torch's "no error file": the signal is reported
    assert failure.message == "Signal 15 (SIGTERM) received by PID 4321"


def test_the_workers_error_file_is_what_torchs_launcher_reads(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    from meshscope.parallel.worker import _AtomicErrorFile
    error_file = tmp_path / "rank1.error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    try:
        raise ValueError("injected crash on rank 1 at step 2")
    except ValueError as e:
        _AtomicErrorFile().record_exception(e)
    failure = ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(error_file))
    assert failure.message["message"] == "ValueError: injected crash on rank 1 at step 2"
    assert "test_the_workers_error_file_is_what" in failure.message["extraInfo"]["py_callstack"]
    assert list(tmp_path.iterdir()) == [error_file]
