"""Per-rank results kept on disk while the analysis runs (``analysis/report/spill.py``): the
analysing process holds none of a rank's large values once its result is in, reads them back
as the cross-rank stage asks, removes its files at the end, and the report is the one made
with every result held in memory."""
from __future__ import annotations

import gc
import pathlib

import pandas as pd
import pytest

from conftest import ROOT
from meshscope.analysis.report import analyze as analyze_mod
from meshscope.analysis.report import rank_work, spill
from meshscope.analysis.report.analyze import analyze
from meshscope.analysis.report.result import Report
from meshscope.analysis.report.options import AnalysisOptions

SAMPLE = ROOT / "samples" / "dp2-pp2-slow-rank1"


def _tables_equal(a: Report, b: Report) -> None:
    for (name, x), (_, y) in zip(a.tables(), b.tables()):
        pd.testing.assert_frame_equal(x, y, check_exact=True, obj=name)
    from meshscope.analysis.report.summary import document

    sa, sb = document(a.summary), document(b.summary)
    sa.pop("generated"), sb.pop("generated")
    assert sa == sb


class _InMemory(spill.RankStore):
    """A store whose folder cannot be made: every value stays in memory."""

    def __init__(self, parent=None):
        super().__init__(pathlib.Path("/proc/no-such-folder"))
        assert self.dir is None


def test_the_report_with_results_on_disk_is_the_report_in_memory(tmp_path, monkeypatch):
    on_disk = analyze(SAMPLE, workers=1, cache_dir=tmp_path / "cache")
    # The per-rank store's folder is removed; the report's tables kept in parts
    # (table_parts) have theirs until the report goes.
    left = [f.name for f in (tmp_path / "cache").glob(".tmp-*")]
    assert len(left) == 1 and left[0] in spill.OPEN
    monkeypatch.setattr(spill, "RankStore", _InMemory)
    in_memory = analyze(SAMPLE, workers=1)
    _tables_equal(on_disk, in_memory)
    del on_disk
    gc.collect()
    assert not list((tmp_path / "cache").glob(".tmp-*")), "the stores' folders are removed"


def test_a_result_in_the_store_holds_no_large_value(tmp_path):
    trace = SAMPLE / "traces" / "rank1.json.gz"
    result = rank_work.rank_work(trace, rank_work.RankOptions())
    store = spill.RankStore(tmp_path)
    try:
        kept = store.put(result)
        assert not set(vars(kept)) & set(spill.LARGE)
        files = sorted(p.name for p in store.dir.iterdir())
        assert files == sorted(f"0-{f}" for f in spill.LARGE)
        assert store.dir.stat().st_mode & 0o077 == 0, "a folder only this process reads"
        assert kept.rank == 1 and kept.problems == result.problems
        pd.testing.assert_frame_equal(kept.operations, result.operations)
        assert kept.timeline.steps == result.timeline.steps
        assert store.reads == 2
        kept.operations = None              # the cross-rank stage lets go of it
        assert kept.operations is None
        assert kept.meta == result.meta
    finally:
        store.close()
    assert not store.dir.exists()


def test_aligned_timelines_are_read_on_access_and_cached(tmp_path, monkeypatch):
    results = [rank_work.rank_work(SAMPLE / "traces" / f"rank{r}.json.gz",
                                   rank_work.RankOptions()) for r in range(4)]
    store = spill.RankStore(tmp_path)
    try:
        tls = store.timelines((r.rank, r.timeline) for r in results)
        assert sorted(tls) == [0, 1, 2, 3] and len(tls) == 4 and 2 in tls and 7 not in tls
        assert [tls[r].steps for r in tls] == [r.timeline.steps for r in results]
        reads = store.reads
        assert [tls[r].rank for r in tls] == [0, 1, 2, 3]
        assert store.reads == reads, "read again from the cache"
        monkeypatch.setattr(spill, "CACHE_BYTES", 0)
        store._cache.clear()
        store._cached_bytes = 0
        for r in tls:
            tls[r]
        assert store.reads == reads + 4, "nothing kept: read from the files"
        with pytest.raises(KeyError):
            tls[7]
    finally:
        store.close()


def test_the_per_rank_stage_puts_each_result_in_the_store(tmp_path):
    inp = analyze_mod.inputs.gather(SAMPLE)
    options = AnalysisOptions(workers=1)
    store = spill.RankStore(tmp_path)
    try:
        stage = analyze_mod._per_rank(inp, analyze_mod._rank_options(inp, options), options,
                                      store)
        assert [r.rank for r in stage.results] == [0, 1, 2, 3]
        assert all(isinstance(r, spill.Spilled) for r in stage.results)
        assert len(list(store.dir.iterdir())) == 4 * len(spill.LARGE)
    finally:
        store.close()
