"""Hang and desync verdicts from the Flight Recorder dumps (``comms/rank{R}.json``).

For every process group and sequence number that any rank's buffer holds, the entries of the
group's ranks are compared — the verdicts PyTorch's own ``torchfrtrace`` gives, by the same
rules (``torch/distributed/flight_recorder/components/types.py``):

- ``missing`` — some ranks of the group never reached this sequence number while others did:
  the ranks that did are stuck waiting for them (a hang, or a rank that skipped a collective).
  A rank is missing only past the last sequence number its buffer holds for the group (a
  ring buffer that wrapped has lost old entries; that is not a hang).
- ``mismatch`` — every rank has the entry, but they disagree in a way the op does not allow,
  judged by each op's semantics: the op itself; input sizes (except all_to_all, whose splits
  are uneven by design, and scatter, whose non-root ranks have no input); output sizes (except
  all_to_all and gather); all_reduce's input equal to its output; dtypes (scatter, gather and
  broadcast roots excepted); and for all_to_all, that the ranks' inputs add up to their
  outputs (what one sends, another receives). An all_gather's or reduce_scatter's input and
  output shapes differ by design, and backends record them differently (gloo writes the output
  of a coalesced all_gather as one ``[1, …]`` tensor of the input's size): unlike
  ``torchfrtrace``, no rule relates them on one rank — their ranks must agree, that is all.
- ``state`` — the ranks' entries are in different states (some completed, others still
  scheduled or started): listed for the health page, not a verdict on its own.

Send/recv entries are not compared (their pairing needs the peer; gloo does not record them).

``diagnose(records, run, steps)`` — the dumps as the report read them, one compact table
(``fr_table.FlightRecords``), and the step timers (``analysis/report/inputs.py``) — returns one
row per problem (``COLUMNS``): process_group
(torch's name), group_desc, seq, kind (``collective``), op, verdict, ranks_present,
ranks_missing, last_seq_of_missing (rank → the last sequence number it reached in the group),
detail (one line; for missing ranks the last step their timers finished and their last
recorded operation). It is empty for a healthy run. A rank without a usable dump is left out of
every comparison rather than called missing. Where ranks disagree, the lowest rank's entry is
the one the others are compared with, and its op is the row's ``op``. The rows come in the
order the collectives were issued: by the earliest ``time_created_ns`` among the ranks that
issued each (so the first row is the earliest collective some ranks never reached, whatever
its group is called), by group and sequence number where the dumps hold no time.

A group's members come from run.json, else the dumps' ``pg_config`` (NCCL fills it), else —
gloo leaves it empty, and PyTorch's own dumps come without run.json — they are the ranks whose
buffers hold one of its collectives (the default group: every rank that left a dump).

``hang(verdicts)`` — what the ``missing`` rows say together (``Hang``): every hung rank (one
missing from a collective while waiting in no collective issued earlier) and, per group, the
first collective its hung ranks never reached; the ranks that only wait are named apart.

Only the sequence numbers where something can be wrong are looked at one by one: those some
rank of the group lacks, and those whose ranks hold different signatures or states, or one
signature that disagrees with itself (an all_reduce whose input is not its output). A healthy
run of a thousand ranks with thousands of entries each is judged in whole-table operations.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from meshscope.collectors.run_info import RunInfo

from .fr_table import FlightRecords, Signature

COLUMNS = ["process_group", "group_desc", "seq", "kind", "op", "verdict", "ranks_present",
           "ranks_missing", "last_seq_of_missing", "detail"]
_NO_INPUT_CHECK = ("all_to_all", "scatter")
_NO_OUTPUT_CHECK = ("all_to_all", "gather")


def _op(sig: Signature) -> str:
    """``gloo:all_reduce`` → ``all_reduce``; ``nccl:send 0->1`` → ``send``."""
    return sig.profiling_name.split(":", 1)[-1].split(" ")[0]


def _numel(sizes) -> int | None:
    """Elements of the first tensor of a size list (``[[2, 64]]`` → 128); None when empty."""
    if not isinstance(sizes, list) or not sizes or not isinstance(sizes[0], list):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in sizes[0]):
        return None
    return math.prod(sizes[0])


def _group_ranks(records: FlightRecords, run: RunInfo | None,
                 holders: dict[str, list[int]]) -> dict[str, list[int]]:
    """Process group name → its global ranks: run.json's groups (the default group is every
    rank), else the dumps' ``pg_config`` (NCCL fills it; gloo leaves it empty); without either,
    the default group "0" is every rank that left a dump, and any other group the ranks whose
    buffers hold one of its collectives (``holders``: a rank that issued one of a group's
    collectives is its member, and missing where its buffer stops short of the others')."""
    out: dict[str, list[int]] = {}
    if run is not None:
        out["0"] = list(range(run.world_size))
        for g in run.process_groups:
            if g.name is not None:
                out[g.name] = list(g.ranks)
    for name, ranks in records.pg_ranks.items():
        out.setdefault(name, ranks)
    out.setdefault("0", records.ranks)          # the default group spans every rank
    for name, ranks in holders.items():
        out.setdefault(name, ranks)
    return out


def _last_steps(steps: pd.DataFrame) -> dict[int, int]:
    if steps.empty:
        return {}
    return {int(r): int(s) for r, s in steps.groupby("rank")["step"].max().items()}


def mismatch(by_rank: dict[int, Signature], group_size: int) -> str | None:
    """Why the entries of one collective disagree (module docstring), or None; the first rank
    of ``by_rank`` is the one the others are compared with."""
    entries = list(by_rank.items())
    ops = {_op(e) for _, e in entries}
    if len(ops) > 1:
        return "ranks issued different ops: " + ", ".join(
            f"rank {r}: {e.profiling_name}" for r, e in entries)
    op = ops.pop()
    ref_rank, ref = entries[0]
    for r, e in entries[1:]:
        if op not in _NO_INPUT_CHECK and e.input_sizes != ref.input_sizes:
            return (f"{op} input sizes differ: rank {ref_rank} {ref.input_sizes}, "
                    f"rank {r} {e.input_sizes}")
        if op not in _NO_OUTPUT_CHECK and e.output_sizes != ref.output_sizes:
            return (f"{op} output sizes differ: rank {ref_rank} {ref.output_sizes}, "
                    f"rank {r} {e.output_sizes}")
    for r, e in entries:
        if op in ("all_reduce", "allreduce_coalesced") and e.input_sizes != e.output_sizes:
            return f"all_reduce on rank {r}: input {e.input_sizes} ≠ output {e.output_sizes}"
    if op not in ("scatter", "gather", "broadcast"):
        dtypes = {(tuple(e.input_dtypes or []), tuple(e.output_dtypes or []))
                  for _, e in entries if e.input_sizes and e.output_sizes}
        if len({d for d, _ in dtypes}) > 1 or len({d for _, d in dtypes}) > 1:
            return f"{op}: ranks disagree on dtypes {sorted(dtypes)}"
    if op == "all_to_all":
        total_in = [_numel(e.input_sizes) for _, e in entries]
        total_out = [_numel(e.output_sizes) for _, e in entries]
        if None not in total_in and None not in total_out and len(entries) == group_size \
                and sum(total_in) != sum(total_out):
            return (f"all_to_all: the ranks send {sum(total_in)} elements in all but receive "
                    f"{sum(total_out)} — their split sizes disagree (" + ", ".join(
                        f"rank {r}: in {i}, out {o}" for (r, _), i, o in
                        zip(entries, total_in, total_out)) + ")")
    return None


def _newest(pg: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Positions of one rank's entries, the newest of each (group, sequence number)."""
    if not len(seq):                            # a rank whose buffer holds no collective
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((seq, pg))               # stable: equal keys stay in buffer order
    pg, seq = pg[order], seq[order]
    last = np.r_[(pg[1:] != pg[:-1]) | (seq[1:] != seq[:-1]), True]
    return order[last]


def _collectives(records: FlightRecords) -> tuple[dict[str, np.ndarray], dict]:
    """The collective entries, one per (group, sequence number, rank) — a rank's newest where
    its buffer holds two — ordered by group name and description, sequence number and rank:
    the columns rank, pg, seq, sig, state and created_ns; and (group name, rank) → the last
    sequence number the rank's buffer holds in the group."""
    keys = ("rank", "pg", "seq", "sig", "state", "created_ns")
    parts: dict[str, list] = {k: [] for k in keys}
    held: dict[tuple[str, int], int] = {}
    for r in records.ranks:
        c = records.entries_of(r)
        mine = np.flatnonzero(~c["p2p"])
        mine = mine[_newest(c["pg"][mine], c["seq"][mine])]     # by group, then seq
        pg, seq = c["pg"][mine], c["seq"][mine]
        ends = np.flatnonzero(np.r_[pg[1:] != pg[:-1], True]) if len(pg) else []
        for i in list(ends):                    # the last (highest) seq of each group
            name = records.groups[pg[i]][0]
            held[(name, r)] = max(int(seq[i]), held.get((name, r), -1))
        parts["rank"].append(np.full(len(mine), r, dtype=np.int32))
        for k in keys[1:]:
            parts[k].append(c[k][mine])
    cols = {k: np.concatenate(v) if v else np.array([], dtype=np.int64)
            for k, v in parts.items()}
    del parts
    by_name = sorted(range(len(records.groups)), key=lambda i: records.groups[i])
    pg_order = np.empty(max(len(by_name), 1), dtype=np.int32)
    pg_order[by_name] = np.arange(len(by_name), dtype=np.int32)
    # Stable, and the ranks were concatenated in order: rank order within each key.
    order = np.lexsort((cols["seq"], pg_order[cols["pg"]]))
    for k in keys:                              # one column at a time: one copy in flight
        cols[k] = cols[k][order]
    return cols, held


def diagnose(records: FlightRecords, run: RunInfo | None, steps: pd.DataFrame) -> pd.DataFrame:
    """The verdict table (module docstring)."""
    last_step = _last_steps(steps)
    c, held = _collectives(records)
    if not len(c["seq"]):
        return pd.DataFrame([], columns=COLUMNS)
    keys = _keys(records, run, c, held)
    rows_out = []
    for k in np.flatnonzero(keys.lacking | keys.odd).tolist():
        rows_out += _verdicts(records, c, keys, k, held, last_step)
    # Earliest issued first (stable: by group and sequence number where times are equal; those
    # without a time last).
    rows_out.sort(key=lambda row: row["_created"])
    return pd.DataFrame(rows_out, columns=COLUMNS)


@dataclasses.dataclass(frozen=True)
class _Keys:
    """The collective entries' (group, sequence number) keys: where each key's rows start and
    end, its group, when it was first issued, whether ranks of its group lack it
    (``lacking``) or its ranks disagree on it (``odd``), and each group's members that left a
    dump (``group_of``, by group code)."""
    starts: np.ndarray
    ends: np.ndarray
    pg: np.ndarray
    created: np.ndarray
    lacking: np.ndarray
    odd: np.ndarray
    group_of: dict


def _keys(records: FlightRecords, run: RunInfo | None, c: dict[str, np.ndarray],
          held: dict) -> _Keys:
    """The keys of the entries ``c`` (``_collectives``), each judged in its group: its
    members that left a dump (a group unknown to run.json and the dumps is the ranks that
    hold it), and how many of them hold the key."""
    holders: dict[str, list[int]] = {}
    for name, r in held:
        holders.setdefault(name, []).append(r)
    members = _group_ranks(records, run, {n: sorted(set(rs)) for n, rs in holders.items()})
    names = [n for n, _ in records.groups]
    with_dump = set(records.ranks)
    pg, seq, rank, sig, state = (c[k] for k in ("pg", "seq", "rank", "sig", "state"))
    starts = np.flatnonzero(np.r_[True, (pg[1:] != pg[:-1]) | (seq[1:] != seq[:-1])])
    ends = np.r_[starts[1:], len(seq)]
    group_of = {}
    in_group = np.ones(len(seq), dtype=bool)
    size = np.zeros(len(starts), dtype=np.int64)
    key_pg = pg[starts]
    for code in np.unique(pg):
        name = names[code]
        if name not in members:
            continue
        group_of[code] = [r for r in members[name] if r in with_dump]
        mask = np.zeros(max(rank.max(), max(group_of[code], default=0)) + 1, dtype=bool)
        mask[group_of[code]] = True
        rows = pg == code
        in_group[rows] = mask[rank[rows]]
        size[key_pg == code] = len(group_of[code])
    count = ends - starts
    # When each key was first issued: the earliest creation time among the ranks holding it.
    never = np.iinfo(np.int64).max
    created = np.minimum.reduceat(np.where(c["created_ns"] < 0, never, c["created_ns"]), starts)
    held_in = np.add.reduceat(in_group.astype(np.int64), starts)
    known = np.isin(key_pg, list(group_of))
    uniform_sig = np.minimum.reduceat(sig, starts) == np.maximum.reduceat(sig, starts)
    uniform_state = np.minimum.reduceat(state, starts) == np.maximum.reduceat(state, starts)
    suspect = np.array([mismatch({0: s, 1: s}, 2) is not None for s in records.signatures])
    return _Keys(starts=starts, ends=ends, pg=key_pg, created=created,
                 lacking=known & (held_in < size),
                 odd=(count >= 2) & (~uniform_sig | suspect[sig[starts]] | ~uniform_state),
                 group_of=group_of)


def _verdicts(records: FlightRecords, c: dict[str, np.ndarray], keys: _Keys, k: int,
              held: dict, last_step: dict) -> list[dict]:
    """The verdict rows of key ``k``: the ranks of its group that never reached it
    (``missing``), else its ranks' disagreement on what it is (``mismatch``) or on its state
    (``state``)."""
    a, b = keys.starts[k], keys.ends[k]
    name, desc = records.groups[keys.pg[k]]
    s = int(c["seq"][a])
    present = c["rank"][a:b].tolist()
    by_rank = {r: records.signatures[x] for r, x in zip(present, c["sig"][a:b].tolist())}
    first = by_rank[present[0]]
    base = {"process_group": name, "group_desc": desc, "seq": s, "kind": "collective",
            "op": first.profiling_name, "ranks_present": present,
            "_created": int(keys.created[k])}
    group = keys.group_of.get(keys.pg[k], present)
    have = set(present)
    missing = [r for r in group if r not in have
               and s > held.get((name, r), -1)] if keys.lacking[k] else []
    if missing:
        where = "; ".join(          # the step only where there are step timers
            (f"rank {r} last finished step {last_step.get(r, 'none')}, its last operation "
             if last_step else f"rank {r}'s last operation ") + records.last_op[r]
            for r in missing)
        return [{**base, "verdict": "missing", "ranks_missing": missing,
                 "last_seq_of_missing": {r: held.get((name, r), -1) for r in missing},
                 "detail": f"ranks {missing} of group {name} ({desc}) never reached "
                           f"sequence number {s} ({first.profiling_name}); {where}"}]
    if len(present) < 2:
        return []
    out = []
    why = mismatch(by_rank, len(group) or len(present))
    if why:
        out.append({**base, "verdict": "mismatch", "ranks_missing": [],
                    "last_seq_of_missing": {},
                    "detail": f"group {name} ({desc}) sequence number {s}: {why}"})
    states = [records.states[x] for x in c["state"][a:b].tolist()]
    if len(set(states)) > 1:
        out.append({**base, "verdict": "state", "ranks_missing": [],
                    "last_seq_of_missing": {},
                    "detail": "states " + ", ".join(f"rank {r}: {x}" for r, x in
                                                    zip(present, states))})
    return out


# -- the hang, from the verdicts ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FirstMissed:
    """A process group's first collective that some of its ranks never reached."""
    process_group: str
    group_desc: str
    seq: int
    op: str
    ranks_missing: list[int]


@dataclasses.dataclass(frozen=True)
class Hang:
    """What the ``missing`` verdicts say together (``hang``)."""
    hung_ranks: list[int]       # ranks that never reached a collective while waiting in none
    first: list[FirstMissed]    # per group, the first collective its hung ranks never reached,
                                # earliest issued first: first[0] is the earliest of all
    waiting_ranks: list[int]    # ranks missing from a collective only because they wait in
                                # one issued earlier
    count: int                  # missing verdicts in all


def _ranks(v) -> list[int]:
    return [int(r) for r in (v.tolist() if hasattr(v, "tolist") else v)]


def hang(verdicts: pd.DataFrame | None) -> Hang | None:
    """The hang the ``missing`` verdicts describe, None when there is none.

    The verdicts come earliest issued first (``diagnose``). A rank missing from a collective
    is **hung** unless it issued, earlier, a collective that others never reached: then it
    waits there, and its absence from the later one follows (it is a **waiting** rank). So
    the ranks missing from the earliest collective are hung, and so is every other rank that
    never reached a collective without waiting in an earlier one — two ranks stuck before one
    all_to_all are both named, whichever groups they are in, while the peers they hold up are
    not. ``first``: for each group, its first collective (by sequence number) from which a
    hung rank is missing, in the verdicts' order."""
    if verdicts is None or verdicts.empty:
        return None
    rows = verdicts[verdicts["verdict"] == "missing"]
    if rows.empty:
        return None
    present = [set(_ranks(v)) for v in rows["ranks_present"]]
    missing = [_ranks(v) for v in rows["ranks_missing"]]
    hung: set[int] = set()
    waiting_before: set[int] = set()        # ranks that issued a collective judged earlier
    for here, gone in zip(present, missing):
        hung.update(r for r in gone if r not in waiting_before)
        waiting_before |= here
    first: dict[str, FirstMissed] = {}
    for gone, row in zip(missing, rows.itertuples(index=False)):
        ours = [r for r in gone if r in hung]
        name = str(row.process_group)
        if ours and (name not in first or int(row.seq) < first[name].seq):
            first[name] = FirstMissed(name, str(row.group_desc), int(row.seq), str(row.op),
                                      ours)
    waiting = sorted({r for gone in missing for r in gone} - hung)
    return Hang(sorted(hung), list(first.values()), waiting, len(rows))
