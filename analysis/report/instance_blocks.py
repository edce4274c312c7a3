"""The instance table of every rank, kept in pieces of one rank and one step and read a step
at a time by the cross-rank stage — so that the analysing process never holds every rank's
rows at once (issue 51 item 1: memory flat in the rank count).

The instance table (``comm/instances``) has a row per operation and rank: 16,160 rows a rank
of a 1.73M-event GPU trace, ~230 bytes a row in pandas, 480 MB at 128 ranks — and matching,
the clock alignment and every table made from it held it whole, and parts of it again
(docs/benchmarks.md, "Many big ranks"). Every figure made of it is one of three kinds:

- **per operation, over the ranks that took part** — the match id, the collective and
  point-to-point tables, the dependency graph: the ranks' rows of one step hold every rank's
  rows of each operation of that step (a matched operation's rows are in one step on every
  rank: the order ids and the send/recv ids name their step; a sequence number found in two
  steps puts every step in one block instead, ``matching.MatchStats.seq_in_two_steps``);
- **per rank** — the clock shift, the per-dimension communication sets of the rank's timeline,
  the bandwidth of each row, the written table: a rank's pieces in turn;
- **small sums over every row** — whether the world-group fallback applies, which groups have
  sequence numbers, the rows counted per group, step, op and rank (``matching.MatchStats``),
  and the collectives' end on each rank (the clocks' evidence: 8 bytes a collective and rank,
  ``clocks.stacked_ends``).

So ``InstanceBlocks.collect`` takes the ranks' tables as they are made (whole ranks each,
``analyze._instance_tables``), feeds the sums and keeps each (rank, step) piece with its rows'
positions in the rank; the passes then read a step's block — every rank's pieces of it, in the
table's order (rank after rank, each rank's rows in its order) — or a rank's pieces.
``matching.finish`` gives a block its match ids with the plan made from the sums; ``align``
shifts each block to the common clock, writes it back, and makes the collective and
point-to-point tables (each block's collective table put together in match-id order, as
``collective_table`` of the whole table orders them; the point-to-point rows gathered in the
table's order: a pair's figures read other send/recv rows of its ranks, in any step).

Each piece is held in memory while the table has at most ``IN_MEMORY_ROWS`` rows (a small run
pays no file for it), and in a private folder (``spill.RankStore``) past that. Every table the
passes make is the one the whole table gives (``tests/test_instance_blocks.py``).
"""
from __future__ import annotations

import pathlib
import weakref
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from meshscope.analysis.comm import instances, matching
from meshscope.analysis.crossrank import clocks
from meshscope.analysis.crossrank.program import STEP_COLUMNS
from meshscope.analysis.report import spill

# Rows of the instance table held in memory (each piece a frame); past it, every piece is a
# file of the analysis' private folder: ~16 MB of the table, four ranks of a 1.73M-event trace.
IN_MEMORY_ROWS = 65_536
_A2A = "all_to_all"


class _Pieces:
    """(rank, step) → (frame, the rows' positions in the rank), in memory until the rows
    pass ``IN_MEMORY_ROWS``, then on disk."""

    def __init__(self, parent: pathlib.Path | None):
        self._parent = parent
        self._held: dict[tuple[int, int], tuple] = {}
        self._store: spill.RankStore | None = None
        self._finalizer: weakref.finalize | None = None
        self.rows = 0

    def put(self, key: tuple[int, int], frame: pd.DataFrame, pos: np.ndarray,
            new: bool = True) -> None:
        if new:
            self.rows += len(frame)
        if self._store is None and self.rows > IN_MEMORY_ROWS:
            self._store = spill.RankStore(self._parent)
            self._finalizer = weakref.finalize(self, self._store.close)
            for k, v in self._held.items():
                self._store.write(("inst",) + k, v)
            self._held.clear()
        if self._store is None:
            self._held[key] = (frame, pos)
        else:
            self._store.write(("inst",) + key, (frame, pos))

    def get(self, key: tuple[int, int]) -> tuple[pd.DataFrame, np.ndarray]:
        return self._held[key] if self._store is None else self._store.read(("inst",) + key)

    def close(self) -> None:
        self._held.clear()
        if self._finalizer is not None:
            self._finalizer()


class InstanceBlocks:
    """The instance table in (rank, step) pieces (module docstring)."""

    def __init__(self, parent: pathlib.Path | None = None):
        self._pieces = _Pieces(parent)
        self.stats = matching.MatchStats()
        self._ranks: list[int] = []                  # in the table's order
        self._steps_of: dict[int, list[int]] = {}    # rank → its steps, ascending
        self._heads: list[pd.DataFrame] = []         # each table's columns, without rows
        self._table_of: dict[int, int] = {}          # rank → the table its rows came in
        # rank → the columns whose type its table's differs from the whole table's, and that
        # type (a column of nulls in one table, of text in another: pandas' object column)
        self._retype: dict[int, dict] = {}
        self._blocks: list[list[int]] = []           # the steps read together, in order
        self._empty: pd.DataFrame = instances.empty()
        self._plan: matching.Plan | None = None
        self._aligned = False
        self.ops: dict[str, str] = {}
        self.a2a_bytes: dict[tuple[int, str], float] = {}

    @classmethod
    def collect(cls, tables: Iterable[pd.DataFrame],
                parent: pathlib.Path | None = None) -> "InstanceBlocks":
        """The pieces of ``tables`` (the instance tables of whole ranks, in order)."""
        out = cls(parent)
        for table in tables:
            out._add(table)
        out._done()
        return out

    @property
    def rows(self) -> int:
        return self._pieces.rows

    @property
    def columns(self) -> list[str]:
        """The matched table's columns."""
        return [*instances.INSTANCE_COLUMNS, "match_id"]

    def has_rows(self, rank: int) -> bool:
        return bool(self._steps_of.get(rank))

    def empty_matched(self) -> pd.DataFrame:
        """The matched table without rows (its columns and their types)."""
        return self._finished_empty()

    def close(self) -> None:
        self._pieces.close()

    def _add(self, table: pd.DataFrame) -> None:
        # A copy of the empty slice: the slice itself is a view of the table's consolidated
        # columns that keeps them alive (every rank's table was held until the last was cut:
        # 2.8 MB a rank of the 1.73M-event trace).
        self._heads.append(table.iloc[:0].copy())
        self.stats.feed(table)
        if table.empty:
            return
        pos = table.groupby("rank", sort=False).cumcount().to_numpy(dtype=np.int64)
        for (rank, step), rows in _pieces_of(table):
            if rank not in self._steps_of:
                self._ranks.append(rank)
                self._steps_of[rank] = []
                self._table_of[rank] = len(self._heads) - 1
            self._steps_of[rank].append(step)
            self._pieces.put((rank, step), table.iloc[rows].reset_index(drop=True), pos[rows])

    def _done(self) -> None:
        # The types pandas gives the tables put together (a column of text in one table and
        # of nulls in another is of objects in the whole): each piece of a table whose types
        # differ is given them as it is read, until aligned (``align`` writes every piece
        # back with them).
        dtypes = pd.concat(self._heads, ignore_index=True).dtypes if self._heads \
            else self._empty.dtypes
        odd = [{c: t for c, t in dtypes.items() if head[c].dtype != t}
               for head in self._heads]
        self._retype = {r: odd[i] for r, i in self._table_of.items() if odd[i]}
        self._empty = self._empty.astype(dtypes)
        self._heads = []
        for r in self._ranks:
            self._steps_of[r].sort()
        steps = sorted(set().union(*self._steps_of.values()))
        # A (group, sequence number) in two steps: its id would join rows of two blocks, so
        # every step is read as one block (the whole table, as before issue 51).
        self._blocks = [steps] if self.stats.seq_in_two_steps else [[s] for s in steps]

    # -- reading -------------------------------------------------------------------------

    def _read(self, rank: int, steps: list[int]) -> tuple[pd.DataFrame, np.ndarray]:
        """``rank``'s rows of ``steps`` in its order."""
        got = [self._pieces.get((rank, s)) for s in steps]
        if len(got) == 1:
            frame, pos = got[0]
        else:
            frame = pd.concat([f for f, _ in got], ignore_index=True)
            pos = np.concatenate([p for _, p in got])
            if (np.diff(pos) < 0).any():        # steps that interleave in the rank's order
                order = np.argsort(pos, kind="stable")
                frame, pos = frame.take(order).reset_index(drop=True), pos[order]
        odd = self._retype.get(rank)
        return (frame.astype(odd) if odd else frame), pos

    def _block(self, steps: list[int]) -> tuple[pd.DataFrame, np.ndarray]:
        """Every rank's rows of ``steps``, in the table's order, and each row's place in the
        whole table (``(rank's place) << 32 | its position in the rank``)."""
        wanted = set(steps)
        frames, keys = [], []
        for i, r in enumerate(self._ranks):
            mine = [s for s in self._steps_of[r] if s in wanted]
            if mine:
                frame, pos = self._read(r, mine)
                frames.append(frame)
                keys.append((np.int64(i) << 32) | pos)
        if not frames:
            return self._empty.copy(), np.zeros(0, dtype=np.int64)
        return pd.concat(frames, ignore_index=True), np.concatenate(keys)

    def _write_back(self, block: pd.DataFrame, keys: np.ndarray) -> None:
        """``block``'s rows (``_block``'s, changed in place) as the pieces they came from."""
        pos = keys & 0xFFFFFFFF
        for key, rows in _pieces_of(block):
            self._pieces.put(key, block.iloc[rows].reset_index(drop=True), pos[rows],
                             new=False)

    def rank_rows(self, rank: int, columns: list[str] | None = None) -> pd.DataFrame:
        """``rank``'s rows (``columns`` of them), in its order."""
        steps = self._steps_of.get(rank)
        if not steps:
            frame = self._finished_empty()
        else:
            frame = self._read(rank, steps)[0]
        return frame if columns is None else frame[columns]

    def rows_of(self, rank: int, step: int) -> pd.DataFrame:
        """``program.StepRows``: ``rank``'s aligned rows of ``step``."""
        if step in self._steps_of.get(rank, ()):
            return self._read(rank, [step])[0][STEP_COLUMNS]
        return self._finished_empty()[STEP_COLUMNS]

    def frames(self) -> Iterator[pd.DataFrame]:
        """The whole table, a rank's rows at a time, in its order."""
        for r in self._ranks:
            yield self.rank_rows(r)

    def _finished_empty(self) -> pd.DataFrame:
        empty = self._empty.copy()
        return matching.finish(empty, self._plan) if self._plan is not None else empty

    # -- the passes ----------------------------------------------------------------------

    def plan(self, ranks: list[int], *, world_size: int | None,
             trace_world: int | None) -> matching.Plan:
        """How the table is matched (``matching.MatchStats.plan``)."""
        self._plan = self.stats.plan(ranks, world_size=world_size, trace_world=trace_world)
        return self._plan

    def counts(self) -> matching.CollectiveCounts:
        """The collective rows counted as matched (the run checks')."""
        return self.stats.collective_counts(self._plan)

    def _matched_blocks(self) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
        """Each block with its match ids (once aligned, as kept), in order."""
        assert self._plan is not None, "plan() first"
        for steps in self._blocks:
            block, keys = self._block(steps)
            if not self._aligned:
                matching.finish(block, self._plan)
            yield block, keys

    def clock_offsets(self, ranks: list[int],
                      hosts: dict[int, str | None]) -> pd.DataFrame:
        """``clocks.clock_offsets`` of the matched table: the collectives' ends by rank
        gathered block by block, the point-to-point pairs from the send/recv rows."""
        ends: list[tuple[np.ndarray, np.ndarray]] = []
        p2p = _Gathered()
        for block, keys in self._matched_blocks():
            ends.append(clocks.ends_by_rank(block))
            p2p.add(block, keys, block["p2p"].to_numpy(dtype=bool))
        stacked = clocks.stacked_ends(ends)
        ends.clear()
        return clocks.clock_offsets(None, matching.p2p_table(p2p.frame(self._finished_empty())),
                                    ranks, hosts, ends=stacked)

    def align(self, offsets: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Every block on the common clock (``clocks.shift_instances``) and kept so; the
        collective and point-to-point tables (``matching``) of the aligned table, and what
        the what-if reads of it (``ops``: each match id's op, as ``dict(zip(match_id, op))``
        of the whole table gives it; ``a2a_bytes``: (rank, id) → bytes out of each row of
        an all-to-all)."""
        colls: list[pd.DataFrame] = []
        p2p, a2a = _Gathered(), _Gathered()
        ops: dict[str, str] = {}
        last_unmatched: tuple | None = None         # (key, op) of the last row without an id
        for block, keys in self._matched_blocks():
            clocks.shift_instances(block, offsets)
            self._write_back(block, keys)
            table = matching.collective_table(block)
            if len(table):
                colls.append(table)
            p2p.add(block, keys, block["p2p"].to_numpy(dtype=bool))
            ids = block["match_id"].to_numpy()
            op = block["op"].to_numpy()
            none = ids == ""
            ops.update(zip(ids[~none].tolist(), op[~none].tolist()))
            if none.any():
                at = int(np.flatnonzero(none)[-1])
                if last_unmatched is None or keys[at] > last_unmatched[0]:
                    last_unmatched = (keys[at], op[at])
            with_a2a = list(set(ids[(op == _A2A) & ~none].tolist()))
            a2a.add(block[["rank", "match_id", "out_bytes"]], keys,
                    none | np.isin(ids, with_a2a) if with_a2a else none)
            del block
        self._aligned = True
        self._retype = {}                   # every piece written back with the whole's types
        if last_unmatched is not None:
            ops[""] = last_unmatched[1]
        self.ops = ops
        rows = a2a.frame(self._finished_empty()[["rank", "match_id", "out_bytes"]])
        picked = rows[rows["match_id"].isin([m for m, o in ops.items() if o == _A2A])]
        self.a2a_bytes = {(int(r), m): float(b) for r, m, b in
                          zip(picked["rank"], picked["match_id"], picked["out_bytes"])
                          if not pd.isna(b)}
        if colls:
            collectives = pd.concat(colls, ignore_index=True)
            order = np.argsort(collectives["match_id"].to_numpy(dtype=object), kind="stable")
            collectives = collectives.take(order).reset_index(drop=True)
        else:
            collectives = matching.collective_table(self._finished_empty())
        return collectives, matching.p2p_table(p2p.frame(self._finished_empty()))


def _pieces_of(table: pd.DataFrame) -> Iterator[tuple[tuple[int, int], slice | np.ndarray]]:
    """Each (rank, step) of ``table`` and its rows: a slice where they are one run (a rank's
    rows of a step come together, as the tables and blocks hold them), else positions."""
    rank = table["rank"].to_numpy(dtype=np.int64)
    step = table["step"].to_numpy(dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])])
    if len(set(zip(rank[starts].tolist(), step[starts].tolist()))) == len(starts):
        ends = np.r_[starts[1:], len(table)]
        for a, b in zip(starts.tolist(), ends.tolist()):
            yield (int(rank[a]), int(step[a])), slice(a, b)
        return
    for (r, s), idx in table.groupby(["rank", "step"], sort=False).indices.items():
        yield (int(r), int(s)), idx


class _Gathered:
    """Rows of the blocks gathered in the whole table's order (by their keys)."""

    def __init__(self) -> None:
        self._frames: list[pd.DataFrame] = []
        self._keys: list[np.ndarray] = []

    def add(self, block: pd.DataFrame, keys: np.ndarray, mask: np.ndarray) -> None:
        if mask.any():
            self._frames.append(block.loc[mask])
            self._keys.append(keys[mask])

    def frame(self, empty: pd.DataFrame) -> pd.DataFrame:
        if not self._frames:
            return empty
        out = pd.concat(self._frames, ignore_index=True)
        order = np.argsort(np.concatenate(self._keys), kind="stable")
        return out.take(order).reset_index(drop=True)
