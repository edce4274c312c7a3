"""Everything the analysis reads from disk, read and checked once, at the boundary.

``gather(path)`` returns ``Inputs``: the typed run.json (``collectors.run_info``; None for a
plain folder of traces), the trace files to ingest, every rank's Flight Recorder buffer (one
compact table, ``records.fr_table.FlightRecords``, each dump reduced as it is read) and step
timers, a line for each input that could not be used (``problems``: the file, the field and
what is wrong) and a line for each thing a reader should know (``notes``). Nothing later in the
analysis opens a file by itself, except the trace files, which the ingest workers read
(``analysis/ingest``).

- An invalid run.json (``collectors.run_info.read_run_info``), or one whose world size is more
  than ``RANKS_PER_FILE`` times the ranks that left a file (traces, step timers, dumps): where
  there are traces, a problem line and analysis as a plain folder of traces (``run`` is None, a
  note says so); without traces ``RunDirError`` (exit code 2).
- A Flight Recorder dump that is not usable (``collectors.flight_recorder.read_dump``: its
  schema, its rank against its file name) is a problem of that rank; the others are compared.

``find_traces(path)``: the trace files of a run directory (``traces/``) or, for any other
folder, every ``*.json`` and ``*.json.gz`` below it but meshscope's own files. Symbolic links
are followed, to files and to folders, each real folder and file read once: a link that leads
back into a folder already being read (a loop), a second path to a file already listed, or a
broken link is named and skipped (``walk_traces`` says which).

``identity(path, rank, meta)`` — who a trace says it is (``TraceIdentity``);
``resolve_identities(ids, run=)`` — which rank each ingested file is:

- a rank comes from ``distributedInfo``, else from the file name; with ``--rank-regex`` from
  the file name first (``ingest.events.rank_of``: the user's explicit choice);
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
from meshscope.analysis.ingest.events import NO_RANK, RANKLESS_KEY, name_rank
from meshscope.analysis.records.fr_table import FlightRecords
from meshscope.collectors import run_dir as rd, step_timer
from meshscope.collectors.flight_recorder import read_dump
from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.run_info import RunInfo, read_run_info

# run.json may describe a job larger than the files it left (traces of some ranks only), but
# not by more than this factor: a larger world size is not believed (nor allocated).
RANKS_PER_FILE = 8
# What the report reads of the step timers (analysis/records/steps.py).
STEP_COLUMNS = ["rank", "step", "wall_time_us", "loss"]


@dataclasses.dataclass
class Inputs:
    path: pathlib.Path
    run: RunInfo | None
    trace_files: list[pathlib.Path]
    flight: FlightRecords           # every usable Flight Recorder dump, as one table
    has_comms: bool                 # the run directory has a comms/ folder
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

def walk_traces(path: pathlib.Path) -> tuple[list[pathlib.Path], list[str]]:
    """(trace files under ``path``, a line per link skipped): ``find_traces`` with what it
    left out and why."""
    path = pathlib.Path(path)
    if path.is_file():     # a memory snapshot given alone is no trace (find_snapshots)
        return ([] if path.name.endswith(SNAPSHOT_SUFFIXES) else [path]), []
    if not path.is_dir():
        why = rd.unusable_file(path)
        return [], [f"{path}: {why}"] if why else []
    home = None                         # a run directory: links may not lead outside it
    if (path / rd.RUN_JSON).exists() or (path / rd.RUN_JSON).is_symlink():
        # a run directory: its traces are in traces/ only
        root, home = path / rd.TRACES, path
        if not root.is_dir():
            return [], []
    else:
        root = path
    skip = rd.NOT_TRACES
    skipped: list[str] = []
    seen_dirs: set[tuple[int, int]] = set()
    by_file: dict[tuple[int, int], list[pathlib.Path]] = {}
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
            if not name.endswith(rd.TRACE_SUFFIXES) or name in skip:
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
            by_file.setdefault((fst.st_dev, fst.st_ino), []).append(f)
    files = []
    for paths in by_file.values():
        # The file itself rather than a link to it, then the shortest path.
        keep, *others = sorted(paths, key=lambda p: (p.is_symlink(), len(p.parts), str(p)))
        files.append(keep)
        skipped += [f"{p}: skipped, the same file as {keep}" for p in others]
    return sorted(files), skipped


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
    traces, skipped = walk_traces(path)
    problems: list[str] = list(skipped)
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
            if not traces:
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
    return Inputs(path=path, run=run, trace_files=traces, flight=flight, has_comms=has_comms,
                  steps=steps, problems=problems, notes=notes)
