"""Everything the analysis reads from disk, read and checked once, at the boundary.

``gather(path)`` returns ``Inputs``: the typed run.json (``collectors.run_info``; None for a
plain folder of traces), the trace files to ingest, every rank's Flight Recorder dump and step
timers, and a line for each input that could not be used (``problems``: the file, the field and
what is wrong). Nothing later in the analysis opens a file by itself, except the trace files,
which the ingest workers read (``analysis/ingest``).

``find_traces(path)``: the trace files of a run directory (``traces/``) or, for any other
folder, every ``*.json`` and ``*.json.gz`` below it but meshscope's own files.

``resolve_identities(ids)``: which rank each ingested trace file is (``TraceIdentity``: what its
``distributedInfo`` and its name say), and which files cannot be kept: of two files claiming
one rank the first (in name order) is kept and the other named under ``problems``.
"""
from __future__ import annotations

import dataclasses
import pathlib

import pandas as pd

from meshscope.analysis.errors import InputError
from meshscope.collectors import run_dir as rd, step_timer
from meshscope.collectors.flight_recorder import read_dump
from meshscope.collectors.run_info import RunInfo, read_run_info

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclasses.dataclass
class Inputs:
    path: pathlib.Path
    run: RunInfo | None
    trace_files: list[pathlib.Path]
    dumps: dict[int, dict]          # rank → its Flight Recorder dump (read_dump's dict)
    has_comms: bool                 # the run directory has a comms/ folder
    steps: pd.DataFrame             # every rank's step timers (collectors/step_timer.py)
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


def identity(path: pathlib.Path, rank: int, meta: dict) -> TraceIdentity:
    info = meta.get("distributedInfo") if isinstance(meta, dict) else None
    info = info if isinstance(info, dict) else {}
    mine = meta.get("meshscope") if isinstance(meta, dict) else None
    def _int(v):
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    return TraceIdentity(path=pathlib.Path(path), rank=rank, info_rank=_int(info.get("rank")),
                         world_size=_int(info.get("world_size")),
                         run_id=mine.get("run_id") if isinstance(mine, dict)
                         and isinstance(mine.get("run_id"), str) else None)


def resolve_identities(ids: list[TraceIdentity]) -> tuple[dict[pathlib.Path, int], list[str]]:
    """file → rank for the files to keep, and a line for each file left out."""
    kept: dict[pathlib.Path, int] = {}
    owner: dict[int, pathlib.Path] = {}
    problems = []
    for i in ids:
        if i.rank in owner:
            problems.append(f"{i.path}: duplicate rank {i.rank} (already read from "
                            f"{owner[i.rank]}); skipped")
            continue
        owner[i.rank] = i.path
        kept[i.path] = i.rank
    return kept, problems


def find_traces(path: pathlib.Path) -> list[pathlib.Path]:
    path = pathlib.Path(path)
    if path.is_file():
        return [path]
    if (path / rd.RUN_JSON).is_file():  # a run directory: its traces are in traces/ only
        root = path / rd.TRACES
        if not root.is_dir():
            return []
    else:
        root = path
    skip = {rd.RUN_JSON, "summary.json", "config.json"}
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                  and p.name not in skip and rd.REPORT not in p.relative_to(root).parts[:-1])


def load_dumps(run: pathlib.Path) -> tuple[dict[int, dict], list[str]]:
    """rank → its Flight Recorder dump, and a line naming each dump that could not be used."""
    dumps, problems = {}, []
    for f in sorted((pathlib.Path(run) / rd.COMMS).glob("rank*.json")):
        try:
            d = read_dump(f)
        except ValueError as e:
            problems.append(str(e))
            continue
        dumps[d["rank"]] = d
    return dumps, problems


def gather(path: pathlib.Path) -> Inputs:
    """The inputs under ``path`` (module docstring); InputError when the path does not exist,
    RunDirError when its run.json cannot be used."""
    path = pathlib.Path(path)
    if not path.exists():
        raise InputError(path, "no such file or directory")
    run = read_run_info(path) if path.is_dir() else None
    problems: list[str] = []
    steps = pd.DataFrame()
    dumps: dict[int, dict] = {}
    has_comms = path.is_dir() and (path / rd.COMMS).is_dir()
    if path.is_dir():
        steps, unreadable = step_timer.read_all(path)
        problems += unreadable
    if has_comms:
        dumps, unusable = load_dumps(path)
        problems += unusable
    return Inputs(path=path, run=run, trace_files=find_traces(path), dumps=dumps,
                  has_comms=has_comms, steps=steps, problems=problems)
