"""The index of analysed runs and ``meshscope query`` (issue 50 item 1): registration that
only reads, incremental, versioned with migration, deleted runs dropped and moved ones
re-pointed; SQL over the reports' own parquet tables, refused with exit code 2 when bad or
when it would write or read outside the reports. Every index here is a tmp file."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys

import pandas as pd
import pytest

from conftest import ROOT, meshscope

sys.path.insert(0, str(ROOT))
from bench import history_synth  # noqa: E402

from meshscope.history import index as I  # noqa: E402
from meshscope.history.query import QueryError, query  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three small analysed runs (2 ranks); the third with a slowed rank."""
    out = tmp_path_factory.mktemp("index_runs")
    made = []
    for i in (1, 2, 3):
        run = history_synth.make_run(out / "runs" / f"run{i}", i, slow=i == 3, compute=False,
                                     memory=False, events_per_step=200)
        history_synth.analyse(run)
        made.append(run)
    return made


def _listing(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns, p.stat().st_size)
                  for p in folder.rglob("*"))


def test_add_registers_each_report_reads_only_and_is_incremental(runs, tmp_path):
    folder = runs[0].parent
    before = _listing(folder)
    with I.RunIndex(tmp_path / "idx" / "index.sqlite") as idx:
        first = idx.add([folder], label="nightly")
        assert sorted(first.added) == sorted(str(r / "report") for r in runs)
        again = idx.add([folder])
        assert (again.added, again.updated, len(again.unchanged)) == ([], [], 3)
        got = {r.entry.run_path: r for r in idx.runs()}
    assert _listing(folder) == before                      # nothing written where it read
    one = got[str(runs[0])]
    run_json = json.loads((runs[0] / "run.json").read_text())
    summary = json.loads((runs[0] / "report" / "summary.json").read_text())
    assert one.label == "nightly"
    assert (one.entry.layout, one.entry.world_size, one.entry.model) == \
        (run_json["layout_str"], run_json["world_size"], run_json["model"]["preset"])
    assert one.entry.start_time == run_json["start_time"]
    assert one.entry.step_time_us == summary["step_time_us"]
    assert one.entry.trust_verdict == summary["trust"]["verdict"]


def test_moved_report_is_repointed_and_deleted_one_dropped(runs, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(runs[0], a)
    shutil.copytree(runs[1], b)
    with I.RunIndex(tmp_path / "index.sqlite") as idx:
        idx.add([a], label="mine")
        idx.add([b])
        ids = {r.entry.report_path: r.id for r in idx.runs()}
        moved = tmp_path / "elsewhere" / "a"
        moved.parent.mkdir()
        a.rename(moved)
        res = idx.add([moved])
        assert res.repointed and not res.added
        after = {r.entry.report_path: r for r in idx.runs()}
        assert after[str(moved / "report")].id == ids[str(a / "report")]
        assert after[str(moved / "report")].label == "mine"
        shutil.rmtree(b)
        updated, dropped = idx.refresh()
        assert dropped == [str(b / "report")] and updated == []
        assert [r.entry.report_path for r in idx.runs()] == [str(moved / "report")]


def test_an_index_of_version_1_is_migrated_and_a_newer_one_refused(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    for sql in I.MIGRATIONS[0]:
        db.execute(sql)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO runs (report_path, report_key, summary_mtime_ns, registered_at, "
               "label, ranks) VALUES ('/gone/report', 'k', 1, 0, 'old', 2)")
    db.commit()
    db.close()
    with I.RunIndex(path) as idx:
        assert idx.version == I.SCHEMA_VERSION == 2
        assert "trust_verdict" in idx.columns("runs") and idx.columns("findings")
        (kept,) = idx.runs()
        assert (kept.label, kept.entry.report_path, kept.entry.trust_verdict) == \
            ("old", "/gone/report", None)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    proc = _cli("index", "list", "--index", path)
    assert proc.exit_code == 2
    assert "index schema version 99 is newer" in proc.stderr and "Traceback" not in proc.output


def test_query_answers_over_the_reports_own_tables(runs, tmp_path):
    with I.RunIndex(tmp_path / "index.sqlite") as idx:
        idx.add([r.parent for r in runs[:1]])
        ids = {r.entry.run_path: r.id for r in idx.runs()}
        got = query("SELECT r.run_path, b.rank, avg(b.compute_us) AS compute_us, "
                    "count(*) AS n FROM breakdown b JOIN runs r ON r.id = b.run "
                    "GROUP BY ALL ORDER BY 1, 2", idx)
        finds = query("SELECT run, count(*) AS n FROM findings GROUP BY run", idx)
    for run in runs:
        bd = pd.read_parquet(run / "report" / "breakdown.parquet")
        mine = got[got["run_path"] == str(run)]
        assert list(mine["rank"]) == sorted(bd["rank"].unique())
        for rank, g in bd.groupby("rank"):
            row = mine[mine["rank"] == rank].iloc[0]
            assert row["n"] == len(g)
            assert row["compute_us"] == pytest.approx(g["compute_us"].mean())
        n = len(json.loads((run / "report" / "summary.json").read_text())["findings"])
        assert dict(zip(finds["run"], finds["n"])).get(ids[str(run)], 0) == n


@pytest.mark.parametrize("sql,said", [
    ("SELECT * FROM nowhere", "nowhere does not exist"),
    ("SELEC 1", "syntax error"),
    ("DELETE FROM runs", "only a SELECT"),
    ("COPY (SELECT 1) TO 'out.csv'", "only a SELECT"),
    ("SELECT * FROM read_csv('/etc/hostname')", "disabled"),
])
def test_bad_or_writing_sql_exits_2(runs, tmp_path, sql, said):
    path = tmp_path / "index.sqlite"
    with I.RunIndex(path) as idx:
        idx.add([runs[0]])
    with I.RunIndex(path) as idx:
        with pytest.raises(QueryError, match=said):
            query(sql, idx)
    assert not (ROOT / "out.csv").exists()


def _cli(*args):
    """``meshscope ARGS`` in this process (click's runner: the command's own exit code and
    its stdout and stderr apart)."""
    from click.testing import CliRunner

    from meshscope.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def test_query_command_and_its_errors(runs, tmp_path):
    path = tmp_path / "index.sqlite"
    ok = _cli("index", "add", runs[0].parent, "--index", path, "--label", "x")
    assert ok.exit_code == 0, ok.output
    answer = _cli("query", "SELECT count(*) AS n FROM runs WHERE label = 'x'",
                  "--index", path, "--format", "json")
    assert answer.exit_code == 0 and json.loads(answer.stdout) == [{"n": 3}]
    bad = _cli("query", "SELECT nope FROM runs", "--index", path)
    assert bad.exit_code == 2 and bad.stderr.startswith("meshscope: error: SQL:")
    assert "Traceback" not in bad.output
    missing = _cli("query", "SELECT 1", "--index", tmp_path / "none.sqlite")
    assert missing.exit_code == 2 and "no index here" in missing.stderr
    refused = _cli("index", "add", tmp_path / "no-such", "--index", path)
    assert refused.exit_code == 2 and "not a folder" in refused.stderr


def test_analyze_registers_the_report_it_writes(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[2], run, ignore=shutil.ignore_patterns("report"))
    path = tmp_path / "elsewhere" / "index.sqlite"
    done = meshscope("analyze", run, "--index", path)
    assert done.returncode == 0, done.stderr
    with I.RunIndex(path, create=False) as idx:
        (entry,) = [r.entry for r in idx.runs()]
    assert entry.report_path == str(run / "report") and entry.run_path == str(run)
    assert not any(p.suffix == ".sqlite" for p in run.rglob("*"))


def test_compare_registers_every_report_it_compares(runs, tmp_path):
    """A run compare analyses first and a report it reads both land in the index it is
    pointed at (``MESHSCOPE_INDEX``)."""
    fresh = tmp_path / "fresh"
    shutil.copytree(runs[2], fresh, ignore=shutil.ignore_patterns("report"))
    path = tmp_path / "compare-index.sqlite"
    done = meshscope("compare", runs[0], fresh, env={I.ENV_INDEX: str(path)})
    assert done.returncode == 0, done.stderr
    with I.RunIndex(path, create=False) as idx:
        got = sorted(r.entry.report_path for r in idx.runs())
    assert got == sorted([str(runs[0] / "report"), str(fresh / "report")])


def test_a_fifo_is_never_opened(runs, tmp_path):
    """A run whose run.json is a FIFO (a damaged run the analysis reads without it) is
    registered from its summary alone; a report whose summary.json is a FIFO is refused with
    its name — opening either would hang the registration."""
    run = tmp_path / "fifo-run"
    shutil.copytree(runs[0], run)
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    path = tmp_path / "fifo.sqlite"
    with I.RunIndex(path) as idx:
        res = idx.add([run])
        assert len(res.added) == 1, res
        (entry,) = [r.entry for r in idx.runs()]
    assert entry.run_path == str(run.resolve())            # its facts from the summary
    bad = tmp_path / "fifo-summary"
    shutil.copytree(runs[1], bad)
    (bad / "report" / "summary.json").unlink()
    os.mkfifo(bad / "report" / "summary.json")
    done = meshscope("index", "add", bad, "--index", path, timeout=60)
    (bad / "report" / "summary.json").unlink()     # no FIFO left for a later reader
    assert done.returncode == 2 and "summary.json: skipped, a FIFO" in done.stderr


def test_the_default_index_is_in_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(I.ENV_INDEX, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert I.default_path() == tmp_path / "meshscope" / "index.sqlite"
    monkeypatch.setenv(I.ENV_INDEX, os.fspath(tmp_path / "x.sqlite"))
    assert I.default_path() == tmp_path / "x.sqlite"


def _add_in_child(args):
    path, folder = args
    with I.RunIndex(path) as idx:
        res = idx.add([folder])
    return len(res.added) + len(res.unchanged) + len(res.updated)


def test_processes_registering_at_once_leave_one_row_per_report(runs, tmp_path):
    """Four processes creating and filling one new index together (as analyses finishing at
    once do): no error, each report once."""
    import multiprocessing as mp

    path = tmp_path / "index.sqlite"
    with mp.get_context("fork").Pool(4) as pool:
        seen = pool.map(_add_in_child, [(path, runs[0].parent)] * 4)
    assert seen == [3, 3, 3, 3]
    with I.RunIndex(path) as idx:
        assert sorted(r.entry.run_path for r in idx.runs()) == sorted(map(str, runs))
