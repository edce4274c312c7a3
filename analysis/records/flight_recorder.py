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

``diagnose(dumps, run, steps)`` — the dumps and step timers the report read
(``analysis/report/inputs.py``) — returns one row per problem (``COLUMNS``): process_group
(torch's name), group_desc, seq, kind (``collective``), op, verdict, ranks_present,
ranks_missing, last_seq_of_missing (rank → the last sequence number it reached in the group),
detail (one line; for missing ranks the last step their timers finished and their last
recorded operation). It is empty for a healthy run. A rank without a usable dump is left out of
every comparison rather than called missing.
"""
from __future__ import annotations

import math

import pandas as pd

from meshscope.collectors.run_info import RunInfo

COLUMNS = ["process_group", "group_desc", "seq", "kind", "op", "verdict", "ranks_present",
           "ranks_missing", "last_seq_of_missing", "detail"]
_NO_INPUT_CHECK = ("all_to_all", "scatter")
_NO_OUTPUT_CHECK = ("all_to_all", "gather")


def _op(entry: dict) -> str:
    """``gloo:all_reduce`` → ``all_reduce``; ``nccl:send 0->1`` → ``send``."""
    name = str(entry.get("profiling_name", ""))
    return name.split(":", 1)[-1].split(" ")[0]


def _numel(sizes) -> int | None:
    """Elements of the first tensor of a size list (``[[2, 64]]`` → 128); None when empty."""
    if not isinstance(sizes, list) or not sizes or not isinstance(sizes[0], list):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in sizes[0]):
        return None
    return math.prod(sizes[0])


def _group_ranks(dumps: dict[int, dict], run: RunInfo | None) -> dict[str, list[int]]:
    """Process group name → its global ranks: run.json's groups (the default group is every
    rank), else the dumps' ``pg_config`` (NCCL fills it; gloo leaves it empty); without either,
    the default group "0" is every rank that left a dump."""
    out: dict[str, list[int]] = {}
    if run is not None:
        out["0"] = list(range(run.world_size))
        for g in run.process_groups:
            if g.name is not None:
                out[g.name] = list(g.ranks)
    for d in dumps.values():
        fr = d.get("flight_recorder") or {}
        for name, cfg in (fr.get("pg_config") or {}).items():
            ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
            if isinstance(ranks, str):
                ranks = [int(x) for x in ranks.strip("[]").split(",") if x.strip().isdigit()]
            if ranks and str(name) not in out:
                out[str(name)] = sorted(int(r) for r in ranks)
    out.setdefault("0", sorted(dumps))          # the default group spans every rank
    return out


def _last_steps(steps: pd.DataFrame) -> dict[int, int]:
    if steps.empty:
        return {}
    return {int(r): int(s) for r, s in steps.groupby("rank")["step"].max().items()}


def _entries(dump: dict) -> list[dict]:
    return [e for e in (dump.get("flight_recorder") or {}).get("entries") or []
            if isinstance(e, dict)]


def _last_op(dump: dict) -> str:
    entries = _entries(dump)
    if not entries:
        return "no recorded operation"
    e = entries[-1]
    seq = e.get("p2p_seq_id") if e.get("is_p2p") else e.get("collective_seq_id")
    pg = e.get("process_group") or ["?", "?"]
    return f"{e.get('profiling_name')} #{seq} in group {pg[0]} ({pg[1]}), {e.get('state')}"


def mismatch(by_rank: dict[int, dict], group_size: int) -> str | None:
    """Why the entries of one collective disagree (module docstring), or None."""
    entries = list(by_rank.items())
    ops = {_op(e) for _, e in entries}
    if len(ops) > 1:
        return f"ranks issued different ops: " + ", ".join(
            f"rank {r}: {e.get('profiling_name')}" for r, e in entries)
    op = ops.pop()
    ref_rank, ref = entries[0]
    for r, e in entries[1:]:
        if op not in _NO_INPUT_CHECK and e.get("input_sizes") != ref.get("input_sizes"):
            return (f"{op} input sizes differ: rank {ref_rank} {ref.get('input_sizes')}, "
                    f"rank {r} {e.get('input_sizes')}")
        if op not in _NO_OUTPUT_CHECK and e.get("output_sizes") != ref.get("output_sizes"):
            return (f"{op} output sizes differ: rank {ref_rank} {ref.get('output_sizes')}, "
                    f"rank {r} {e.get('output_sizes')}")
    for r, e in entries:
        if op in ("all_reduce", "allreduce_coalesced") and \
                e.get("input_sizes") != e.get("output_sizes"):
            return f"all_reduce on rank {r}: input {e.get('input_sizes')} ≠ output " \
                   f"{e.get('output_sizes')}"
    if op not in ("scatter", "gather", "broadcast"):
        dtypes = {(tuple(e.get("input_dtypes") or []), tuple(e.get("output_dtypes") or []))
                  for _, e in entries if e.get("input_sizes") and e.get("output_sizes")}
        if len({d for d, _ in dtypes}) > 1 or len({d for _, d in dtypes}) > 1:
            return f"{op}: ranks disagree on dtypes {sorted(dtypes)}"
    if op == "all_to_all":
        total_in = [_numel(e.get("input_sizes")) for _, e in entries]
        total_out = [_numel(e.get("output_sizes")) for _, e in entries]
        if None not in total_in and None not in total_out and len(entries) == group_size \
                and sum(total_in) != sum(total_out):
            return (f"all_to_all: the ranks send {sum(total_in)} elements in all but receive "
                    f"{sum(total_out)} — their split sizes disagree (" + ", ".join(
                        f"rank {r}: in {i}, out {o}" for (r, _), i, o in
                        zip(entries, total_in, total_out)) + ")")
    return None


def diagnose(dumps: dict[int, dict], run: RunInfo | None, steps: pd.DataFrame) -> pd.DataFrame:
    """The verdict table (module docstring)."""
    members = _group_ranks(dumps, run)
    last_step = _last_steps(steps)
    seen: dict[tuple, dict[int, dict]] = {}
    held: dict[tuple, tuple[int, int]] = {}          # (pg, rank) → (first, last) seq held
    for rank, d in dumps.items():
        for e in _entries(d):
            if e.get("is_p2p"):
                continue
            pg = e.get("process_group")
            seq = e.get("collective_seq_id")
            if not (isinstance(pg, list) and len(pg) == 2) or not isinstance(seq, int):
                continue
            key = (str(pg[0]), str(pg[1]), seq)
            seen.setdefault(key, {})[rank] = e
            lo, hi = held.get((key[0], rank), (seq, seq))
            held[(key[0], rank)] = (min(lo, seq), max(hi, seq))
    rows = []
    for (pg, desc, seq), by_rank in sorted(seen.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        group = [r for r in members.get(pg, sorted(by_rank)) if r in dumps]
        present = sorted(by_rank)
        any_entry = next(iter(by_rank.values()))
        base = {"process_group": pg, "group_desc": desc, "seq": seq, "kind": "collective",
                "op": any_entry.get("profiling_name"), "ranks_present": present}
        missing = [r for r in group if r not in by_rank
                   and seq > held.get((pg, r), (-1, -1))[1]]
        if missing:
            where = "; ".join(
                f"rank {r} last finished step {last_step.get(r, 'none')}, its last operation "
                f"{_last_op(dumps[r])}" for r in missing)
            rows.append({**base, "verdict": "missing", "ranks_missing": missing,
                         "last_seq_of_missing": {r: held.get((pg, r), (-1, -1))[1]
                                                 for r in missing},
                         "detail": f"ranks {missing} of group {pg} ({desc}) never reached "
                                   f"sequence number {seq} ({any_entry.get('profiling_name')}); "
                                   f"{where}"})
            continue
        if len(by_rank) < 2:
            continue
        why = mismatch(by_rank, len(group) or len(by_rank))
        if why:
            rows.append({**base, "verdict": "mismatch", "ranks_missing": [],
                         "last_seq_of_missing": {},
                         "detail": f"group {pg} ({desc}) sequence number {seq}: {why}"})
        states = {e.get("state") for e in by_rank.values()}
        if len(states) > 1:
            rows.append({**base, "verdict": "state", "ranks_missing": [],
                         "last_seq_of_missing": {},
                         "detail": "states " + ", ".join(f"rank {r}: {e.get('state')}"
                                                         for r, e in sorted(by_rank.items()))})
    return pd.DataFrame(rows, columns=COLUMNS)
