"""Everything the analysis reads from disk, read and checked once, at the boundary.

``gather(path)`` returns ``Inputs``: the typed run.json (``collectors.run_info``; None for a
plain folder of traces), the trace files to ingest, every rank's Flight Recorder buffer (one
compact table, ``records.fr_table.FlightRecords``, each dump reduced as it is read) and step
timers, a line for each input that could not be used (``problems``: the file, the field and
what is wrong) and a line for each thing a reader should know (``notes``). Nothing later in the
analysis opens a file by itself, except the trace files, which the ingest workers read
(``analysis/ingest``).

- An invalid run.json (``collectors.run_json.read_run_info``), or one whose world size is more
  than ``RANKS_PER_FILE`` times the ranks that left a file (traces, step timers, dumps): where
  there are traces, a problem line and analysis as a plain folder of traces (``run`` is None, a
  note says so); without traces ``RunDirError`` (exit code 2).
- A Flight Recorder dump that is not usable (``collectors.flight_recorder.read_dump``: its
  schema, its rank against its file name) is a problem of that rank; the others are compared.
- Outside a run directory, PyTorch's own Flight Recorder dumps are inputs too, alone or beside
  traces (``walk_inputs``, ``load_torch_dumps``): a file named ``<prefix><rank>`` —
  ``_dump_3``, ``nccl_trace_rank_3``, as ``TORCH_FR_DUMP_TEMP_FILE`` names them — whose first
  bytes are a pickle's, or ``<prefix><rank>.json`` starting with a key of PyTorch's JSON dump
  (a Kineto trace starts with none of them). Each is read by the plain-data reader
  (``flight_recorder.read_torch_dump``: nothing in it is executed), its rank taken from its
  name. One that cannot be used is a problem (its rank left out, the others compared); a file
  that shares the dumps' prefix but is none (an empty ``_dump_7``) is named; two files giving
  one rank stop the analysis (``InputError``). ``flight_facts`` says what the dumps tell of
  the job: its backend, hence device, and its world size.

``find_traces(path)``: the trace files of a run directory (``traces/``) or, for any other
folder, every ``*.json`` and ``*.json.gz`` below it but meshscope's own files and PyTorch's
JSON Flight Recorder dumps. Symbolic links
are followed, to files and to folders, as long as they stay inside the analysed folder, each
real folder and file read once: a link that leads out of the analysed folder, back into a
folder already being read (a loop), a second path to a file already listed, or a broken link
is named and skipped (``walk_traces`` says which).

``identity(path, rank, meta)`` — who a trace says it is (``TraceIdentity``);
``resolve_identities(ids, run=)`` — which rank each ingested file is:

- a rank comes from ``distributedInfo``, else from the file name; with ``--rank-regex`` from
  the file name first (``ingest.rank_naming.rank_of``: the user's explicit choice);
- a trace that nothing gives a rank (no ``distributedInfo``, no rank in its name, no
  ``--rank-regex``) is rank 0 when it is the only trace (ingest says so in its notes); among
  several files each such file is refused with the message that asks for ``--rank-regex``:
  a problem of that file when the caller collects ``problems`` (the others are analysed),
  else ``InputError``;
- two files claiming one rank stop the analysis (``InputError``, naming both and where each
  rank came from), unless ``--rank-regex`` tells them apart;
- traces of different jobs — different ``distributedInfo.world_size``, different run ids, or a
  world size or run id other than run.json's — stop the analysis, naming the files of each;
- a rank outside the job's world (run.json's, else the traces') stops it too.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib

import pandas as pd

from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest import validate
from meshscope.analysis.ingest.events import RANKLESS_KEY
from meshscope.analysis.ingest.rank_naming import NO_RANK, name_rank
from meshscope.analysis.rank_text import ranges
from meshscope.analysis.records.fr_table import FlightRecords
from meshscope.collectors import run_dir as rd, step_timer
from meshscope.collectors import flight_recorder, fr_forms, torch_dumps
from meshscope.collectors.flight_recorder import read_dump
from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.run_info import RunInfo
from meshscope.collectors.run_json import read_run_info

# run.json may describe a job larger than the files it left (traces of some ranks only), but
# not by more than this factor: a larger world size is not believed (nor allocated).
RANKS_PER_FILE = 8
# What the report reads of the step timers (analysis/records/steps.py).
STEP_COLUMNS = ["rank", "step", "wall_time_us", "loss", "peak_memory_bytes"]


@dataclasses.dataclass
class Inputs:
    path: pathlib.Path
    run: RunInfo | None
    trace_files: list[pathlib.Path]
    flight: FlightRecords           # every usable Flight Recorder dump, as one table
    has_dumps: bool                 # Flight Recorder dumps were looked at: the run
                                    # directory has a comms/ folder, or PyTorch's own dumps
                                    # lie under the analysed folder
    steps: pd.DataFrame             # every rank's step timers (collectors/step_timer.py),
                                    # the STEP_COLUMNS the report reads
    problems: list[str]
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class TraceIdentity:
    """Who a trace file says it is."""
    path: pathlib.Path
    rank: int                  # as ingest decided: distributedInfo.rank, else the file name
    info_rank: int | None      # distributedInfo.rank
    world_size: int | None     # distributedInfo.world_size
    run_id: str | None         # the run id in the trace's meshscope metadata
    rankless: bool = False     # nothing gave a rank: ingest read it as rank 0


def identity(path: pathlib.Path, rank: int, meta: dict) -> TraceIdentity:
    """The identity of the trace at ``path`` that ingest read as ``rank``, from its metadata
    (checked by ``ingest.validate.trace_meta``)."""
    meta = meta if isinstance(meta, dict) else {}
    return TraceIdentity(path=pathlib.Path(path), rank=rank, info_rank=validate.info_rank(meta),
                         world_size=validate.info_world_size(meta), run_id=validate.run_id(meta),
                         rankless=meta.get(RANKLESS_KEY) is True)


def _files(ids) -> str:
    names = [str(i.path) for i in ids]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _folder(ids: list[TraceIdentity]) -> pathlib.Path:
    try:
        return pathlib.Path(os.path.commonpath([str(i.path) for i in ids]))
    except ValueError:
        return pathlib.Path(".")


def _one_job(ids: list[TraceIdentity], run: RunInfo | None) -> None:
    """InputError when the traces come from different jobs (module docstring)."""
    for attr, label, expected in (("world_size", "distributedInfo.world_size",
                                   run.world_size if run else None),
                                  ("run_id", "run id", run.run_id if run else None)):
        groups: dict[object, list[TraceIdentity]] = {}
        for i in ids:
            if getattr(i, attr) is not None:
                groups.setdefault(getattr(i, attr), []).append(i)
        if expected is not None and groups and set(groups) != {expected}:
            other = {k: v for k, v in groups.items() if k != expected}
            shown = "; ".join(f"{k} in {_files(v)}" for k, v in sorted(other.items(),
                                                                       key=str))
            raise InputError(run.path, f"traces of another job: run.json's {attr} is "
                                       f"{expected}, but {label} is {shown}; analyse each "
                                       f"job's traces on their own")
        if len(groups) > 1:
            shown = "; ".join(f"{k} in {_files(v)}" for k, v in sorted(groups.items(),
                                                                       key=str))
            raise InputError(_folder(ids), f"traces of different jobs: {label} {shown}; "
                                           f"analyse each job's traces on their own")


def _claim(i: TraceIdentity) -> str:
    """``path (distributedInfo.rank; its name says rank 1)``: where a file's rank came from."""
    source = "distributedInfo.rank" if i.info_rank == i.rank else "its file name"
    named = name_rank(i.path)
    also = f"; its name says rank {named}" if named not in (None, i.rank) else ""
    return f"{i.path} ({source}{also})"


def resolve_identities(ids: list[TraceIdentity], *, run: RunInfo | None = None,
                       problems: list[str] | None = None) -> dict[pathlib.Path, int]:
    """file → rank for every file (module docstring; ``run``: the job's run.json, to check the
    traces against); no file is left out quietly: InputError when two files claim one rank,
    the traces come from different jobs or name a rank outside the job. A file without a rank
    among several: a line in ``problems`` and left out when it is given, else InputError."""
    rankless = [i for i in ids if i.rankless]
    if rankless and len(ids) > 1:
        if problems is None:
            others = rankless[1:]
            also = f" (as have {_files(others)})" if others else ""
            raise InputError(rankless[0].path, NO_RANK.replace("; pass", f"{also}; pass", 1))
        problems += [f"{i.path}: {NO_RANK}" for i in rankless]
        ids = [i for i in ids if not i.rankless]
    if not ids:
        return {}
    _one_job(ids, run)
    claims: dict[int, list[TraceIdentity]] = {}
    for i in ids:
        claims.setdefault(i.rank, []).append(i)
    for rank, same in sorted(claims.items()):
        if len(same) > 1:
            raise InputError(_folder(same), f"{len(same)} files claim rank {rank}: "
                                            f"{', '.join(_claim(i) for i in same)}; pass "
                                            f"--rank-regex (e.g. 'rank(\\d+)') to take ranks "
                                            f"from the file names, or remove all but one")
    world = run.world_size if run is not None else next(
        (i.world_size for i in ids if i.world_size is not None), None)
    outside = sorted((i.rank, i.path) for i in ids if world is not None and i.rank >= world)
    if outside:
        r, p = outside[0]
        source = "run.json" if run is not None else "distributedInfo"
        raise InputError(p, f"rank {r} is outside the job's {world} ranks ({source} "
                            f"world_size)")
    return {i.path: i.rank for i in ids}


# -- finding the files -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TorchDumpFile:
    """One of PyTorch's own Flight Recorder dumps found under the analysed path."""
    path: pathlib.Path
    prefix: str                # its name's prefix (``_dump_``, ``nccl_trace_rank_``)
    rank: int                  # the rank its name gives
    form: str                  # "pickle" or "json"


@dataclasses.dataclass(frozen=True)
class Found:
    """What ``walk_inputs`` found: trace files, PyTorch's Flight Recorder dumps, a line per
    file left out (and why), and files named like dumps that are none (``not_dumps``: named as
    problems when they share a prefix with real ones)."""
    traces: list[pathlib.Path]
    dumps: list[TorchDumpFile]
    skipped: list[str]
    not_dumps: list[tuple[pathlib.Path, str, str]] = dataclasses.field(default_factory=list)


def _torch_dump(f: pathlib.Path, *, alone: bool = False):
    """(TorchDumpFile, None) when ``f`` is one of PyTorch's dumps; (None, (prefix, why)) when
    its name says it could be one but its first bytes say otherwise; (None, None) when its
    name does not. ``alone``: the path analysed is this very file — a pickle or a JSON dump is
    taken whatever its name (rank 0 when the name gives none)."""
    named = torch_dumps.torch_dump_name(f.name)
    if f.name.endswith(".json.gz") or (named is None and not alone):
        return None, None
    prefix, rank, form = named or (f.name, 0, "json" if f.name.endswith(".json") else "pickle")
    why = torch_dumps.torch_dump_form(f, form)
    if why is None:
        return TorchDumpFile(f, prefix, rank, form), None
    return None, (prefix, why)


def _starts_like_a_pickle(path: pathlib.Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x80"
    except OSError:
        return False


def walk_traces(path: pathlib.Path) -> tuple[list[pathlib.Path], list[str]]:
    """(trace files under ``path``, a line per link skipped): ``find_traces`` with what it
    left out and why."""
    found = walk_inputs(path)
    return found.traces, found.skipped


def walk_inputs(path: pathlib.Path) -> Found:
    """The trace files under ``path`` (``find_traces``) and, outside a run directory, PyTorch's
    own Flight Recorder dumps beside them (module docstring), with what was left out and why."""
    path = pathlib.Path(path)
    if path.is_file():
        dump, near = _torch_dump(path, alone=True)
        if dump:
            return Found([], [dump], [])
        if path.name.endswith(SNAPSHOT_SUFFIXES):   # a memory snapshot given alone: no trace
            return Found([], [], [])                # (find_snapshots reads it)
        if near is not None and _starts_like_a_pickle(path):
            return Found([], [], [], [(path, *near)])       # a pickle, but no dump: not read
        return Found([path], [], [])
    if not path.is_dir():
        why = rd.unusable_file(path)
        return Found([], [], [f"{path}: {why}"] if why else [])
    home = path                         # links may not lead outside the analysed folder
    is_run_dir = (path / rd.RUN_JSON).exists() or (path / rd.RUN_JSON).is_symlink()
    if is_run_dir:
        # a run directory: its traces are in traces/ only (its dumps in comms/, load_dumps)
        root = path / rd.TRACES
        if not root.is_dir():
            return Found([], [], [])
    else:
        root = path
    skip = rd.NOT_TRACES
    skipped: list[str] = []
    seen_dirs: set[tuple[int, int]] = set()
    by_file: dict[tuple[int, int], list[pathlib.Path]] = {}
    dumps: dict[tuple[int, int], list[TorchDumpFile]] = {}
    not_dumps: list[tuple[pathlib.Path, str, str]] = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        here = pathlib.Path(folder)
        st = here.stat()
        if (st.st_dev, st.st_ino) in seen_dirs:
            skipped.append(f"{here}: skipped, a link to a folder already read "
                           f"({here.resolve()}): a loop, or a second path to it")
            dirs[:] = []
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        if rd.REPORT in here.relative_to(root).parts:
            dirs[:] = []
            continue
        dirs.sort()
        for name in sorted(names):
            maybe_dump = not is_run_dir and not name.startswith(".") and \
                torch_dumps.torch_dump_name(name) is not None
            if not (maybe_dump or name.endswith(rd.TRACE_SUFFIXES)) or name in skip:
                continue
            f = here / name
            why = rd.unusable_file(f, home)
            if why:
                skipped.append(f"{f}: {why}")
                continue
            try:
                fst = f.stat()
            except OSError:
                skipped.append(f"{f}: skipped, cannot be read")
                continue
            dump, near = _torch_dump(f) if maybe_dump else (None, None)
            if dump is not None:
                dumps.setdefault((fst.st_dev, fst.st_ino), []).append(dump)
            elif name.endswith(rd.TRACE_SUFFIXES):
                by_file.setdefault((fst.st_dev, fst.st_ino), []).append(f)
            elif near is not None:
                not_dumps.append((f, *near))
    files, kept = [], []
    for group, out in ((by_file, files), (dumps, kept)):
        for same in group.values():
            # The file itself rather than a link to it, then the shortest path.
            keep, *others = sorted(same, key=lambda x: (_path_of(x).is_symlink(),
                                                        len(_path_of(x).parts),
                                                        str(_path_of(x))))
            out.append(keep)
            skipped += [f"{_path_of(x)}: skipped, the same file as {_path_of(keep)}"
                        for x in others]
    return Found(sorted(files), sorted(kept, key=lambda d: str(d.path)), skipped, not_dumps)


def _path_of(x) -> pathlib.Path:
    return x.path if isinstance(x, TorchDumpFile) else x


def find_traces(path: pathlib.Path) -> list[pathlib.Path]:
    return walk_traces(path)[0]


SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


def find_snapshots(path: pathlib.Path) -> list[pathlib.Path]:
    """The memory snapshots under ``path`` (``torch.cuda.memory._dump_snapshot`` pickles:
    ``*.pickle``, ``*.pkl``; ``analysis/memory/snapshot.py``), the report folders and hidden
    ones left out; regular files only, no link followed. ``path`` itself when it is such a
    file."""
    path = pathlib.Path(path)
    if path.is_file():
        return [path] if path.name.endswith(SNAPSHOT_SUFFIXES) else []
    if not path.is_dir():
        return []
    out = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != rd.REPORT and not d.startswith("."))
        for name in sorted(names):
            f = pathlib.Path(folder) / name
            if name.endswith(SNAPSHOT_SUFFIXES) and not f.is_symlink() and f.is_file():
                out.append(f)
    return out


def load_dumps(run: pathlib.Path) -> tuple[FlightRecords, list[str]]:
    """The usable Flight Recorder dumps under ``run``, and a line naming each dump that could
    not be used. Each dump is reduced to its rows as soon as it is read, so one dump's decoded
    JSON is held at a time."""
    records, problems = FlightRecords(), []
    for f in sorted((pathlib.Path(run) / rd.COMMS).glob("rank*.json")):
        why = rd.unusable_file(f, run)
        if why:
            problems.append(f"{f}: {why}")
            continue
        try:
            records.add(read_dump(f))
        except ValueError as e:
            problems.append(str(e))
    return records, problems


def load_torch_dumps(found: Found) -> tuple[FlightRecords, list[str], list[str]]:
    """PyTorch's own dumps (``found.dumps``) as one table, a line naming each one that could
    not be used (its rank left out of the comparison, the others compared) and each file named
    like the dumps but holding something else, and the notes that say what was read. Two files
    that give one rank stop the analysis (``InputError`` naming both): which one is that rank's
    is not guessed."""
    records, problems = FlightRecords(), []
    claims: dict[int, list[TorchDumpFile]] = {}
    for d in found.dumps:
        claims.setdefault(d.rank, []).append(d)
    for rank, same in sorted(claims.items()):
        if len(same) > 1:
            raise InputError(os.path.commonpath([str(d.path) for d in same]),
                             f"{len(same)} Flight Recorder dumps give rank {rank}: "
                             f"{', '.join(str(d.path) for d in same)}; keep one per rank")
    torchcomms = 0
    for d in found.dumps:
        try:
            dump = flight_recorder.read_torch_dump(d.path, d.rank, d.form)
        except ValueError as e:
            problems.append(str(e))
            continue
        records.add(dump)
        if dump.flight_recorder is not None and \
                fr_forms.is_torchcomms(dump.flight_recorder.pg_config):
            torchcomms += 1
    prefixes = {d.prefix for d in found.dumps}
    problems += [f"{f}: named like a Flight Recorder dump ({prefix}<rank>), but {why}; not read"
                 for f, prefix, why in found.not_dumps if prefix in prefixes]
    notes = []
    if found.dumps:
        forms = sorted({d.form for d in found.dumps})
        shown = ", ".join(f"{p}<rank>" for p in sorted(prefixes)[:3])
        notes.append(f"Flight Recorder: {len(records.ranks)} of {len(found.dumps)} PyTorch "
                     f"dumps read ({shown}; {' and '.join(forms)}), each rank taken from its "
                     f"file name")
    if torchcomms:
        notes.append(f"Flight Recorder: {torchcomms} of the dumps written by TorchComms' "
                     f"FlightRecorderHook (its pg_config's ranks are \"0,1,…\"; p2p sequence "
                     f"numbers are not kept)")
    return records, problems, notes


def load_debug_folder(fr_trace: pathlib.Path, stacks: pathlib.Path | None
                      ) -> tuple[FlightRecords, list[str], list[str]]:
    """The debug server's dump folder (``collectors/fr_forms.py``, 3.): each rank's entries
    rebuilt from the newest ``fr_trace_<stamp>.txt``, its stack from the ``stacks`` file where
    there is one; (records, problems, notes). A table that cannot be read is a problem and no
    rank is read."""
    records, problems, notes = FlightRecords(), [], []
    try:
        dumps, absent, block = fr_forms.read_debug_fr_trace(fr_trace)
    except ValueError as e:
        return records, [str(e)], notes
    for rank, data in sorted(dumps.items()):
        try:
            records.add(flight_recorder.Dump(
                schema_version=flight_recorder.FR_SCHEMA_VERSION, rank=rank,
                flight_recorder=flight_recorder._typed(
                    data, flight_recorder.TorchDump, fr_trace,
                    f"debug server table (rank {rank})")))
        except ValueError as e:
            problems.append(str(e))
    kept = 0
    if stacks is not None:
        try:
            for rank, lines in fr_forms.read_debug_stacks(stacks).items():
                if rank in records.last_frames and lines and not records.last_frames[rank]:
                    records.last_frames[rank] = lines
                    kept += 1
        except ValueError as e:
            problems.append(str(e))
    notes.append(f"Flight Recorder: the debug server's dump folder, {fr_trace.name} ({block}, "
                 f"{len(records.ranks)} ranks rebuilt from its Collectives table"
                 + (f"; stacks of {kept} ranks from {stacks.name}" if kept else "") + ")")
    if absent:
        problems.append(f"{fr_trace}: the debug server says rank"
                        f"{'s' if len(absent) > 1 else ''} {ranges(absent)} did not respond: "
                        f"no Flight Recorder entries of {'them' if len(absent) > 1 else 'it'}")
    return records, problems, notes


def select_flight(inp: Inputs, groups=(), ranks=()) -> Inputs:
    """``inp`` with only the Flight Recorder entries of ``groups`` (a group's name or
    description) and the dumps of ``ranks`` (``--fr-group`` / ``--fr-rank``; none given:
    all), a note saying what was kept; a group or rank that matches nothing is a problem."""
    if not groups and not ranks:
        return inp
    flight = inp.flight.only(groups, ranks)
    problems, notes = list(inp.problems), list(inp.notes)
    known = {x for g in inp.flight.groups for x in g}
    problems += [f"--fr-group {g}: no process group of that name or description in the Flight "
                 f"Recorder dumps (groups: {', '.join(sorted(known)[:8]) or 'none'})"
                 for g in groups if g not in known]
    problems += [f"--fr-rank {r}: no Flight Recorder dump of rank {r}" for r in ranks
                 if r not in inp.flight.ranks]
    said = []
    if groups:
        said.append(f"group{'s' if len(groups) > 1 else ''} {', '.join(groups)}")
    if ranks:
        said.append(f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}")
    notes.append(f"Flight Recorder: only {' and '.join(said)} read (--fr-group / --fr-rank): "
                 f"{len(flight)} of {len(inp.flight)} entries")
    return dataclasses.replace(inp, flight=flight, problems=problems, notes=notes)


def flight_facts(flight: FlightRecords, run: RunInfo | None) -> dict:
    """What the dumps say of the job: ``backends`` (``nccl``, ``gloo``…), ``on_gpu`` (a
    backend that runs on a device: NCCL, RCCL, XCCL), ``world_size`` and where it comes from
    (run.json; the default group's ranks in a dump's ``pg_config``; else at least one more
    than the highest rank that left a dump)."""
    backends = flight.backends
    if run is not None:
        world, source = run.world_size, "run.json"
    elif flight.world_size is not None:
        world, source = flight.world_size, "the default group's ranks in the dumps' pg_config"
    elif flight.ranks:
        world, source = max(flight.ranks) + 1, "the highest rank that left a dump"
    else:
        world, source = None, None
    return {"backends": backends, "on_gpu": any(b in GPU_BACKENDS for b in backends),
            "world_size": world, "world_size_from": source}


# Communication libraries of a device (the part of a Flight Recorder entry's profiling_name
# before its colon): a job whose dumps name one ran on GPUs (or XPUs).
GPU_BACKENDS = frozenset({"nccl", "rccl", "xccl", "hccl", "ncclx"})


def _rank_files(path: pathlib.Path, traces: list[pathlib.Path]) -> int:
    """How many ranks left a file: the most of traces, step-timer files and dumps."""
    counts = [len(traces)]
    for folder, pattern in ((rd.STEPS, "rank*.parquet"), (rd.COMMS, "rank*.json")):
        counts.append(sum(1 for _ in (path / folder).glob(pattern)))
    return max(counts)


def _check_world(run: RunInfo, path: pathlib.Path, traces: list[pathlib.Path]) -> None:
    n = _rank_files(path, traces)
    if run.world_size > RANKS_PER_FILE * max(n, 1):
        raise RunDirError(f"{run.path}: $.world_size: {run.world_size} ranks, but only {n} "
                          f"left a file (traces, step timers, dumps): at most "
                          f"{RANKS_PER_FILE}× that is believed")


def gather(path: pathlib.Path) -> Inputs:
    """The inputs under ``path`` (module docstring); InputError when the path does not exist,
    RunDirError when its run.json cannot be used and there are no traces to analyse alone."""
    path = pathlib.Path(path)
    if not path.exists():
        raise InputError(path, "no such file or directory")
    found = walk_inputs(path)
    traces = found.traces
    problems: list[str] = list(found.skipped)
    notes: list[str] = []
    run = None
    if path.is_dir():
        try:
            run_json = path / rd.RUN_JSON
            why = (rd.unusable_file(run_json, path)
                   if run_json.exists() or run_json.is_symlink() else None)
            if why:
                raise RunDirError(f"{run_json}: {why}")
            run = read_run_info(path)
            if run is not None:
                _check_world(run, path, traces)
        except RunDirError as e:
            if not traces and not found.dumps:
                raise
            problems.append(f"{e}; analysed as a plain folder of traces")
            notes.append("run.json is not usable (see problems): the traces are analysed "
                         "without its layout, schedule and process groups")
            run = None
    steps = pd.DataFrame()
    flight = FlightRecords()
    has_comms = path.is_dir() and (path / rd.COMMS).is_dir()
    if path.is_dir():
        steps, unreadable = step_timer.read_all(path, STEP_COLUMNS)
        problems += unreadable
    if has_comms:
        flight, unusable = load_dumps(path)
        problems += unusable
    elif found.dumps:
        flight, unusable, read = load_torch_dumps(found)
        problems += unusable
        notes += read
    elif path.is_dir() and (debug := fr_forms.debug_folder(path)) is not None:
        flight, unusable, read = load_debug_folder(*debug)
        problems += unusable
        notes += read
        has_comms = True
    elif not traces:        # nothing to analyse: name what looked like a dump but is none
        problems += [f"{f}: named like a Flight Recorder dump ({prefix}<rank>), but {why}; "
                     f"not read" for f, prefix, why in found.not_dumps]
    missing = flight.missing_note(run.world_size if run is not None else None)
    if missing:
        notes.append(missing)
    return Inputs(path=path, run=run, trace_files=traces, flight=flight,
                  has_dumps=has_comms or bool(found.dumps), steps=steps, problems=problems,
                  notes=notes)
