"""Hang and desync diagnosis from the Flight Recorder dumps (``comms/rank{R}.json``).

For every process group and sequence number seen in any rank's buffer, the ranks of that group
that recorded the operation are compared (the verdicts of PyTorch's ``torchfrtrace``):

- ``missing`` — some ranks of the group never reached this sequence number, while others did:
  the ranks that did are stuck waiting for them (a hang, or a rank that skipped a collective);
- ``mismatch`` — every rank has it, but op, sizes or dtypes differ (a desynchronised program);
- ``state`` — ranks disagree on the state (some completed, others still scheduled/started).

``diagnose(dumps, run_json, steps)`` (the dumps and step timers the report read,
``analysis/report/inputs.py``) returns one
row per problem: process_group (name), group_desc, seq,
kind (``collective`` / ``p2p``), op, verdict, ranks_present, ranks_missing, detail; for each
missing rank the last sequence number it reached in that group, and in ``detail`` the last step
its step timers finished and its last recorded operation. It is empty for a healthy run. A rank
without a usable dump (the report names it under ``problems``) is left out of every group's
comparison rather than called missing.
"""
from __future__ import annotations

import pandas as pd


COLUMNS = ["process_group", "group_desc", "seq", "kind", "op", "verdict", "ranks_present",
           "ranks_missing", "last_seq_of_missing", "detail"]


def _group_ranks(dumps: dict[int, dict], run: dict | None) -> dict[str, list[int]]:
    """Process group name → its global ranks: from run.json's process groups (and the default
    group = every rank), else from the dumps' ``pg_config`` (NCCL fills it; gloo leaves it
    empty)."""
    out: dict[str, list[int]] = {}
    if run:
        out["0"] = list(range(int(run.get("world_size", 0))))
        for g in run.get("process_groups", []):
            if g.get("name") is not None:
                out[str(g["name"])] = sorted(g["ranks"])
    for d in dumps.values():
        fr = d.get("flight_recorder") or {}
        for name, cfg in (fr.get("pg_config") or {}).items():
            ranks = cfg.get("ranks")
            if isinstance(ranks, str):
                ranks = [int(x) for x in ranks.strip("[]").split(",") if x.strip()]
            if ranks and str(name) not in out:
                out[str(name)] = sorted(int(r) for r in ranks)
    return out


def _last_steps(steps: pd.DataFrame) -> dict[int, int]:
    """rank → the last step its step timers (already read by the report) recorded as
    finished."""
    if steps.empty:
        return {}
    return {int(r): int(s) for r, s in steps.groupby("rank")["step"].max().items()}


def _last_op(dump: dict) -> str:
    entries = (dump.get("flight_recorder") or {}).get("entries") or []
    if not entries:
        return "no recorded operation"
    e = entries[-1]
    seq = e["p2p_seq_id"] if e.get("is_p2p") else e["collective_seq_id"]
    return (f"{e['profiling_name']} #{seq} in group {e['process_group'][0]} "
            f"({e['process_group'][1]}), {e.get('state')}")


def diagnose(dumps: dict[int, dict], run_json: dict | None, steps: pd.DataFrame
             ) -> pd.DataFrame:
    """The hang/desync table (COLUMNS) from the run's usable dumps (rank → dump)."""
    members = _group_ranks(dumps, run_json)
    last_step = _last_steps(steps)
    seen: dict[tuple, dict[int, dict]] = {}
    last: dict[tuple, int] = {}
    for rank, d in dumps.items():
        for e in (d.get("flight_recorder") or {}).get("entries", []):
            pg, desc = str(e["process_group"][0]), e["process_group"][1]
            kind = "p2p" if e.get("is_p2p") else "collective"
            seq = e["p2p_seq_id"] if kind == "p2p" else e["collective_seq_id"]
            seen.setdefault((pg, desc, kind, seq), {})[rank] = e
            last[(pg, kind, rank)] = max(last.get((pg, kind, rank), -1), seq)
    rows = []
    for (pg, desc, kind, seq), by_rank in sorted(seen.items(), key=lambda kv: (kv[0][0], kv[0][2],
                                                                               kv[0][3])):
        group = [r for r in members.get(pg, sorted(by_rank)) if r in dumps]
        present = sorted(by_rank)
        any_entry = next(iter(by_rank.values()))
        base = {"process_group": pg, "group_desc": desc, "seq": seq, "kind": kind,
                "op": any_entry["profiling_name"], "ranks_present": present}
        missing = [r for r in group if r not in by_rank]
        if kind == "collective" and missing:
            where = "; ".join(
                f"rank {r} last finished step {last_step.get(r, 'none')}, its last operation "
                f"{_last_op(dumps[r])}" for r in missing)
            rows.append({**base, "verdict": "missing", "ranks_missing": missing,
                         "last_seq_of_missing": {r: last.get((pg, kind, r), -1) for r in missing},
                         "detail": f"ranks {missing} of group {pg} ({desc}) never reached "
                                   f"sequence number {seq} ({any_entry['profiling_name']}); "
                                   f"{where}"})
            continue
        if len(by_rank) < 2:
            continue
        keys = {(e["profiling_name"], str(e.get("input_sizes")), str(e.get("input_dtypes")))
                for e in by_rank.values()}
        if len(keys) > 1:
            rows.append({**base, "verdict": "mismatch", "ranks_missing": [],
                         "last_seq_of_missing": {}, "detail": f"ranks disagree on op/size/"
                                                               f"dtype: {sorted(keys)}"})
        states = {e.get("state") for e in by_rank.values()}
        if len(states) > 1:
            rows.append({**base, "verdict": "state", "ranks_missing": [],
                         "last_seq_of_missing": {},
                         "detail": "states " + ", ".join(f"rank {r}: {e.get('state')}"
                                                         for r, e in sorted(by_rank.items()))})
    return pd.DataFrame(rows, columns=COLUMNS)
