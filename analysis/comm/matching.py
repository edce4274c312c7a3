"""One operation seen from every rank: matching the instance table across ranks.

``match(instances, ranks, ...)`` gives every row of the instance table
(``analysis/comm/instances.py``) a ``match_id`` shared by the rows of all ranks that took part
in the same operation, and says how it matched:

- **by (group, sequence number)** where the trace or the Flight Recorder gives every op of the
  group, on all its ranks, its ``seq`` (``matched_on = "group_seq"``);
- else **by (group, step, op, k)**, the k-th op of that kind the rank issued on that group in
  that step: the ranks of a group issue its collectives in the same order
  (``"group_order"``);
- a send and the matching recv by (sender, receiver, step, k): the k-th message from one rank
  to the other in the step;
- with no group information at all (no run.json, no group arguments), when every rank of a job
  has a trace (the ``distributedInfo`` world size equals the number of rank files) and all issue
  the same sequence of collectives, on the **world group** (``"world"``; the report says so).

``why_not`` lists what prevents matching (ranks of a group without a trace, ranks that saw
different numbers of an op in a step — a trace cut short or subsampled — or no group at all);
when it is not empty no cross-rank figure is computed.

``match`` is three parts, so that a caller can match a table it never holds whole (the
cross-rank stage, ``report/instance_blocks``): ``MatchStats`` gathers what the decision needs
of every row, a table of whole ranks at a time; its ``plan`` decides (``Plan``: the world
group or not, the groups matched by sequence number, ``matched_on``, ``why_not``); ``finish``
applies it to any rows that hold whole (rank, step) pieces. ``CollectiveCounts``, the
collectives counted per group, step, op and rank, is what the run checks read of the table.

``collective_table(instances)`` — one row per matched collective (times on aligned clocks):
match_id, pg_ranks, dim, step, op, seq, k, n_ranks, first_arrival_us, last_arrival_us,
skew_us (last − first arrival), holdup_us (last − second-last arrival: how long the last
rank alone held the group up), last_rank, completion_us (median over ranks of the end),
transfer_us, after_last_us, msg_bytes. **Transfer** (what the bandwidth report divides the
bytes by): the shortest executing span over the group's ranks — the rank that
arrived last waited for nobody, so its span is the operation itself (nccl-tests' time); the
rest of every other rank's span is waiting. Without executing spans, completion − last arrival.
after_last_us: completion − last arrival (at least 0), how long the operation took to finish
once its last rank arrived — what the dependency graph replays (``analysis/crossrank/graph.py``,
``Operation.after_last_us``), not a transfer: it exceeds transfer_us when the last rank's
backend started the operation late.

``p2p_table(instances)`` — one row per matched send/recv pair: match_id, src, dst, step, k, dim,
send_us (the sender's post), recv_us (the receiver's post), completion_us (the recv's end),
after_last_us (completion − max(send, recv post), at least 0: what the dependency graph
replays as the message's duration once both sides are there), send_wait_us, recv_wait_us,
transfer_us, msg_bytes.

**Transfer is not waiting** (issue 23). A receive posted before its sender spends that time
waiting (``recv_wait_us`` = the send's post − the receive's executing start, within its span);
a send posted before its receiver likewise (``send_wait_us``). The transfer itself is known
only where both sides' executing spans *are* the transfer — device kernels (``source``
``nccl`` / ``custom-kernel``), which spin until the peer's kernel is there and end when the
message has moved: transfer_us = the time both kernels run together (the earlier end − the
later start), when that is positive and neither kernel holds another send/recv of its rank (a
grouped send/recv kernel carries the whole batch, not this message). Everywhere else it is
null and the bandwidth report leaves busbw empty: on gloo the ``gloo:send`` / ``gloo:recv``
ranges of ``isend``/``irecv`` (what ``torch.distributed.pipelining`` issues, batched) are the
calling thread's wait for asynchronous work — a run's receive can end before the matching
``gloo:send`` range even starts, and a batched receive ends with its whole batch — so no
span of the trace is the message's transfer, and a bandwidth from any of them is a waiting
figure (pp send/recv showed 0.009 GB/s on the slow-rank sample).
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pandas as pd

from meshscope.analysis.codes import id_codes
from meshscope.analysis.rank_text import ranges
from meshscope.collectors.run_info import ranks_key

COLLECTIVE_COLUMNS = ["match_id", "pg_ranks", "dim", "step", "op", "seq", "k", "n_ranks",
                      "first_arrival_us", "last_arrival_us", "skew_us", "holdup_us",
                      "last_rank", "completion_us", "transfer_us", "after_last_us", "msg_bytes"]
P2P_COLUMNS = ["match_id", "src", "dst", "step", "k", "dim", "send_us", "recv_us",
               "completion_us", "after_last_us", "send_wait_us", "recv_wait_us", "transfer_us",
               "msg_bytes"]
#: Columns held as shared Python strings (an object column) while the analysis runs and
#: written as text (pandas' ``str``), as they were before they were shared (``_ids``).
WRITTEN_AS_TEXT = ("match_id",)
#: Instance sources whose executing span is a device kernel that runs only while the message
#: moves (once both sides' kernels are there): the only spans a p2p transfer can be read from.
KERNEL_SOURCES = ("nccl", "custom-kernel")


@dataclasses.dataclass
class Matched:
    instances: pd.DataFrame      # the instance table with ``match_id`` ("" where unmatched)
    matched_on: str | None
    why_not: list[str]
    notes: list[str]


# A group's ranks are written out in full in ``pg_ranks``; in a match id a group of many ranks
# is named by a short token instead (its first and last rank, its size and a digest of the
# full list), so that ids stay a few dozen bytes however large the job: a data-parallel group
# of 512 ranks is 2 kB of text, and every row of its ranks carried it in its id.
_SPELLED_OUT = 64


def group_token(ranks_key: str) -> str:
    """How match ids name the group of ``ranks_key`` (``"0,1"``): the key itself up to
    ``_SPELLED_OUT`` characters, else ``"FIRST..LAST/N#DIGEST"`` (12 hex digits of BLAKE2b of
    the whole key: two different groups of one job never share a token in practice)."""
    if len(ranks_key) <= _SPELLED_OUT:
        return ranks_key
    members = ranks_key.split(",")
    digest = hashlib.blake2b(ranks_key.encode(), digest_size=6).hexdigest()
    return f"{members[0]}..{members[-1]}/{len(members)}#{digest}"


def _group_keys(inst: pd.DataFrame) -> np.ndarray:
    """Each row's group as match ids name it: ``group_token`` of its ranks, else
    ``name=<pg_name>``, else "" (no group). Worked out once per distinct group."""
    known: dict = {}
    out = np.empty(len(inst), dtype=object)
    for i, key in enumerate(zip(inst["pg_ranks"], inst["pg_name"])):
        token = known.get(key)
        if token is None:
            ranks, name = key
            token = known[key] = group_token(ranks) if isinstance(ranks, str) and ranks else \
                (f"name={name}" if isinstance(name, str) else "")
        out[i] = token
    return out


def _ids(inst: pd.DataFrame, groups: np.ndarray, by_seq: set[str]) -> pd.Series:
    """Every row's match id: ``GROUP|seq=N`` for a group matched by sequence number,
    ``GROUP|STEP|OP|K`` for one matched by order, ``SRC>DST|STEP|K`` for a send or recv (""
    when its peer is unknown).

    One Python string per distinct id, shared by every rank's row of that instance (an
    object column, like ``pg_ranks``): an id names its group (up to ~80 characters,
    ``group_token``), and as text of its own in every row it was that many bytes a row in
    each table that carries it (instances, bandwidth) — about 1 MB a rank of 16,160
    collectives each, where a shared id costs a pointer a row (issue 51).
    ``WRITTEN_AS_TEXT`` turns it back into text where the report is written."""
    shared: dict[str, str] = {}
    ids = []
    for group, p2p, seq, step, op, k, rank, peer in zip(
            groups, inst["p2p"], inst["seq"], inst["step"], inst["op"], inst["k"],
            inst["rank"], inst["peer"]):
        if p2p:
            if pd.isna(peer):
                ids.append("")
                continue
            src, dst = (rank, int(peer)) if op == "send" else (int(peer), rank)
            mid = f"{src}>{dst}|{step}|{k}"
        elif group in by_seq:
            mid = f"{group}|seq={int(seq)}"
        else:
            mid = f"{group}|{step}|{op}|{k}"
        ids.append(shared.setdefault(mid, mid))
    return pd.Series(ids, index=inst.index, dtype=object)


@dataclasses.dataclass(frozen=True)
class CollectiveCounts:
    """An instance table's collective rows counted per (pg_ranks, step, op, rank)
    (``counts``, sorted; pg_ranks "" where a row names no group's ranks), the ranks with any
    row (``present``) and its rows (``rows``): what the run checks read of it
    (``trust/run_checks``), without the table."""
    counts: pd.Series
    present: frozenset[int]
    rows: int

    @classmethod
    def of(cls, inst: pd.DataFrame) -> "CollectiveCounts":
        """Of a whole table (its columns rank, step, op, p2p and pg_ranks)."""
        present = frozenset(int(r) for r in pd.unique(inst["rank"])) if len(inst) else \
            frozenset()
        coll = inst.loc[~inst["p2p"].astype(bool), list(COUNTED_BY)]
        return cls(_counted(coll), present, len(inst))


# What collective rows are counted by (``CollectiveCounts``).
COUNTED_BY = ("pg_ranks", "step", "op", "rank")


def _counted(coll: pd.DataFrame) -> pd.Series:
    return coll.groupby(list(COUNTED_BY)).size()


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the rows of an instance table are matched, decided from all of them
    (``MatchStats.plan``) and applied to any part of whole (rank, step) rows (``finish``):
    ``world``, the world size when the collectives are put on the world group (else None);
    ``by_seq``, the groups (``_group_keys``) matched by sequence number."""
    world: int | None
    by_seq: frozenset[str]
    matched_on: str | None
    why_not: list[str]
    notes: list[str]


class MatchStats:
    """What matching needs to know of every rank's rows before it names any operation,
    gathered a table at a time (``feed``; each table of whole ranks): whether the world-group
    fallback applies (no collective names a group; every rank issued the same sequence of
    (step, op) collectives), which groups have a sequence number on every collective, and
    the collective rows counted per (group's ranks, step, op, rank) (``counts``: what
    ``why_not`` and the run checks' collective counts read). Kept small: a few numbers per
    group, step, op and rank, and one rank's sequence — so that the cross-rank stage can
    match an instance table it never holds whole (issue 51)."""

    def __init__(self) -> None:
        self.rows = 0
        self.present: set[int] = set()          # ranks with any row
        self._has_coll = False
        self._grouped = False                   # a collective names its group
        self._same_sequence = True
        self._sequence: tuple[list, list] | None = None
        self._coll_ranks: set[int] = set()
        self._nogroup = 0
        self._seq_by_key: dict[str, bool] = {}      # ``_group_keys`` → every coll. has seq
        self._seq_by_ranks: dict[str, bool] = {}    # pg_ranks → every coll. has seq
        self._counts: list[pd.Series] = []
        self._seq_step: dict[tuple[str, int], int] = {}   # (group, seq) → its step
        #: Whether one (group, sequence number) is in two steps (on two ranks, or twice on
        #: one): its rows are then not all in one step's rows, which an id by sequence number
        #: would join across steps.
        self.seq_in_two_steps = False

    def feed(self, inst: pd.DataFrame) -> None:
        """The rows of ``inst`` (whole ranks: a rank's rows all in one table)."""
        if inst.empty:
            return
        self.rows += len(inst)
        self.present.update(int(r) for r in pd.unique(inst["rank"]))
        is_coll = ~inst["p2p"].to_numpy(dtype=bool)
        if not is_coll.any():
            return
        self._has_coll = True
        coll = inst.loc[is_coll, ["pg_ranks", "pg_name", "seq", "step", "op", "rank"]]
        named = coll["pg_ranks"] != ""
        self._grouped |= bool(named.any() or coll["pg_name"].notna().any())
        self._nogroup += int((~named & coll["pg_name"].isna()).sum())
        # Each rank's (step, op) sequence against the first one's, one rank at a time (a tuple
        # of every rank's was ~0.3 kB a collective row, held at once).
        for r, g in coll[["rank", "step", "op"]].groupby("rank"):
            self._coll_ranks.add(int(r))
            mine = (g["step"].tolist(), g["op"].tolist())
            if self._sequence is None:
                self._sequence = mine
            elif mine != self._sequence:
                self._same_sequence = False
        has_seq = coll["seq"].notna()
        keys = _group_keys(coll)
        for key, ok in has_seq.groupby(keys).all().items():
            self._seq_by_key[key] = self._seq_by_key.get(key, True) and bool(ok)
        if has_seq.any():
            mask = has_seq.to_numpy()
            seen = pd.DataFrame({"key": keys[mask], "seq": coll["seq"].to_numpy()[mask],
                                 "step": coll["step"].to_numpy()[mask]}).drop_duplicates()
            for key, seq, step in zip(seen["key"], seen["seq"].tolist(), seen["step"].tolist()):
                if self._seq_step.setdefault((key, int(seq)), int(step)) != int(step):
                    self.seq_in_two_steps = True
        for key, ok in has_seq.groupby(coll["pg_ranks"]).all().items():
            self._seq_by_ranks[key] = self._seq_by_ranks.get(key, True) and bool(ok)
        self._counts.append(_counted(coll))

    def counts(self) -> pd.Series:
        """Collective rows per (pg_ranks, step, op, rank), sorted; pg_ranks "" where the
        row names no group's ranks."""
        if not self._counts:
            return pd.Series([], dtype="int64", index=pd.MultiIndex.from_arrays(
                [[]] * len(COUNTED_BY), names=list(COUNTED_BY)))
        if len(self._counts) > 1:
            self._counts = [pd.concat(self._counts).groupby(level=[0, 1, 2, 3]).sum()]
        return self._counts[0]

    def collective_counts(self, plan: "Plan | None") -> CollectiveCounts:
        """``counts`` of the table as ``plan`` matched it: a collective put on the world
        group counted under its ranks."""
        counts = self.counts()
        if plan is not None and plan.world is not None and len(counts):
            frame = counts.rename("n").reset_index()
            frame["pg_ranks"] = frame["pg_ranks"].where(
                frame["pg_ranks"] != "", ranks_key(range(plan.world)))
            counts = frame.groupby(list(COUNTED_BY))["n"].sum().rename(None)
        return CollectiveCounts(counts, frozenset(self.present), self.rows)

    def _world_applies(self, ranks: list[int], trace_world: int | None) -> bool:
        """No op names a group, every rank of the job has a trace, and all ranks issued the
        same sequence of collectives in each step."""
        if not self._has_coll or self._grouped:
            return False
        if trace_world is None or trace_world != len(ranks) or \
                sorted(ranks) != list(range(trace_world)):
            return False
        return self._same_sequence and len(self._coll_ranks) == len(ranks)

    def plan(self, ranks: list[int], *, world_size: int | None,
             trace_world: int | None) -> Plan:
        if world_size is None and self._world_applies(ranks, trace_world):
            world = ranks_key(range(trace_world or 0))
            # Every collective is on the world group, its ranks' sequences the same: nothing
            # for ``why_not`` to name.
            by_seq = frozenset([group_token(world)] if all(self._seq_by_key.values())
                               else [])
            return Plan(trace_world, by_seq, "world", [], [
                f"no process-group information in the traces: collectives were matched "
                f"on the world group (all {len(ranks)} ranks issue the same sequence)"])
        by_seq = frozenset(k for k, ok in self._seq_by_key.items() if ok)
        matched_on = None
        if self.rows and self._has_coll:
            matched_on = "group_seq" if all(self._seq_by_key.values()) else "group_order"
        return Plan(None, by_seq, matched_on, self._why_not(ranks, world_size), [])

    def _why_not(self, ranks: list[int], world_size: int | None) -> list[str]:
        why: list[str] = []
        if not self.rows:
            return why
        if world_size and len(ranks) < world_size:
            why.append(f"only {len(ranks)} of the job's {world_size} ranks have a trace: "
                       f"collectives whose other ranks are absent have nothing to match")
        if self._nogroup:
            why.append(f"{self._nogroup} collectives with no known process group (no "
                       f"run.json and no group arguments on them in the traces)")
        counts = self.counts()
        named = counts[counts.index.get_level_values("pg_ranks") != ""]
        for group, g in named.groupby(level="pg_ranks"):
            members = [int(x) for x in str(group).split(",")]
            absent = [r for r in members if r not in ranks]
            if absent:
                why.append(f"group {{{ranges(members)}}}: {len(absent)} of its "
                           f"{len(members)} ranks have no trace")
                continue
            if self._seq_by_ranks[group]:
                continue
            per_rank = g.droplevel("pg_ranks").unstack("rank")
            uneven = per_rank[per_rank.nunique(axis=1) > 1]
            if not uneven.empty:
                step, op = uneven.index[0]
                seen = uneven.iloc[0].dropna().astype(int)
                told = "; ".join(f"{n} on {'rank' if (seen == n).sum() == 1 else 'ranks'} "
                                 f"{ranges(seen.index[seen == n])}"
                                 for n in sorted(seen.unique(), reverse=True))
                why.append(f"group {{{ranges(members)}}}: ranks saw different numbers of {op} "
                           f"in step {step} ({told}); the traces are incomplete or subsampled")
        return why


def finish(inst: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """``inst`` (whole (rank, step) rows of the table ``plan`` was made of) matched in place:
    put on the world group where ``plan`` says so (its group, size, dimension source and
    order columns written), each row's ``match_id`` added."""
    if inst.empty:
        inst["match_id"] = pd.Series(dtype=str)
        return inst
    if plan.world is not None:
        mask = ~inst["p2p"]
        if mask.any():
            inst.loc[mask, "pg_ranks"] = ranks_key(range(plan.world))
            inst.loc[mask, "group_size"] = plan.world
            # Masked in place of a text array: np.where made every row's dimension source a
            # Python string of its own on the way (issue 51).
            inst["dim_source"] = inst["dim_source"].mask(mask & (inst["dim"] == "unknown"),
                                                         "world")
            keys = ["rank", "step", "op"]
            inst.loc[mask, "k"] = inst.loc[mask, keys].groupby(keys).cumcount()
    inst["match_id"] = _ids(inst, _group_keys(inst), set(plan.by_seq))
    return inst


def match(instances: pd.DataFrame, ranks: list[int], *, world_size: int | None = None,
          trace_world: int | None = None, in_place: bool = False) -> Matched:
    """``instances``: the instance tables of all ranks, concatenated. ``world_size``: the job's
    (run.json's) world size; ``trace_world``: the world size the traces' ``distributedInfo``
    states (for the world-group fallback). ``in_place``: ``instances`` itself is matched (the
    world group's columns written into it, the match id added), for a caller that holds no
    other use for it — not a new table beside it (issue 51: the world group's four columns
    of every rank's rows, twice). The same as ``MatchStats`` fed the whole table, its
    ``plan`` and ``finish``: what the cross-rank stage does a part at a time."""
    # Else a new table sharing ``instances``' columns (pandas copies a column when it is
    # written, copy-on-write), not a deep copy of every rank's rows (issue 51).
    inst = instances if in_place else instances.copy(deep=False)
    stats = MatchStats()
    stats.feed(inst)
    plan = stats.plan(ranks, world_size=world_size, trace_world=trace_world)
    finish(inst, plan)
    return Matched(inst, plan.matched_on, plan.why_not, plan.notes)


# The columns a matched collective takes from its rows: each the first value that is not
# null, in the order of arrival.
_COLLECTIVE_FIRST = ("pg_ranks", "dim", "step", "op", "seq", "k")


def collective_table(inst: pd.DataFrame) -> pd.DataFrame:
    """Per matched collective (module docstring); ``inst`` on aligned clocks.

    Grouped by integer codes of the match ids over the few columns each figure reads, a
    column or two at a time (``_CollectiveRows``): grouping a frame of the read columns by the
    ids themselves held that frame, its sorted copy and a hash table of every row's id at once,
    the largest step of alignment at many ranks (issue 51)."""
    c = _CollectiveRows.of(inst)
    if c is None:
        out = pd.DataFrame(columns=COLLECTIVE_COLUMNS)
        out["seq"] = pd.array([], dtype="Int64")
        out["msg_bytes"] = pd.array([], dtype="Int64")
        return out
    arrival = c.column("arrival_us")
    agg = pd.DataFrame({"n_ranks": c.sizes()}, index=c.index)
    agg["first_arrival_us"] = c.by_id(arrival.groupby(c.codes, sort=False).min())
    agg["last_arrival_us"] = c.by_id(arrival.groupby(c.codes, sort=False).max())
    agg["completion_us"] = c.by_id(c.column("end_us").groupby(c.codes, sort=False).median())
    span = c.column("exec_end_us") - c.column("exec_ts_us")
    agg["span"] = c.by_id(span.groupby(c.codes, sort=False).min())
    del span
    agg["msg_bytes"] = c.by_id(c.column("msg_bytes").groupby(c.codes, sort=False).max())
    # The second-to-last arrival of each (its row's position → its collective).
    second = arrival.groupby(c.codes, sort=False).nth(-2)
    second.index = c.index[c.codes[second.index.to_numpy()]]
    del arrival
    agg["holdup_us"] = agg["last_arrival_us"] - second.reindex(agg.index)
    agg["last_rank"] = c.by_id(c.column("rank").groupby(c.codes, sort=False).last())
    agg["skew_us"] = agg["last_arrival_us"] - agg["first_arrival_us"]
    after = (agg["completion_us"] - agg["last_arrival_us"]).clip(lower=0.0)
    agg["transfer_us"] = agg["span"].where(agg["span"].notna(), after).clip(lower=0.0)
    agg["after_last_us"] = after
    for col in _COLLECTIVE_FIRST:
        agg[col] = c.by_id(c.column(col).groupby(c.codes, sort=False).first())
    out = agg.reset_index()[COLLECTIVE_COLUMNS]
    out["step"] = out["step"].astype("int64")
    out["k"] = out["k"].astype("int64")
    out["last_rank"] = out["last_rank"].astype("int64")
    out["seq"] = pd.array(out["seq"].tolist(), dtype="Int64")
    out["msg_bytes"] = pd.array(out["msg_bytes"].tolist(), dtype="Int64")
    return out


@dataclasses.dataclass(frozen=True)
class _CollectiveRows:
    """The collective rows of an instance table that ``collective_table`` reads: those whose
    match id two ranks or more share, as positions in the table (``rows``) ordered by id, then
    by arrival (stably: rows of equal arrival keep their order in the table); ``codes``, each
    row's collective, 0, 1, … in the ids' sorted order; ``index``, the ids by code (named
    ``match_id``: the collective table's rows, in that order)."""
    inst: pd.DataFrame
    rows: np.ndarray
    codes: np.ndarray
    index: pd.Index

    @classmethod
    def of(cls, inst: pd.DataFrame) -> "_CollectiveRows | None":
        """None where no collective row has an id that two rows share."""
        ids = inst["match_id"].to_numpy()
        rows = np.flatnonzero(~inst["p2p"].to_numpy(dtype=bool) & (ids != ""))
        codes, uniques = id_codes(ids[rows], sort=True)
        if not len(codes):
            return None
        counts = np.bincount(codes)
        shared = counts[codes] >= 2
        if not shared.any():
            return None
        rows, codes = rows[shared], codes[shared]
        order = np.lexsort((inst["arrival_us"].to_numpy(dtype=np.float64)[rows], codes))
        rows, codes = rows[order], codes[order]
        kept = np.flatnonzero(counts >= 2)                  # old code → new, 0, 1, …
        new = np.full(len(counts), -1, dtype=np.int64)
        new[kept] = np.arange(len(kept))
        return cls(inst, rows, new[codes],
                   pd.Index(uniques[kept], name="match_id", dtype=object))

    def column(self, name: str) -> pd.Series:
        """The column ``name`` of the rows, in their order, labelled by position."""
        col = self.inst[name].iloc[self.rows]
        return col.set_axis(pd.RangeIndex(len(col)))

    def sizes(self) -> np.ndarray:
        """Rows per collective, by code."""
        return np.bincount(self.codes)

    def by_id(self, per_code: pd.Series) -> pd.Series:
        """A per-collective result of ``groupby(codes)`` labelled by match id."""
        return per_code.set_axis(self.index[per_code.index.to_numpy()])


def _holds_other_p2p(inst: pd.DataFrame, side: pd.DataFrame) -> np.ndarray:
    """Per row of ``side`` (send or recv rows, in order): does another send/recv of its rank
    execute inside its span — the same span included (a grouped kernel), or overlapping it?"""
    out = np.zeros(len(side), dtype=bool)
    mine = inst[inst["p2p"] & (inst["match_id"] != "")]
    by_rank = {int(r): (g["match_id"].to_numpy(),
                        pd.to_numeric(g["exec_ts_us"], errors="coerce").to_numpy(np.float64),
                        pd.to_numeric(g["exec_end_us"], errors="coerce").to_numpy(np.float64))
               for r, g in mine.groupby("rank")}
    a_all = pd.to_numeric(side["exec_ts_us"], errors="coerce").to_numpy(np.float64)
    b_all = pd.to_numeric(side["exec_end_us"], errors="coerce").to_numpy(np.float64)
    for i, (mid, r, a, b) in enumerate(zip(side.index, side["rank"].to_numpy(), a_all, b_all)):
        if not (np.isfinite(a) and np.isfinite(b)) or int(r) not in by_rank:
            continue
        ids, s, e = by_rank[int(r)]
        out[i] = bool(((s <= b) & (e >= a) & (ids != mid)).any())
    return out


def _kernel_transfer(inst: pd.DataFrame, send: pd.DataFrame, recv: pd.DataFrame) -> np.ndarray:
    """Per pair: the time both sides' kernels ran together (module docstring), NaN where the
    trace cannot separate transfer from waiting."""
    def col(t, c):
        return pd.to_numeric(t[c], errors="coerce").to_numpy(np.float64)
    start = np.maximum(col(send, "exec_ts_us"), col(recv, "exec_ts_us"))
    end = np.minimum(col(send, "exec_end_us"), col(recv, "exec_end_us"))
    kernels = send["source"].isin(KERNEL_SOURCES).to_numpy() & \
        recv["source"].isin(KERNEL_SOURCES).to_numpy()
    ok = kernels & np.isfinite(start) & np.isfinite(end) & (end > start)
    if ok.any():
        ok &= ~_holds_other_p2p(inst, send) & ~_holds_other_p2p(inst, recv)
    return np.where(ok, end - start, np.nan)


def p2p_table(inst: pd.DataFrame) -> pd.DataFrame:
    """Per matched send/recv pair (module docstring); ``inst`` on aligned clocks. A match id
    with other than one send and one receive gives no row; rows in the order the match ids
    first appear in ``inst``."""
    for col in ("exec_ts_us", "exec_end_us"):
        if col not in inst:   # a table without executing spans: no transfer to separate
            inst = inst.assign(**{col: np.nan})
    if "source" not in inst:
        inst = inst.assign(source="")
    p2p = inst[inst["p2p"] & (inst["match_id"] != "")]
    ids = p2p["match_id"]
    sends = ids[p2p["op"] == "send"].value_counts()
    recvs = ids[p2p["op"] == "recv"].value_counts()
    pairs = sends.index[(sends == 1).to_numpy()].intersection(
        recvs.index[(recvs == 1).to_numpy()])
    p2p = p2p[ids.isin(pairs)]
    side = ["match_id", "rank", "step", "k", "dim", "arrival_us", "end_us", "exec_ts_us",
            "exec_end_us", "source", "msg_bytes"]
    send = p2p.loc[p2p["op"] == "send", side].set_index("match_id")
    recv = p2p.loc[p2p["op"] == "recv", side].set_index("match_id")
    ordered = pd.unique(p2p["match_id"])
    send, recv = send.loc[ordered], recv.loc[ordered]
    completion = recv["end_us"].to_numpy(dtype=np.float64)
    send_us = send["arrival_us"].to_numpy(dtype=np.float64)
    recv_us = recv["arrival_us"].to_numpy(dtype=np.float64)

    def waited(own: pd.DataFrame, peer_post: np.ndarray) -> np.ndarray:
        """The part of ``own``'s executing span (else post → end) before the peer's post."""
        a = pd.to_numeric(own["exec_ts_us"], errors="coerce").to_numpy(np.float64)
        a = np.where(np.isfinite(a), a, own["arrival_us"].to_numpy(np.float64))
        b = own["end_us"].to_numpy(np.float64)
        return np.clip(peer_post - a, 0.0, np.maximum(b - a, 0.0))

    msg = send["msg_bytes"].astype("Int64").fillna(recv["msg_bytes"].astype("Int64"))
    out = pd.DataFrame({
        "match_id": send.index.to_numpy(), "src": send["rank"].to_numpy(dtype=np.int64),
        "dst": recv["rank"].to_numpy(dtype=np.int64),
        "step": send["step"].to_numpy(dtype=np.int64), "k": send["k"].to_numpy(dtype=np.int64),
        "dim": send["dim"].to_numpy(), "send_us": send_us, "recv_us": recv_us,
        "completion_us": completion,
        "after_last_us": np.maximum(0.0, completion - np.maximum(send_us, recv_us)),
        "send_wait_us": waited(send, recv_us), "recv_wait_us": waited(recv, send_us),
        "transfer_us": _kernel_transfer(inst, send, recv),
        "msg_bytes": msg.array}, columns=P2P_COLUMNS)
    return out.reset_index(drop=True)
