"""Issue 24: a report is replaced whole or not at all.

``meshscope analyze`` writing a new report over an old one is killed (SIGKILL, as ``kill -9``
or a crash would) at 20 random steps of the write (``MESHSCOPE_TEST_STOP_AT_WRITE``):
afterwards the report folder is the old report or the new one — every file of one of them, no
mix — a key is only ever beside the report it describes, and a plain re-run yields the fresh
report and removes what the killed writes left.
"""
from __future__ import annotations

import json
import os
import random
import signal

import pytest
from click.testing import CliRunner

from conftest import meshscope
from damage_corpus import copy_sample
from meshscope.analysis.report import reuse
from meshscope.analysis.report.analyze import analyze
from meshscope.collectors import run_dir as rd
from meshscope.cli import main

OPTIONS = {"comm_kernel_regex": None, "rank_regex": None, "layout": None, "rank_order": None,
           "baseline": None, "step_annotation": None}


def _files(folder) -> dict:
    """The report's files (summary.json without the time it was generated)."""
    out = {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file()}
    if "summary.json" in out:
        summary = json.loads(out["summary.json"])
        summary.pop("generated", None)
        out["summary.json"] = summary
    return out


def _write_killed(report, target, digest, at: int) -> int:
    """``report.write`` + ``reuse.store`` in a child process that kills itself at step
    ``at``; the child's wait status."""
    pid = os.fork()
    if pid == 0:                                            # the child
        try:
            os.environ[reuse.STOP_ENV] = str(at)
            reuse._steps[0] = 0
            report.write(target)
            reuse.store(target, digest)
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash")
    run = copy_sample(base / "run")
    old = analyze(run, warmup_steps=0)
    new = analyze(run, warmup_steps=1)
    refs = {}
    for name, rep in (("old", old), ("new", new)):
        rep.write(base / name)
        refs[name] = _files(base / name)
    assert refs["old"]["summary.json"] != refs["new"]["summary.json"]
    return run, old, new, refs


def test_killed_writes_leave_the_old_or_the_new_report(reports):
    run, old, new, refs = reports
    target = run / "report"
    digests = {name: reuse.key(run, target, {**OPTIONS, "warmup_steps": w})
               for name, w in (("old", 0), ("new", 1))}
    # How many steps a write has: one full write with no stop.
    old.write(target)
    reuse.store(target, digests["old"])
    reuse._steps[0] = 0
    os.environ[reuse.STOP_ENV] = "1000000"
    try:
        new.write(target)
        reuse.store(target, digests["new"])
        steps = reuse._steps[0]
    finally:
        os.environ.pop(reuse.STOP_ENV)
    assert steps >= 10
    rng = random.Random(24)
    seen = set()
    for at in [rng.randint(1, steps) for _ in range(20)]:
        old.write(target)                                    # start from the old report
        reuse.store(target, digests["old"])
        status = _write_killed(new, target, digests["new"], at)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (at, status)
        now = _files(target)
        which = [n for n, ref in refs.items() if now == ref]
        assert which, (at, {n: sorted(k for k in set(now) | set(ref) if now.get(k) != ref.get(k)) for n, ref in refs.items()})
        seen.add(which[0])
        for name, digest in digests.items():                 # a key only with its report
            if reuse.cached_summary(target, digest) is not None:
                assert name == which[0], at
    assert seen == {"old", "new"}, seen          # killed before and after the exchange
    leftovers = list(run.glob(".report.*"))
    # A plain re-run: the fresh report, reported as written, the leftovers removed.
    result = CliRunner().invoke(main, ["analyze", str(run), "--warmup-steps", "1", "--json"])
    assert result.exit_code == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert _files(target) == refs["new"]
    assert {k: v for k, v in json.loads(result.stdout).items() if k != "generated"} == \
        refs["new"]["summary.json"]
    assert not list(run.glob(".report.*")), leftovers
    assert not list((target / ".cache").glob(".tmp-*"))


def test_a_damaged_or_unkeyed_report_is_made_again(reports):
    run, old, new, refs = reports
    target = run / "report"
    runner = CliRunner()
    first = runner.invoke(main, ["analyze", str(run), "--json"])
    assert first.exit_code == 0, first.stderr
    again = runner.invoke(main, ["analyze", str(run)])
    assert "report unchanged" in again.stdout
    (target / "breakdown.parquet").write_bytes(b"PAR1 half")    # a table written half
    damaged = runner.invoke(main, ["analyze", str(run)])
    assert "report written" in damaged.stdout, damaged.stdout[-300:]
    assert _files(target) == refs["old"]
    rd.ReportDir(target).key.unlink()               # a report without its key
    unkeyed = runner.invoke(main, ["analyze", str(run)])
    assert "report written" in unkeyed.stdout


def test_a_trace_edited_with_its_size_and_mtime_kept_is_read_again(reports, tmp_path):
    """``cp -p`` / ``rsync -t`` keep size and mtime: the content hash notices."""
    run, *_ = reports
    runner = CliRunner()
    assert runner.invoke(main, ["analyze", str(run)]).exit_code == 0
    trace = run / "traces" / "rank1.json.gz"
    st = trace.stat()
    data = bytearray(trace.read_bytes())
    data[-9] ^= 0xFF                                 # the gzip trailer's CRC: same size
    trace.write_bytes(bytes(data))
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert trace.stat().st_size == st.st_size and trace.stat().st_mtime_ns == st.st_mtime_ns
    result = runner.invoke(main, ["analyze", str(run)])
    assert "report written" in result.stdout, result.stdout[-300:]


def test_the_stat_is_only_a_fast_path(tmp_path, monkeypatch):
    """The report key hashes each input's content once; while size, mtime, inode and ctime
    all match, the remembered hash is used (no file read); a copy over it is hashed again."""
    run = copy_sample(tmp_path / "run")
    target = run / "report"
    reads = []
    real = reuse.hashlib.file_digest
    monkeypatch.setattr(reuse.hashlib, "file_digest",
                        lambda f, d: reads.append(f.name) or real(f, d))
    first = reuse.key(run, target, OPTIONS)
    assert len(reads) >= 9                      # run.json, 4 traces, 4 dumps, 4 step timers
    reuse.store(target, first)
    reads.clear()
    assert reuse.key(run, target, OPTIONS) == first and reads == []
    trace = run / "traces" / "rank2.json.gz"
    st = trace.stat()
    os.replace(run / "traces" / "rank3.json.gz", trace)    # another inode, same mtime kept
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert reuse.key(run, target, OPTIONS) != first
    assert len(reads) == 1                      # that file alone is read again


def test_the_new_report_is_on_disk_before_its_rename(tmp_path):
    """Atomic is not durable: a rename changes the parent folder only. ``meshscope analyze``
    over an old report, watched by ``strace``: every file of the new report and the new
    folder are flushed (``fsync``) before the rename that puts it in place, the parent folder
    after it; the key's content before its own rename, its folder after."""
    import sys

    from conftest import meshscope
    from syscalls import fs_calls

    run = copy_sample(tmp_path / "run")
    meshscope("analyze", run, check=True)                       # the old report
    calls = fs_calls([sys.executable, "-m", "meshscope", "analyze", str(run),
                      "--warmup-steps", "1"], tmp_path / "strace.log")
    report = str(run / "report")
    put = [i for i, c in enumerate(calls) if c[0] == "rename" and c[2] == report
           and "/.report.new-" in c[1]]
    assert len(put) == 1, calls[-10:]
    new = calls[put[0]][1]
    before = {c[1] for c in calls[:put[0]] if c[0] == "fsync"}
    written = sorted(f.name for f in (run / "report").iterdir() if f.is_file())
    assert len(written) >= 20 and "summary.json" in written
    assert {f"{new}/{name}" for name in written} <= before, \
        sorted({f"{new}/{name}" for name in written} - before)
    assert new in before                                     # the folder's entries
    assert ("fsync", str(run)) in calls[put[0] + 1:]         # the rename itself
    key = str(rd.ReportDir.of_run(run).key)
    stored = [i for i, c in enumerate(calls) if c[0] == "rename" and c[2] == key]
    assert len(stored) == 1 and stored[0] > put[0]
    assert ("fsync", calls[stored[0]][1]) in calls[put[0]:stored[0]]
    assert ("fsync", str(run / "report" / ".cache")) in calls[stored[0] + 1:]


# -- issue 35: never a user's file ----------------------------------------------------------

def _user_files(folder) -> dict:
    """Every file under ``folder`` but the report's own, with its content."""
    from meshscope.analysis.report.target import own_names

    own = own_names()
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not (p.parent == folder and p.name in own)
            and ".cache" not in p.relative_to(folder).parts}


def test_user_files_beside_a_report_survive_a_kill_at_every_step(reports, tmp_path):
    """A previous report folder that also holds the user's own files (notes, an export, a
    folder of them): killed at every step of writing the new report over it, the next write's
    clean-up gives every one of them back to the folder — nothing is deleted but report
    files."""
    from meshscope.analysis.report import crash_safe

    run, old, new, _ = reports
    target = tmp_path / "out"
    mine = {"notes.md": b"# my notes\n", "timeline.json.gz": b"\x1f\x8b export",
            "keep/a.txt": b"a", "keep/deeper/b.txt": b"b"}

    def fresh():
        import shutil
        shutil.rmtree(target, ignore_errors=True)
        old.write(target)
        for rel, data in mine.items():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_bytes(data)

    fresh()
    reuse._steps[0] = 0
    os.environ[reuse.STOP_ENV] = "1000000"
    try:
        new.write(target)
        steps = reuse._steps[0]
    finally:
        os.environ.pop(reuse.STOP_ENV)
    assert _user_files(target) == mine and steps >= 10
    for at in range(1, steps + 1):
        fresh()
        status = _write_killed(new, target, "x", at)
        assert os.WIFSIGNALED(status), (at, status)
        crash_safe.remove_leftovers(target)          # what the next write does first
        assert _user_files(target) == mine, at
        assert not list(tmp_path.glob(".out.*")), at


def test_a_report_is_never_written_over_a_users_folder_or_the_run(reports, tmp_path):
    run, _, _, _ = reports
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "data.csv").write_text("1,2\n")
    for out, words in ((theirs, "holds data.csv, which is not a file of a meshscope report"),
                       (run, "would replace the folder it analyses"),
                       (run / "traces", "inside the analysed folder"),
                       (run.parent, "would replace the folder it analyses")):
        result = CliRunner().invoke(main, ["analyze", str(run), "--out", str(out)])
        assert result.exit_code == 2, (out, result.output)
        assert words in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert (theirs / "data.csv").read_text() == "1,2\n" and len(list(theirs.iterdir())) == 1
    assert (run / "run.json").is_file() and list((run / "traces").iterdir())
    # a new folder, an empty one and the run's own report folder are fine
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "new", empty, run / "report"):
        result = CliRunner().invoke(main, ["analyze", str(run), "--out", str(out)])
        assert result.exit_code == 0, result.stderr


def _tree(folder) -> dict:
    """Every entry under ``folder`` (files with their bytes, folders as None)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def test_a_folder_meshscope_cannot_tell_is_its_own_is_refused_by_the_entry(reports, tmp_path):
    """Issue 46, case 1: a user's own summary.json (alone, or with other files) and a
    home-like folder holding ``.cache/pip`` are refused with exit 2, the message naming the
    entry that made the folder not a report; nothing in them changes."""
    run, _, _, _ = reports
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"my": "precious"}')
    (mine / "plot.png").write_bytes(b"\x89PNG")
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "summary.json").write_text('{"my": "precious"}')
    home = tmp_path / "home"
    (home / ".cache" / "pip").mkdir(parents=True)
    (home / "Documents").mkdir()
    (home / ".cache" / "inputs.json").write_text("{}")
    cache_only = tmp_path / "cache_only"
    (cache_only / ".cache" / "pip").mkdir(parents=True)
    cases = ((mine, "holds plot.png,"),
             (alone, "holds summary.json (not a meshscope summary: no integer "
                     "schema_version)"),
             (home, "holds .cache/pip,"), (cache_only, "holds .cache/pip,"))
    for out, words in cases:
        before = _tree(out)
        result = CliRunner().invoke(main, ["analyze", str(run), "--out", str(out)])
        assert result.exit_code == 2, (out, result.output)
        assert words in result.stderr and "not a file of a meshscope report" in \
            result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert _tree(out) == before, out


def test_a_report_is_known_by_its_marker_or_by_holding_only_report_files(reports, tmp_path):
    """A report meshscope wrote carries its marker, and is written over with the user's
    extra files kept; a report written before the marker is recognised by holding nothing but
    a report's names (summary.json, the tables, the cache's files) — and one extra file makes
    it a folder meshscope refuses."""
    import shutil

    run, old, _, _ = reports
    marked = tmp_path / "marked"
    old.write(marked)
    assert json.loads((marked / rd.MARKER).read_text())["written_by"] == "meshscope"
    (marked / "notes.md").write_text("mine")
    result = CliRunner().invoke(main, ["analyze", str(run), "--out", str(marked)])
    assert result.exit_code == 0, result.stderr
    assert (marked / "notes.md").read_text() == "mine"
    legacy = tmp_path / "legacy"
    shutil.copytree(marked, legacy)
    (legacy / rd.MARKER).unlink()
    (legacy / "notes.md").unlink()
    assert any(p.suffix == ".parquet" for p in (legacy / ".cache").iterdir())
    result = CliRunner().invoke(main, ["analyze", str(run), "--out", str(legacy),
                                       "--no-cache"])
    assert result.exit_code == 0, result.stderr
    assert (legacy / rd.MARKER).is_file()
    (legacy / rd.MARKER).unlink()
    (legacy / "export.html").write_text("<html>")
    result = CliRunner().invoke(main, ["analyze", str(run), "--out", str(legacy)])
    assert result.exit_code == 2 and "holds export.html," in result.stderr, result.stderr
    assert (legacy / "export.html").read_text() == "<html>"


def test_a_copied_run_is_reported_under_its_own_name(tmp_path):
    """Issue 46, case 11: a run copied with its report printed the original's name (the
    report was reused: its inputs were the same). The report's key holds the analysed path,
    so the copy is analysed again under its own name — and reused from then on."""
    import shutil

    first = copy_sample(tmp_path / "first")
    proc = meshscope("analyze", first)
    assert proc.returncode == 0 and proc.stdout.startswith(f"meshscope report — {first}")
    second = tmp_path / "second"
    shutil.copytree(first, second)
    proc = meshscope("analyze", second)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"meshscope report — {second}")
    assert "report written" in proc.stdout.splitlines()[-1]
    assert json.loads((second / "report" / "summary.json").read_text())["source"] == \
        str(second)
    again = meshscope("analyze", second)
    assert "report unchanged" in again.stdout.splitlines()[-1]
