"""What the cross-rank stage holds per rank of a many-rank job (issue 51 item 1), counted in
objects and bytes, not time:

- the match ids: one Python string per distinct id, shared by every rank's row of that
  instance (``matching._ids``), so the ids' bytes held per rank do not grow with the ranks;
  written as the text column they were before (``matching.WRITTEN_AS_TEXT``,
  ``crash_safe._parquet_safe``), byte for byte;
- the C library gives a freed large block back (``process_memory.return_large_blocks``), where
  glibc left it in the process once its own threshold had risen.
"""
from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from conftest import ROOT
from meshscope.analysis.comm import matching
from meshscope.analysis.report import crash_safe

OPS_PER_RANK = 200


def _world_instances(ranks: int) -> pd.DataFrame:
    """``ranks`` ranks, each with the same ``OPS_PER_RANK`` all-reduces on the world group."""
    world = ",".join(map(str, range(ranks)))
    n = ranks * OPS_PER_RANK
    df = pd.DataFrame({"rank": [r for r in range(ranks) for _ in range(OPS_PER_RANK)],
                       "step": [k // 50 for _ in range(ranks) for k in range(OPS_PER_RANK)],
                       "op": "all_reduce", "p2p": False, "peer": pd.NA, "pg_name": None,
                       "pg_ranks": world, "group_size": ranks, "dim": "dp",
                       "dim_source": "run", "seq": pd.array([pd.NA] * n, dtype="Int64"),
                       "k": [k % 50 for _ in range(ranks) for k in range(OPS_PER_RANK)]})
    return df


def _held_id_bytes(ids: pd.Series) -> int:
    """The bytes of the distinct string objects the column points to, and its pointers."""
    distinct = {id(s): s for s in ids}
    return sum(sys.getsizeof(s) for s in distinct.values()) + 8 * len(ids)


@pytest.fixture(scope="module")
def matched():
    return {r: matching.match(_world_instances(r), list(range(r)), world_size=r).instances
            for r in (8, 32)}


def test_each_match_id_is_one_object_shared_by_every_rank(matched):
    for ranks, inst in matched.items():
        ids = inst["match_id"]
        assert ids.nunique() == OPS_PER_RANK                    # one instance per op
        assert len({id(s) for s in ids}) == OPS_PER_RANK        # ...and one object each
        assert inst.groupby("match_id")["rank"].nunique().eq(ranks).all()


def test_match_id_bytes_held_per_rank_do_not_grow_with_the_ranks(matched):
    per_rank = {r: _held_id_bytes(inst["match_id"]) / r for r, inst in matched.items()}
    # 4× the ranks: the ids' text is held once, so per rank it is less, not more.
    assert per_rank[32] <= per_rank[8]
    # As text of its own in every row (what the column was): its bytes in every row.
    as_text = {r: sum(sys.getsizeof(s) for s in inst["match_id"].tolist()) / r
               for r, inst in matched.items()}
    assert per_rank[8] < as_text[8] / 2 and per_rank[32] < as_text[32] / 4


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def test_shared_ids_are_written_byte_for_byte_as_the_text_column(matched):
    inst = matched[8][["rank", "step", "match_id"]]
    assert inst["match_id"].dtype == object
    as_text = inst.assign(match_id=pd.Series(list(inst["match_id"]), index=inst.index,
                                             dtype="str"))
    assert _parquet_bytes(crash_safe._parquet_safe(inst)) == _parquet_bytes(as_text)
    assert inst["match_id"].dtype == object                     # the table itself unchanged
    # An empty table keeps the column it has (object, as its registered columns make it).
    empty = pd.DataFrame(columns=["rank", "match_id"])
    assert _parquet_bytes(crash_safe._parquet_safe(empty)) == _parquet_bytes(empty)


# A 24 MB block mapped and freed raises glibc's threshold above 16 MB; a 16 MB block filled
# then comes from the heap and, freed, stays in the process — unless the threshold is fixed.
FREED = textwrap.dedent('''
    import sys
    from meshscope.analysis.report.process_memory import return_large_blocks
    if sys.argv[1] == "fixed":
        assert return_large_blocks()
    def rss_bytes():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
    big = bytearray(b"\\x01") * (24 << 20)
    del big
    before = rss_bytes()
    block = bytearray(b"\\x01") * (16 << 20)
    del block
    print(rss_bytes() - before)
''')


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_freed_large_block_is_given_back():
    def left(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", FREED, mode], capture_output=True,
                             text=True, cwd=ROOT, check=True)
        return int(out.stdout)
    assert left("fixed") < 4 << 20
    assert left("glibc") > 12 << 20             # the case it fixes: the block left behind
