"""Why ranks stopped: a cause in words for each stopped rank, from the Flight Recorder's
evidence (docs/hangs.md).

``records/flight_recorder.py`` says *who* — the ranks missing from a collective, the ranks
that disagree on one — as torch's own analyser does. This module says *why*, from what the
dumps hold beyond that: the state of each rank's entries (``scheduled``: enqueued, never
started on the device; ``started``; ``completed``), whether a rank issued anything after its
last completed collective, what it issued instead, how its dump was written. One row per
(cause, missed collective), ``COLUMNS``:

- ``host-stopped`` — a hung rank whose buffer holds no entry, or whose newest entry (in every
  group) is done or is one its peers issued too (gloo leaves an async collective
  ``scheduled`` after it is done), with nothing after it: its host stopped issuing collectives (a lock, the
  GIL, a deadlock, a data loader that never returns) while its peers issued the next one.
  Evidence: its last entry, how much later its peers issued the collective it missed (``lag``),
  the Python stack of its last entry where the dump holds one.
- ``device-stopped`` — ranks whose entry of a collective is ``scheduled`` (never started on the
  device) while their peers' same entry started, and whose earlier entries completed: the
  device stopped before it (an earlier kernel that never finished, a GPU error).
- ``transport-stalled`` — a group's newest collective started on every member and completed
  on none, the newest entry of every member: each is inside the collective, none gets through
  (the network, NCCL's transport).
- ``mismatch`` — ranks that issued the same collective with other sizes or dtypes (the
  ``mismatch`` verdict, not an op difference): all_to_all splits, shapes, dtypes; a hung rank
  that waits in such a collective (no rank of it completes) is told with it.
- ``divergence`` — ranks that issued different collectives at one sequence number of a group,
  or a hung rank whose newest entry, not done, is a collective no other rank holds (it went on
  to issue one its peers did not): the CPU-side code paths
  differ. The first point of difference per rank: what it issued there, and where its peers
  issued the same (an order swapped shows as the same collective at another sequence number).
- ``exited`` — a rank whose dump was written as it raised (the runner's ``reason``
  ``exception``) — not a timeout nor a lost peer (``SYMPTOM_RE``: what a hang does to the
  ranks that wait is its symptom): its error, and the last exception its stderr log names where the run has
  logs (``RUN/logs/rank{R}.stderr.log``, ``last_error``).
- ``no-dump`` — ranks of the job (run.json's world, else the dumps' default group) that left
  no dump at all: they exited, were killed, or their dump was lost; a hang among them cannot
  be judged from their side. Their logs' last exception is the evidence where there is one.

A healthy job — every entry completed, every rank with a dump — has no row.
"""
from __future__ import annotations

import dataclasses
import itertools
import pathlib
import re

import numpy as np
import pandas as pd

from meshscope.collectors.run_dir import log_paths
from meshscope.collectors.run_info import RunInfo

from .fr_table import FlightRecords, Signature
from .flight_recorder import hang as hang_of

COLUMNS = ["cause", "ranks", "process_group", "group_desc", "seq", "op", "collective",
           "evidence", "remedy"]

REMEDIES = {
    "host-stopped": "see what the stopped rank's host was doing: its Python stack (py-spy dump "
                    "--pid on the live process, the stack below where the dump holds one), a "
                    "lock or the GIL held, a deadlock, a data loader or checkpoint that never "
                    "returns",
    "device-stopped": "look at the device of those ranks: the kernel enqueued before the "
                      "collective never finished (a kernel that hangs, an illegal memory "
                      "access, an Xid error in dmesg / nvidia-smi); CUDA_LAUNCH_BLOCKING=1 "
                      "finds the kernel",
    "transport-stalled": "look at the network between those ranks: NCCL_DEBUG=INFO logs, the "
                         "links (InfiniBand / EFA errors), nccl-tests on the same ranks",
    "mismatch": "make every rank issue the collective with the same sizes and dtypes "
                "(all_to_all split sizes that the ranks agree on, padded shapes, one dtype)",
    "divergence": "the ranks took different code paths: find the condition that differs per "
                  "rank before the first point of difference (a data-dependent branch, an "
                  "early exit, a collective inside an if, different compiled graphs)",
    "exited": "the rank raised: its error below, and the job's logs around it",
    "no-dump": "find why those ranks left no dump: their exit (the job's logs, the OOM killer in "
               "dmesg), and that TORCH_FR_DUMP_TEMP_FILE is set on every rank",
}
CAUSES = tuple(REMEDIES)


def collective_text(sig: Signature, name: str, desc: str, seq: int) -> str:
    """A collective as torch's analyser shows it: op, group and its description, sequence
    number, sizes and dtypes (``all_to_all on group 3 (mesh_ep) #9, in 64x8 Float → out 64x8
    Float``)."""
    def sizes(s, d) -> str:
        if not s:
            return "-"
        dims = ", ".join("x".join(map(str, t)) if t else "scalar" for t in s)
        types = sorted(set(d or []))
        return dims + (f" {'/'.join(types)}" if types else "")
    return (f"{sig.profiling_name} on group {name} ({desc}) #{seq}, in "
            f"{sizes(sig.input_sizes, sig.input_dtypes)} → out "
            f"{sizes(sig.output_sizes, sig.output_dtypes)}")


def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One entry of a rank's buffer, decoded."""
    pos: int
    group: str
    desc: str
    seq: int
    sig: Signature
    sig_id: int                      # the signature's code (``FlightRecords.signatures``)
    state: str | None
    created_ns: int
    p2p: bool = False


class _Buffers:
    """Each rank's entries, looked up in the compact table (``fr_table``) and decoded one at a
    time: a collective by (group, seq) (``at``), the newest entry (``newest``), whether another
    rank holds one (``held_by_other``). Only the few ranks a cause names are ever decoded
    whole (``entries``), so a job of a thousand ranks costs whole-array comparisons."""

    def __init__(self, records: FlightRecords):
        self.records = records
        self._codes: dict[str, list[int]] = {}
        for i, (name, _) in enumerate(records.groups):
            self._codes.setdefault(name, []).append(i)

    def _entry(self, rank: int, i: int) -> _Entry:
        c = self.records.entries_of(rank)
        assert c is not None
        name, desc = self.records.groups[c["pg"][i]]
        code = int(c["sig"][i])
        return _Entry(int(i), name, desc, int(c["seq"][i]), self.records.signatures[code], code,
                      self.records.states[c["state"][i]], int(c["created_ns"][i]),
                      bool(c["p2p"][i]))

    def entries(self, rank: int) -> list[_Entry]:
        """``rank``'s collective entries (point-to-point left out), in buffer order."""
        c = self.records.entries_of(rank)
        if c is None:
            return []
        return [self._entry(rank, i) for i in np.flatnonzero(~c["p2p"]).tolist()]

    def at(self, rank: int, group: str, seq: int, p2p: bool = False) -> _Entry | None:
        """``rank``'s newest entry of ``group``'s sequence number ``seq``, None without one."""
        c = self.records.entries_of(rank)
        if c is None or not len(c["seq"]):
            return None
        hit = np.flatnonzero(np.isin(c["pg"], self._codes.get(group, []))
                             & (c["seq"] == seq) & (c["p2p"] == p2p))
        return self._entry(rank, int(hit[-1])) if len(hit) else None

    def newest(self, rank: int, p2p: bool = True) -> _Entry | None:
        """``rank``'s newest entry (its collectives only when ``p2p`` is False)."""
        c = self.records.entries_of(rank)
        if c is None or not len(c["seq"]):
            return None
        idx = np.flatnonzero(np.ones(len(c["seq"]), dtype=bool) if p2p else ~c["p2p"])
        return self._entry(rank, int(idx[-1])) if len(idx) else None

    def done_before(self, rank: int, pos: int) -> bool:
        """Whether every collective entry of ``rank`` before position ``pos`` completed."""
        c = self.records.entries_of(rank)
        if c is None:
            return True
        states = self.records.states
        done = [i for i, x in enumerate(states) if x == "completed"]
        before = ~c["p2p"][:pos]
        return bool(np.isin(c["state"][:pos][before], done).all())

    def held_by_other(self, rank: int, e: _Entry) -> bool:
        """Whether another rank's buffer holds ``e`` of ``rank`` — its group and sequence
        number, point-to-point or not: then a peer issued it too."""
        return any(self.at(r, e.group, e.seq, e.p2p) is not None
                   for r in self.records.ranks if r != rank)


#: An error that says a rank timed out waiting, or lost a peer that had stopped: what a hang
#: does to the ranks that wait, a symptom, not why the job stopped.
SYMPTOM_RE = re.compile(r"timed out|time ?out|watchdog caught|connection closed by peer|"
                        r"connection reset|remote worker|communicator was aborted|"
                        r"\baborted\b", re.I)


#: torch's pipelining wraps the error of a stage's step in this, its cause only in the chained
#: exception (most often a peer's send or receive that failed): judged by the error it wraps,
#: which the rank's log prints before it (``last_error``); a symptom where there is no log.
WRAPPER_RE = re.compile(r"Failed to run stage (?:backward|forward)", re.I)


#: How much of the end of a rank's stderr log is read for its error.
LOG_TAIL_BYTES = 64 * 1024
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)\b.*$|"
                         r"^torch\.\w+\.\w*Error\b.*$")


def _exceptions(text: str) -> list[str]:
    """Each exception a log's text names, in order: its line (``RuntimeError: …``), and where
    that line's message is empty — torch's pipelining starts its message with a newline — the
    message's lines after it, up to the first blank line, joined with single spaces."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        head = line.strip()
        if not _ERROR_LINE.match(head):
            continue
        if head.endswith(":"):
            rest = itertools.takewhile(str.strip, lines[i + 1:])
            head = " ".join([head, *(ln.strip() for ln in rest)])
        out.append(head)
    return out


def last_error(path: pathlib.Path) -> str | None:
    """The last exception that ``path`` (a rank's stderr log) names — a Python traceback ends
    with it (``RuntimeError: …``) — read from its last ``LOG_TAIL_BYTES``; None without one
    (or without the file). Where torch's pipelining wrapped an error (``WRAPPER_RE``), the
    traceback prints the error it wrapped first: that one is the rank's error."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = _exceptions(tail)
    unwrapped = [e for e in found if not WRAPPER_RE.search(e)] or found
    return unwrapped[-1][:300] if unwrapped else None


def log_errors(run_path: pathlib.Path | None, ranks) -> dict[int, str]:
    """rank -> the last exception its stderr log names (``RUN/logs/rank{R}.stderr.log``, the
    runner's), for the ranks that have one."""
    if run_path is None:
        return {}
    out = {}
    for r in ranks:
        err = last_error(log_paths(run_path, r)[1])
        if err:
            out[int(r)] = err
    return out


def causes(records: FlightRecords, verdicts: pd.DataFrame, run: RunInfo | None,
           run_path: pathlib.Path | None = None) -> pd.DataFrame:
    """The causes table (module docstring) of the dumps ``records`` and their verdicts
    (``flight_recorder.diagnose``); ``run_path``: the run directory whose ranks' logs name the
    error of a rank that exited or left no dump."""
    buf = _Buffers(records)
    rows: list[dict] = []
    gone = sorted(_expected(records, run) - set(records.ranks))
    errors = log_errors(run_path, sorted({*gone, *(r for r, (reason, _, _) in
                                                   records.dumped.items()
                                                   if reason == "exception")}))
    rows += _no_dump(records, run, errors)
    exited = _exited(records, errors)
    rows += exited.values()
    rows += _disagreements(verdicts, buf)
    rows += _hung(records, verdicts, buf, set(exited))
    rows += _device_stopped(verdicts, buf)
    rows += _transport_stalled(records, verdicts, buf, run)
    return pd.DataFrame(_merged(rows), columns=COLUMNS)


def _row(cause: str, ranks, group="", desc="", seq=-1, op="", collective="",
         evidence="") -> dict:
    return {"cause": cause, "ranks": sorted(int(r) for r in ranks), "process_group": group,
            "group_desc": desc, "seq": int(seq), "op": op, "collective": collective,
            "evidence": evidence, "remedy": REMEDIES[cause]}


def _expected(records: FlightRecords, run: RunInfo | None) -> set[int]:
    """The ranks whose dumps the records should hold: the job's, or those chosen
    (``--fr-rank``: the others were not asked for, they are not missing)."""
    if run is not None:
        out = set(range(run.world_size))
    elif records.world_size:
        out = set(range(records.world_size))
    else:
        out = {r for ranks in records.pg_ranks.values() for r in ranks}
    return out & records.selected if records.selected is not None else out


def _no_dump(records: FlightRecords, run: RunInfo | None, errors: dict[int, str]
             ) -> list[dict]:
    gone = sorted(_expected(records, run) - set(records.ranks))
    if not gone:
        return []
    said = "; ".join(f"rank {r}'s log ends with {errors[r]}" for r in gone if r in errors)
    return [_row("no-dump", gone, evidence=f"{_ranks_text(gone)} of the job left no Flight "
                                           f"Recorder dump: whatever stopped them cannot be "
                                           f"read from their side"
                                           + (f"; {said}" if said else ""))]


def _symptom(error: str, logged: str | None) -> bool:
    """Whether a rank's error is what the hang did to it, not why the job stopped."""
    if SYMPTOM_RE.search(error):
        return True
    if WRAPPER_RE.search(error):
        return logged is None or bool(SYMPTOM_RE.search(logged) or WRAPPER_RE.search(logged))
    return False


def _exited(records: FlightRecords, errors: dict[int, str]) -> dict[int, dict]:
    """Ranks whose dump was written as they raised — but not those that raised because they
    timed out waiting, lost a peer, or had a pipeline stage's step fail on it (``_symptom``:
    the hang's symptoms, told by the hang's own cause)."""
    out = {}
    for r, (reason, error, _) in sorted(records.dumped.items()):
        if reason == "exception" and not _symptom(error or "", errors.get(r)):
            log = f"; its log: {errors[r]}" if r in errors and errors[r] not in (error or "") \
                else ""
            out[r] = _row("exited", [r], evidence=f"rank {r}'s dump was written as it raised: "
                                                  f"{(error or 'no message').strip()[:300]}{log}")
    return out


def _hung(records: FlightRecords, verdicts: pd.DataFrame, buf: _Buffers,
          exited: set[int]) -> list[dict]:
    """Each hung rank's cause, judged once, at the earliest collective it never reached (the
    verdicts' order): one row per cause, its ranks together, the collective the first of them
    missed; each rank's own evidence in the row's ``evidence``."""
    h = hang_of(verdicts)
    if h is None:
        return []
    disagreed = {(str(v.process_group), int(v.seq)) for v in verdicts.itertuples(index=False)
                 if v.verdict == "mismatch"}
    missing = verdicts[verdicts["verdict"] == "missing"]
    first_of: dict[int, tuple] = {}           # rank -> (group, desc, seq, op, present)
    for v in missing.itertuples(index=False):
        for r in v.ranks_missing:
            if int(r) in h.hung_ranks and int(r) not in first_of:
                first_of[int(r)] = (str(v.process_group), str(v.group_desc), int(v.seq),
                                    str(v.op), [int(x) for x in v.ranks_present])
    by_cause: dict[str, list[tuple[int, str, str]]] = {}
    for r in h.hung_ranks:
        if r in exited or r not in first_of:
            continue
        group, desc, seq, op, present = first_of[r]
        ref = next((e for p in present if (e := buf.at(p, group, seq))), None)
        what = collective_text(ref.sig, group, desc, seq) if ref else f"{op} #{seq}"
        issued = min((e.created_ns for p in present
                      if (e := buf.at(p, group, seq)) and e.created_ns >= 0), default=-1)
        head = f"rank {r} never issued {what}, which {_ranks_text(present)} issued"
        newest = buf.newest(r)
        if newest is None:
            by_cause.setdefault("host-stopped", []).append(
                (r, what, f"{head}; its buffer holds no collective at all"))
            continue
        if (newest.group, newest.seq) in disagreed:
            other = collective_text(newest.sig, newest.group, newest.desc, newest.seq)
            by_cause.setdefault("mismatch", []).append(
                (r, other, f"{head}; it waits in {other}, a collective its ranks issued with "
                           f"different sizes, dtypes or ops: no rank of it completes"))
            continue
        if newest.state != "completed" and (newest.group, newest.seq) != (group, seq) \
                and not _shared(buf, records, r, newest):
            other = collective_text(newest.sig, newest.group, newest.desc, newest.seq)
            by_cause.setdefault("divergence", []).append(
                (r, what, f"{head}; it went on to issue {other} instead ({newest.state}), "
                          f"which no other rank issued: the first point where their "
                          f"collectives differ"))
        else:
            lag = (f", {(issued - newest.created_ns) / 1e9:,.3g} s before its peers issued "
                   f"the collective it missed" if issued >= 0 and newest.created_ns >= 0
                   else "")
            stack = records.last_frames.get(r) or []
            by_cause.setdefault("host-stopped", []).append(
                (r, what, f"{head}; its newest entry is {records.last_op[r]}{lag}, and "
                          f"nothing after it"
                          + (f"; its stack there: {' ← '.join(stack[:6])}" if stack else "")))
    if "host-stopped" in by_cause and "gloo" in records.backends:
        r0, what, text = by_cause["host-stopped"][-1]
        by_cause["host-stopped"][-1] = (r0, what, text + " (gloo records no send or recv: a rank "
                                        "waiting in a point-to-point transfer shows so too)")
    rows = []
    for cause, found in by_cause.items():
        r0, what, _ = found[0]
        group, desc, seq, op, _ = first_of[r0]
        if cause == "mismatch":         # told at the collective the ranks disagree on
            e = buf.newest(r0)
            assert e is not None
            group, desc, seq, op = e.group, e.desc, e.seq, e.sig.profiling_name
        rows.append(_row(cause, [r for r, _, _ in found], group, desc, seq, op, what,
                         "; ".join(text for _, _, text in found)))
    return rows


def _merged(rows: list[dict]) -> list[dict]:
    """One row per (cause, group, sequence number): the ranks of rows that tell one cause at
    one collective together, their evidence joined (a mismatch is told by its verdict and by
    the hung ranks that wait in it)."""
    out: dict[tuple, dict] = {}
    for row in rows:
        key = (row["cause"], row["process_group"], row["seq"])
        if key not in out:
            out[key] = dict(row)
            continue
        have = out[key]
        have["ranks"] = sorted(set(have["ranks"]) | set(row["ranks"]))
        have["evidence"] = f"{have['evidence']}; {row['evidence']}"
    return list(out.values())


def _shared(buf: _Buffers, records: FlightRecords, rank: int, e: _Entry) -> bool:
    """Whether another rank's buffer holds ``e`` of ``rank`` (its group and sequence number):
    then its peers issued it too, and ``rank`` waiting in it is no other path (gloo leaves an
    async collective ``scheduled`` after it is done)."""
    return buf.held_by_other(rank, e)


def _disagreements(verdicts: pd.DataFrame, buf: _Buffers) -> list[dict]:
    """``mismatch`` verdicts: different ops or an order swapped (divergence), else sizes or
    dtypes (mismatch); for each, the ranks that differ from the most common entry."""
    rows = []
    seen: set[tuple[str, tuple]] = set()
    for v in verdicts[verdicts["verdict"] == "mismatch"].itertuples(index=False):
        group, seq = str(v.process_group), int(v.seq)
        present = [int(r) for r in v.ranks_present]
        entries = {r: e for r in present if (e := buf.at(r, group, seq)) is not None}
        if len(entries) < 2:
            continue
        sigs = [e.sig_id for e in entries.values()]
        common = max(sorted(set(sigs)), key=sigs.count)
        odd = sorted(r for r, e in entries.items() if e.sig_id != common)
        if not odd or sigs.count(common) == 1:
            odd = sorted(entries)       # no entry most ranks share: the group disagrees
        ref = next(e for e in entries.values() if e.sig_id == common)
        what = collective_text(ref.sig, group, ref.desc, seq)
        # Did the odd ranks issue, elsewhere in the group, what their peers issued here?
        # Then it is an order swapped, not another collective.
        peer = next(r for r, e in entries.items() if e.sig_id == common)
        moved = []
        for r in odd:
            if r == peer:
                continue
            # A swap: at another sequence number this rank issued what its peers issued here,
            # and its peers what this rank issued here.
            mine = entries[r].sig_id
            there = next((e.seq for e in buf.entries(r) if e.group == group and e.seq != seq
                          and e.sig_id == common and (p := buf.at(peer, group, e.seq))
                          is not None and p.sig_id == mine), None)
            if there is not None:
                moved.append(f"rank {r} issued it at #{there} instead")
        ops = {e.sig.profiling_name for e in entries.values()}
        key = ("divergence" if moved or len(ops) > 1 else "mismatch", tuple(odd))
        if key in seen:
            continue                     # an order swap shows at both sequence numbers
        seen.add(key)
        theirs = "; ".join(f"rank {r}: {collective_text(entries[r].sig, group, ref.desc, seq)}"
                           for r in odd[:4])
        if key[0] == "divergence":
            evidence = (f"at {what} (the first point where the ranks' collectives differ) "
                        f"{theirs}" + (f"; {'; '.join(moved)}: the order of their "
                                       f"collectives differs" if moved else ""))
        elif len(odd) == len(entries):
            evidence = f"{v.detail}"
        else:
            evidence = f"{_ranks_text(present)} issued {what}, but {theirs}"
        rows.append(_row(key[0], odd, group, ref.desc, seq, ref.sig.profiling_name, what,
                         evidence))
    return rows


def _device_stopped(verdicts: pd.DataFrame, buf: _Buffers) -> list[dict]:
    """``state`` verdicts whose scheduled ranks' earlier entries all completed while their
    peers' same entry started."""
    rows = []
    for v in verdicts[verdicts["verdict"] == "state"].itertuples(index=False):
        group, seq = str(v.process_group), int(v.seq)
        entries = {int(r): e for r in v.ranks_present
                   if (e := buf.at(int(r), group, seq)) is not None}
        started = [r for r, e in entries.items() if e.state == "started"]
        waiting = [r for r, e in entries.items() if e.state == "scheduled"]
        if not started or not waiting:
            continue
        stopped = [r for r in waiting if buf.done_before(r, entries[r].pos)]
        if not stopped:
            continue
        e = entries[stopped[0]]
        what = collective_text(e.sig, group, e.desc, seq)
        rows.append(_row("device-stopped", stopped, group, e.desc, seq, e.sig.profiling_name,
                         what, f"{_ranks_text(stopped)} enqueued {what} but never started it on "
                               f"the device, while {_ranks_text(started)} started it and wait; "
                               f"every earlier entry of {_ranks_text(stopped)} completed"))
    return rows


def _transport_stalled(records: FlightRecords, verdicts: pd.DataFrame, buf: _Buffers,
                       run: RunInfo | None) -> list[dict]:
    """Per group, its newest collective started on every member and completed on none, each
    member's newest entry."""
    judged = {(str(v.process_group), int(v.seq)) for v in verdicts.itertuples(index=False)
              if v.verdict in ("missing", "mismatch")}
    members = dict(records.pg_ranks)
    if run is not None:
        members.setdefault("0", list(range(run.world_size)))
        for g in run.process_groups:
            if g.name is not None:
                members.setdefault(g.name, list(g.ranks))
    newest = {r: buf.newest(r, p2p=False) for r in records.ranks}
    by_key: dict[tuple[str, int], list[int]] = {}
    for r, e in newest.items():
        if e is not None and e.state == "started":
            by_key.setdefault((e.group, e.seq), []).append(r)
    rows = []
    for (group, seq), ranks in sorted(by_key.items()):
        group_ranks = members.get(group) or ranks
        if (group, seq) in judged or len(group_ranks) < 2 or sorted(ranks) != \
                sorted(group_ranks):
            continue
        e = newest[ranks[0]]
        assert e is not None
        what = collective_text(e.sig, group, e.desc, seq)
        rows.append(_row("transport-stalled", ranks, group, e.desc, seq, e.sig.profiling_name,
                         what, f"every member of group {group} ({_ranks_text(ranks)}) started "
                               f"{what} and none completed it; it is the newest entry of each"))
    return rows
