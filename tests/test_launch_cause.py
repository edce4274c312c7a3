"""Which rank a failed job is blamed on, from torchelastic's own records of each rank's failure
(the error files ``@record`` writes), without starting a job."""
import json

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from meshscope.parallel.launch import _failure_message

RESET = ("RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:687: "
         "Connection reset by peer. This is typically caused by a remote worker hanging")


def _failure(tmp_path, rank: int, message: str, timestamp: int) -> ProcessFailure:
    path = tmp_path / f"rank{rank}.error.json"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": "Traceback ...", "timestamp": str(timestamp)}}}))
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=1, error_file=str(path))


def test_the_rank_that_raised_is_named_not_the_peer_it_left_behind(tmp_path):
    """Rank 1 raised; rank 0 lost its connection to rank 1 in the same second (as a CI run
    recorded it). torch's first failure is rank 0; the job is blamed on rank 1."""
    err = ChildFailedError("worker", {
        0: _failure(tmp_path, 0, RESET, 1796204551),
        1: _failure(tmp_path, 1, "InjectedCrash: injected crash on rank 1 at step 0",
                    1796204551)})
    assert err.get_first_failure()[0] == 0
    text = _failure_message(err, tmp_path)
    assert text.startswith("rank 1 failed (exit code 1): InjectedCrash: injected crash on rank 1")
    assert text.endswith("; ranks 0 were stopped")


def test_when_every_rank_lost_a_peer_the_first_is_named(tmp_path):
    err = ChildFailedError("worker", {
        0: _failure(tmp_path, 0, RESET, 1796204552),
        1: _failure(tmp_path, 1, RESET, 1796204551)})
    assert _failure_message(err, tmp_path).startswith("rank 1 failed (exit code 1): Runtime")


def test_a_rank_torch_did_not_report_is_found_by_its_error_file(tmp_path):
    """With forked ranks torch reports the first process it sees gone, only: here rank 0, which
    lost its connection while rank 1 — which raised and wrote its error file — was still
    leaving and was then stopped (as a CI run recorded it). Rank 1 is named, without an exit
    code torch never saw."""
    _failure(tmp_path, 1, "InjectedCrash: injected crash on rank 1 at step 0", 1796204551)
    err = ChildFailedError("worker", {0: _failure(tmp_path, 0, RESET, 1796204551)})
    text = _failure_message(err, tmp_path)
    assert text.startswith("rank 1 failed: InjectedCrash: injected crash on rank 1 at step 0")
    assert text.endswith("; ranks 0 were stopped")


@pytest.mark.parametrize("exit_code", [143, -15])
def test_a_rank_the_launcher_stopped_is_not_the_cause(tmp_path, exit_code):
    """With ranks started as fresh interpreters torch reports every rank gone — those the
    launcher stopped with SIGTERM (143, or −15 where the signal's default action ran) dated
    when torch saw them gone, no error file. A clean-clone CI run named such a rank, dated in
    the raise's second and lower in rank, instead of the rank that raised; here it is even
    dated earlier. The stopped rank is never the cause while a rank raised its own error."""
    stopped = ProcessFailure(local_rank=0, pid=1000, exitcode=exit_code,
                             error_file=str(tmp_path / "rank0.error.json"))
    later = int(stopped.timestamp) + 5
    err = ChildFailedError("worker", {
        0: stopped,
        1: _failure(tmp_path, 1, "InjectedCrash: injected crash on rank 1 at step 2", later)})
    text = _failure_message(err, tmp_path)
    assert text.startswith("rank 1 failed (exit code 1): InjectedCrash: injected crash")
    assert text.endswith("; ranks 0 were stopped")


def test_when_every_rank_was_stopped_the_first_is_named(tmp_path):
    """The healthy reading of the rule: with no other failure, a stop is all there is to
    name (the first by time, then by rank)."""
    err = ChildFailedError("worker", {r: ProcessFailure(
        local_rank=r, pid=1000 + r, exitcode=143, error_file=str(tmp_path / f"rank{r}.x"))
        for r in (2, 1)})
    assert _failure_message(err, tmp_path).startswith("rank 1 failed (exit code 143)")


def test_a_rank_with_no_error_file_is_named_with_its_signal_and_log(tmp_path, capsys):
    """A rank killed by a signal writes no error file: torch's made-up message names the
    signal, and the last lines of the rank's stderr log are shown first."""
    (tmp_path / "rank0.stderr.log").write_text("step 3\nSegmentation fault\n")
    err = ChildFailedError("worker", {0: ProcessFailure(
        local_rank=0, pid=1000, exitcode=-11, error_file=str(tmp_path / "rank0.error.json"))})
    text = _failure_message(err, tmp_path)
    assert text.startswith("rank 0 failed (exit code -11): Signal 11 (SIGSEGV) received by PID")
    assert "Segmentation fault" in capsys.readouterr().err


def test_an_earlier_jobs_error_file_is_removed_before_the_ranks_start(tmp_path):
    from meshscope.parallel.launch import RunLogs

    stale = tmp_path / "rank1.error.json"
    stale.write_text("{}")
    dest = RunLogs(tmp_path).reify({0: {"RANK": "0"}, 1: {"RANK": "1"}})
    assert dest.error_files[1] == str(stale) and not stale.exists()


def test_the_ended_ranks_unfinished_writes_are_removed_and_nothing_else(tmp_path):
    """A rank stopped while it wrote its error file or its dump leaves write_json_atomic's
    temporary file; the launcher removes its own ranks' and leaves other files alone (rank 10's
    belongs to another node's launcher, which may still be writing it)."""
    from meshscope.parallel.launch import _remove_partial_writes

    logs, comms = tmp_path / "logs", tmp_path / "comms"
    logs.mkdir()
    comms.mkdir()
    left = [logs / "rank0.error.json5x9vzto4.tmp", comms / "rank1.jsonq2w8.tmp",
            comms / "rank1.parquet.tmp"]
    kept = [logs / "rank0.error.json", comms / "rank1.json", comms / "rank10.jsonab12.tmp",
            logs / "rank0.stderr.log"]
    for path in left + kept:
        path.write_text("{")
    _remove_partial_writes([0, 1], [logs, comms])
    assert [p for p in left if p.exists()] == [] and all(p.exists() for p in kept)


def test_an_unreadable_error_file_of_an_unreported_rank_is_skipped(tmp_path):
    (tmp_path / "rank1.error.json").write_text('{"message": ')
    err = ChildFailedError("worker", {0: _failure(tmp_path, 0, RESET, 1796204551)})
    text = _failure_message(err, tmp_path)
    assert text.startswith("rank 0 failed (exit code 1): RuntimeError: [gloo/transport")
    assert "were stopped" not in text


def test_a_wrapped_error_is_named_with_the_error_it_was_raised_from(tmp_path):
    """torch's pipelining re-raises an error in a stage's forward under a message of several
    lines ("[Stage 0] failed to run forward:", its args, "kwargs: {}"), the real error chained
    before it in the traceback — as a dp=2,pp=2 run with 2 microbatches recorded it. The line
    names both, the wrapper's message on one line; an error raised without a chain is named
    alone."""
    callstack = (
        'Traceback (most recent call last):\n  File "stage.py", line 760, in forward\n'
        '    out_val = self.submod(*args, **kwargs)\n'
        'RuntimeError: params_.size() == rebuilt_param_indices_.size() INTERNAL ASSERT FAILED\n'
        '\nThe above exception was the direct cause of the following exception:\n\n'
        'Traceback (most recent call last):\n  File "worker.py", line 71, in _step_with_pp\n'
        '    schedule.step(x)\nRuntimeError: \n            [Stage 0] failed to run forward:\n'
        "            args: ('Tensor(torch.Size([4, 64]))',)\n            kwargs: {}\n")
    path = tmp_path / "rank0.error.json"
    path.write_text(json.dumps({"message": {
        "message": "RuntimeError: \n            [Stage 0] failed to run forward:\n"
                   "            args: ('Tensor(torch.Size([4, 64]))',)\n            kwargs: {}\n",
        "extraInfo": {"py_callstack": callstack, "timestamp": "1796204551"}}}))
    err = ChildFailedError("worker", {0: ProcessFailure(local_rank=0, pid=1000, exitcode=1,
                                                        error_file=str(path))})
    text = _failure_message(err, tmp_path)
    assert text.startswith(
        "rank 0 failed (exit code 1): RuntimeError: [Stage 0] failed to run forward: args: "
        "('Tensor(torch.Size([4, 64]))',) kwargs: {} — raised from RuntimeError: "
        "params_.size() == rebuilt_param_indices_.size() INTERNAL ASSERT FAILED (its output: "), text
    alone = tmp_path / "alone"
    alone.mkdir()
    plain = ChildFailedError("worker", {1: _failure(
        alone, 1, "InjectedCrash: injected crash on rank 1 at step 0", 1796204551)})
    assert "raised from" not in _failure_message(plain, alone)
