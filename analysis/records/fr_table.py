"""Every rank's Flight Recorder buffer as one compact table, made as each dump is read.

PyTorch keeps the last ``TORCH_FR_BUFFER_SIZE`` operations of each rank (2,000 by default;
meshscope's runner asks for 20,000). Held as the dump's decoded JSON, an entry takes about
1.9 kB of Python objects, so the buffers of a thousand ranks would take gigabytes before any
verdict is made. What the analysis reads of an entry is little — its group, sequence number,
op, sizes, dtypes, state and creation time — and the op, sizes and dtypes repeat step after
step. ``FlightRecords.add(dump)`` reduces a rank's buffer to integer columns as soon as its
dump is read, with each distinct (group), (op, sizes, dtypes) and state held once: 29 bytes
an entry (``docs/benchmarks.md``, "Flight Recorder buffers of a long job").

``FlightRecords.entries_of(rank)`` — a rank's columns, one row per entry in buffer order
(oldest first):

- ``pg`` (int32): index into ``groups``, the (process group name, description) pairs
- ``seq`` (int64): ``p2p_seq_id`` for a point-to-point entry, else ``collective_seq_id``
- ``p2p`` (bool): ``is_p2p``
- ``created_ns`` (int64): ``time_created_ns``; -1 when the dump has none
- ``sig`` (int32): index into ``signatures`` (``Signature``: the op's name, sizes and dtypes
  as the dump has them)
- ``state`` (int32): index into ``states`` (``scheduled``, ``started``, ``completed``, None)

Beside it: ``ranks`` (every rank with a usable dump, also one whose buffer is empty),
``pg_ranks`` (process group name → ranks, from the dumps' ``pg_config``; the first dump that
lists a group's ranks gives them), ``last_op`` (rank → its newest entry as one line, what a
hang's message names), ``last_frames`` (rank → the Python stack of that entry, where the dump
holds frames), ``dumped`` (rank → the runner's reason, error and time of the dump), ``backends`` (the communication libraries the entries name, the part of
``profiling_name`` before its colon: ``nccl``, ``gloo``…) and ``world_size`` (the number of
ranks of the default group, ``default_pg``, where a dump's ``pg_config`` lists them — NCCL's
do, gloo's leave it empty — else None).
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np

from meshscope.analysis.rank_text import ranges
from meshscope.collectors.flight_recorder import Dump, Entry
from meshscope.collectors.run_info import MAX_WORLD_SIZE

_DTYPES = {"pg": np.int32, "seq": np.int64, "p2p": bool,
           "created_ns": np.int64, "sig": np.int32, "state": np.int32}


class Signature(NamedTuple):
    """What the verdict rules compare of an entry besides its group and sequence number."""
    profiling_name: str
    input_sizes: list | None
    output_sizes: list | None
    input_dtypes: list | None
    output_dtypes: list | None


def _key(e: Entry) -> tuple:
    """A hashable form of an entry's signature, under which it is held once."""
    ins, outs = e.input_sizes, e.output_sizes
    return (e.profiling_name, None if ins is None else tuple(map(tuple, ins)),
            None if outs is None else tuple(map(tuple, outs)),
            None if e.input_dtypes is None else tuple(e.input_dtypes),
            None if e.output_dtypes is None else tuple(e.output_dtypes))


class _Codes:
    """Distinct values in the order first met, and each one's index."""

    def __init__(self):
        self.values: list = []
        self._index: dict = {}

    def code(self, key, make=None) -> int:
        """``key``'s index; a new key is stored as ``make()`` when given, else as itself."""
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.values)
            self.values.append(key if make is None else make())
        return i


def _describe(e: Entry) -> str:
    """``gloo:all_reduce #12 in group 3 (mesh_dp), scheduled``."""
    seq = e.p2p_seq_id if e.is_p2p else e.collective_seq_id
    name, desc = e.process_group
    return f"{e.profiling_name} #{seq} in group {name} ({desc}), {e.state}"


def _config_ranks(ranks) -> list[int] | None:
    """A ``pg_config`` entry's ranks: a list, or its text (``"[0, 1]"``); None when empty or
    when the text names a rank no job has (at least ``MAX_WORLD_SIZE``: the list's form
    bounds it)."""
    if isinstance(ranks, str):
        parts = [x.strip() for x in ranks.strip("[]").split(",")]
        if not all(x.isdigit() and len(x) <= 7 for x in parts if x):
            return None
        ranks = [int(x) for x in parts if x]
        if any(r >= MAX_WORLD_SIZE for r in ranks):
            return None
    return sorted(int(r) for r in ranks) if ranks else None


#: Frames of the newest entry's stack kept per rank.
FRAMES_KEPT = 16


def _frames(e: Entry) -> list[str]:
    """``e``'s stack as lines, innermost first (at most ``FRAMES_KEPT``)."""
    return [f"{f.filename or '?'}:{'?' if f.line is None else f.line} in {f.name or '?'}"
            for f in (e.frames or [])[:FRAMES_KEPT]]


class FlightRecords:
    """The Flight Recorder buffers of a run (module docstring)."""

    def __init__(self):
        self._groups, self._signatures, self._states = _Codes(), _Codes(), _Codes()
        self._columns: dict[int, dict[str, np.ndarray]] = {}
        self.pg_ranks: dict[str, list[int]] = {}
        self.last_op: dict[int, str] = {}
        self.world_size: int | None = None
        # rank -> the stack its newest entry was issued from ("file:line in name", innermost
        # first, at most ``FRAMES_KEPT``; empty where the dump holds no frames).
        self.last_frames: dict[int, list[str]] = {}
        # rank -> why and when its dump was written: (reason, error, dumped_at_unix_s) as the
        # runner's dump says them (None each for PyTorch's own dumps).
        self.dumped: dict[int, tuple[str | None, str | None, float | None]] = {}
        # The ranks a reader chose to read (``only``'s ``ranks``: ``--fr-rank``); None: all.
        self.selected: set[int] | None = None

    @classmethod
    def of(cls, dumps: Iterable[Dump]) -> "FlightRecords":
        records = cls()
        for d in dumps:
            records.add(d)
        return records

    @property
    def groups(self) -> list[tuple[str, str]]:
        return self._groups.values

    @property
    def signatures(self) -> list[Signature]:
        return self._signatures.values

    @property
    def states(self) -> list[str | None]:
        return self._states.values

    @property
    def ranks(self) -> list[int]:
        return sorted(self._columns)

    @property
    def backends(self) -> list[str]:
        """The communication libraries the entries name (``nccl``, ``gloo``…), sorted."""
        return sorted({s.profiling_name.split(":", 1)[0] for s in self.signatures
                       if ":" in s.profiling_name})

    def __len__(self) -> int:
        """Entries held, over every rank."""
        return sum(len(c["seq"]) for c in self._columns.values())

    @property
    def nbytes(self) -> int:
        """Bytes of the per-entry columns (the signatures, groups and states apart)."""
        return sum(a.nbytes for c in self._columns.values() for a in c.values())

    def add(self, dump: Dump) -> None:
        """Reduce ``dump`` (``read_dump``'s record) to its columns; a rank dumped twice keeps
        the later dump."""
        fr = dump.flight_recorder
        entries = fr.entries if fr is not None else []
        group, sig, state = self._groups.code, self._signatures.code, self._states.code
        cols = {
            "pg": [group(tuple(e.process_group)) for e in entries],
            "seq": [e.p2p_seq_id if e.is_p2p else e.collective_seq_id for e in entries],
            "p2p": [e.is_p2p for e in entries],
            "created_ns": [-1 if e.time_created_ns is None else e.time_created_ns
                           for e in entries],
            "sig": [sig(_key(e), lambda e=e: Signature(
                e.profiling_name, e.input_sizes, e.output_sizes, e.input_dtypes,
                e.output_dtypes)) for e in entries],
            "state": [state(e.state) for e in entries],
        }
        self._columns[dump.rank] = {k: np.array(v, dtype=_DTYPES[k]) for k, v in cols.items()}
        self.last_op[dump.rank] = _describe(entries[-1]) if entries else \
            "no recorded operation"
        self.last_frames[dump.rank] = _frames(entries[-1]) if entries else []
        self.dumped[dump.rank] = (dump.reason, dump.error, dump.dumped_at_unix_s)
        for name, cfg in (fr.pg_config if fr is not None else {}).items():
            ranks = _config_ranks(cfg.ranks)
            if ranks and name not in self.pg_ranks:
                self.pg_ranks[name] = ranks
            if ranks and cfg.desc == "default_pg":
                self.world_size = max(len(ranks), self.world_size or 0)

    def entries_of(self, rank: int) -> dict[str, np.ndarray] | None:
        """``rank``'s columns (module docstring), None when it left no usable dump."""
        return self._columns.get(rank)

    # -- which ranks were expected, and a view of some groups and ranks (issue 47) ----------

    def expected_ranks(self, world_size: int | None = None) -> list[int]:
        """The ranks that should have left a dump: ``range(world_size)`` where it is known
        (run.json's, else the default group's in ``pg_config``), with every rank a dump's
        ``pg_config`` lists, and every rank that left one."""
        world = world_size if world_size is not None else self.world_size
        out = set(self.ranks)
        for ranks in self.pg_ranks.values():
            out.update(ranks)
        if world is not None:
            out.update(range(min(world, MAX_WORLD_SIZE)))
        return sorted(out)

    def missing_ranks(self, world_size: int | None = None) -> list[int]:
        """``expected_ranks`` that left no usable dump."""
        have = set(self.ranks)
        return [r for r in self.expected_ranks(world_size) if r not in have]

    def missing_note(self, world_size: int | None = None) -> str | None:
        """One line naming the ranks expected but without a dump, and what that means for a
        hang verdict (``ranks 4–7 left no dump: a hang among them cannot be judged``); None
        when every expected rank left one (or none did)."""
        missing = self.missing_ranks(world_size)
        if not missing or not self.ranks:
            return None
        shown = ranges(missing)
        total = len(self.expected_ranks(world_size))
        word = "rank" if len(missing) == 1 else "ranks"
        return (f"Flight Recorder: {word} {shown} left no dump ({len(self.ranks)} of {total} "
                f"expected ranks read): a hang among them cannot be judged, and a verdict on "
                f"the others holds only for what they recorded")

    def only(self, groups: Iterable[str] = (), ranks: Iterable[int] = ()) -> "FlightRecords":
        """A copy holding only the entries of ``groups`` (a process group's name or its
        description; none given: all) and the dumps of ``ranks`` (none given: all) — what
        ``meshscope analyze --fr-group / --fr-rank`` reads. Each rank's newest entry is the
        newest one kept; the groups' ranks are those of the groups kept."""
        groups, ranks = set(groups), set(ranks)
        out = FlightRecords()
        out._groups, out._signatures, out._states = self._groups, self._signatures, self._states
        keep_pg = np.array([not groups or name in groups or desc in groups
                            for name, desc in self.groups] or [True], dtype=bool)
        out.world_size = self.world_size
        out.selected = set(ranks) or self.selected
        out.pg_ranks = {g: r for g, r in self.pg_ranks.items()
                        if not groups or g in groups or any(
                            name == g and desc in groups for name, desc in self.groups)}
        for rank, cols in self._columns.items():
            if ranks and rank not in ranks:
                continue
            mask = keep_pg[cols["pg"]] if len(cols["pg"]) else np.zeros(0, dtype=bool)
            kept = {k: v[mask] for k, v in cols.items()}
            out._columns[rank] = kept
            out.dumped[rank] = self.dumped.get(rank, (None, None, None))
            n = len(kept["seq"])
            if n == len(cols["seq"]):
                out.last_op[rank] = self.last_op.get(rank, "no recorded operation")
                out.last_frames[rank] = self.last_frames.get(rank, [])
            elif n:
                name, desc = self.groups[kept["pg"][-1]]
                sig = self.signatures[kept["sig"][-1]]
                out.last_op[rank] = (f"{sig.profiling_name} #{kept['seq'][-1]} in group {name} "
                                     f"({desc}), {self.states[kept['state'][-1]]}")
                out.last_frames[rank] = []
            else:
                out.last_op[rank] = "no recorded operation"
                out.last_frames[rank] = []
        return out

