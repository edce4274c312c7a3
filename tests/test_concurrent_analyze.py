"""Issue 46, case 7: concurrent ``meshscope analyze`` of one run all succeed, nothing left behind.

Ten concurrent runs on one run folder used to fail once in about forty: a run's write replaces
the report folder (``crash_safe.write_folder``: ``.cache/`` moved into the new folder, then the
two exchanged), and for that moment ``report/.cache`` is gone under the other runs — a run
reading its per-rank files back from ``.cache/.tmp-PID-ranks-*`` (``spill.RankStore``) failed
with "No such file or directory" (exit 2, "cannot write the report") and its folder was left
behind. Now one run at a time writes a report folder (``report_lock.ReportLock``, held by
``ensure.analysed`` from the check of the report's key to the end of the write): the others
wait, then reuse the fresh report or, with ``--no-cache``, write it again; and the per-rank
files are reached through descriptors of their folder, wherever the folder is moved.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
from meshscope.analysis.report import crash_safe
from meshscope.analysis.report import spill
from meshscope.collectors import report_lock

SAMPLE = ROOT / "samples" / "dp2-pp2-1f1b"
N = 6
ROUND_TIMEOUT = 300
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _run_copy(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run, ignore=shutil.ignore_patterns("report"))
    return run


def _start(run, *flags, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "meshscope", "analyze", str(run), *flags],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=stderr,
                            text=True)


def _summary(run) -> dict:
    doc = json.loads((run / "report" / "summary.json").read_text())
    doc.pop("generated")
    return doc


def _leftovers(run) -> list[str]:
    """What a write leaves beside or in the report when it is not cleaned up: temporary files
    and folders, the new or old folders of an exchange, lock files."""
    found = []
    for p in [*run.parent.iterdir(), *run.rglob("*")]:
        name = p.name
        if name.startswith(".tmp-") or ".new-" in name or ".old-" in name \
                or name.endswith(".lock"):
            found.append(str(p.relative_to(run.parent)))
    return sorted(set(found))


@pytest.mark.parametrize("flags,rounds", [((), 3), (("--no-cache",), 2)],
                         ids=["reused", "no-cache"])
def test_concurrent_runs_on_one_report_all_succeed(tmp_path, flags, rounds):
    """``N`` runs started together on a run without a report, a few rounds: every one exits 0,
    the report is whole and is the report a run alone writes (summary.json but its time),
    and nothing is left behind — no temporary file or folder, no lock."""
    run = _run_copy(tmp_path)
    alone = _start(run, *flags)
    out, err = alone.communicate(timeout=ROUND_TIMEOUT)
    assert alone.returncode == 0, err[-3000:]
    want = _summary(run)
    tables = sorted(p.name for p in (run / "report").glob("*.parquet"))
    for round_ in range(rounds):
        shutil.rmtree(run / "report")
        procs = [_start(run, *flags) for _ in range(N)]
        results = []
        deadline = time.monotonic() + ROUND_TIMEOUT
        try:
            for p in procs:
                out, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
                results.append((p.returncode, err))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [(rc, err[-800:]) for rc, err in results if rc != 0]
        assert not failed, (round_, failed)
        assert _summary(run) == want, round_
        assert sorted(p.name for p in (run / "report").glob("*.parquet")) == tables
        assert _leftovers(run) == [], round_
        waited = sum("is writing this report; waiting" in err for _, err in results)
        print(f"round {round_}: {N} runs exit 0, {waited} waited for another")


_WRITER = r"""
import os, pathlib, sys, time
from meshscope.analysis.report import crash_safe, reuse
report, paused, go = map(pathlib.Path, sys.argv[1:4])

def stop_point():
    # Between moving .cache into the new folder and exchanging the two: wait there.
    if not (report / ".cache").exists() and not paused.exists():
        paused.touch()
        while not go.exists():
            time.sleep(0.01)

reuse.stop_point = stop_point
crash_safe.write_folder(report, None, [], lambda: {"schema_version": 1})
"""


def test_per_rank_files_survive_another_process_replacing_the_report(tmp_path):
    """The issue's failure, made to happen every time: another process replaces the report
    folder while this one keeps its per-rank files in ``report/.cache``; stopped at the moment
    ``report/.cache`` is gone, the files are still read and written, and removed at the end —
    nothing left behind."""
    report = tmp_path / "report"
    (report / ".cache").mkdir(parents=True)
    (report / "summary.json").write_text('{"schema_version": 1}')
    store = spill.RankStore(report / ".cache")
    assert store.dir is not None
    store.write((0, "timeline"), list(range(1000)))
    paused, go = tmp_path / "paused", tmp_path / "go"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(report), str(paused), str(go)],
                              cwd=ROOT, env=ENV)
    try:
        deadline = time.monotonic() + 120
        while not paused.exists():
            assert writer.poll() is None and time.monotonic() < deadline, "never paused"
            time.sleep(0.01)
        assert not (report / ".cache").exists(), "the moment the issue's run failed in"
        assert store.read((0, "timeline")) == list(range(1000))
        store.write((1, "timeline"), [1, 2, 3])
        assert store.read((1, "timeline")) == [1, 2, 3]
        store.close()                 # as a failing run's clean-up did, at that moment
    finally:
        go.touch()
        assert writer.wait(timeout=120) == 0
    assert (report / "summary.json").is_file()
    assert _leftovers(report) == []
    assert not list((report / ".cache").iterdir())


_HOLDER = r"""
import pathlib, sys, time
from meshscope.collectors import report_lock
with report_lock.ReportLock(pathlib.Path(sys.argv[1])):
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(600)
"""


def _holder(report, tmp_path) -> subprocess.Popen:
    """A process holding ``report``'s lock until it is killed."""
    ready = tmp_path / "holding"
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(report), str(ready)], cwd=ROOT,
                         env=ENV)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    return p


def test_the_lock_waits_for_its_holder_and_a_killed_holder_lets_go(tmp_path):
    """A second writer waits (told who holds it) until the holder ends — here killed with
    SIGKILL, whose lock the kernel releases —, then holds it; the lock file is removed by the
    last holder, and re-entering the lock in one thread does not wait for itself."""
    report = tmp_path / "report"
    lock = report_lock.report_lock_path(report)
    assert lock == tmp_path / ".report.lock"
    holder = _holder(report, tmp_path)
    waits, got = [], threading.Event()

    def second():
        with report_lock.ReportLock(report, on_wait=waits.append):
            got.set()
            with report_lock.ReportLock(report):            # re-entered: does not wait
                pass
            assert lock.exists()

    t = threading.Thread(target=second)
    try:
        t.start()
        time.sleep(1.0)
        assert not got.is_set() and waits == [holder.pid]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    t.join(timeout=30)
    assert got.is_set() and not t.is_alive()
    assert not lock.exists(), "removed by its last holder"


def test_a_lock_left_by_a_killed_run_is_cleared_but_a_held_one_is_not(tmp_path):
    """A killed run leaves its lock file (its lock released by the kernel): the next write's
    clean-up (``remove_leftovers``) removes it — unless a live process holds it."""
    report = tmp_path / "report"
    lock = report_lock.report_lock_path(report)
    holder = _holder(report, tmp_path)
    try:
        crash_safe.remove_leftovers(report)
        assert lock.exists(), "held: left alone"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.exists(), "the killed holder's file"
    crash_safe.remove_leftovers(report)
    assert not lock.exists()


def test_a_run_that_finds_the_report_being_written_says_so_and_waits(tmp_path):
    """The command's side: a run started while another process writes the report says it
    waits (and for which process), then writes it once that one is gone (killed, here) —
    exit 0; the next run reuses it."""
    run = _run_copy(tmp_path)
    first = _start(run)
    assert first.wait(timeout=ROUND_TIMEOUT) == 0, first.stderr.read()[-3000:]
    shutil.rmtree(run / "report" / ".cache")        # computed afresh below, but no key yet
    holder = _holder(run / "report", tmp_path)
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:
        second = _start(run, stderr=err)
        try:
            deadline = time.monotonic() + ROUND_TIMEOUT
            while "waiting for it to finish" not in log.read_text():
                assert second.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            assert f"(process {holder.pid})" in log.read_text()
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
        out, _ = second.communicate(timeout=ROUND_TIMEOUT)
    assert second.returncode == 0, log.read_text()[-3000:]
    third = _start(run)
    out, err = third.communicate(timeout=ROUND_TIMEOUT)
    assert third.returncode == 0 and "unchanged" in out, (out, err)
    assert _leftovers(run) == []
