"""Every rank's memory tables joined, with what only the whole job knows: the pipeline stage of
each rank, the device memory given on the command line, and the memory snapshots.

``gather(per_rank, run, snapshot_files, device_memory_bytes)`` returns ``Memory``: the report's
memory tables (``TABLES``, registered in ``analysis/report/tables.py``), the snapshots'
summaries (summary.json's ``memory.snapshots``), the problems met reading snapshots found in
the folder, and each rank's stage.

- ``memory_devices.stage``: the rank's pipeline stage (run.json's mesh; null without one).
- ``memory_devices.device_total_bytes``: the device's memory from the trace's
  ``deviceProperties``; where the trace does not say, ``--device-memory`` (then
  ``device_total_source`` is ``--device-memory``). The flag applies to every rank's
  accelerator — or to the CPU on a run without one.
- Snapshots (``snapshot.py``): each file's rank from its name (``rank3.pickle``), else 0.
"""
from __future__ import annotations

import dataclasses
import pathlib

import pandas as pd

from meshscope.analysis.ingest.rank_naming import name_rank
from meshscope.analysis.memory import curve, oom, rank_memory, snapshot, steps, terms

TABLES: dict[str, list[str]] = {
    "memory_steps": steps.COLUMNS,
    "memory_devices": rank_memory.DEVICE_COLUMNS + ["stage"],
    "memory_live": rank_memory.LIVE_COLUMNS,
    "memory_curve": curve.COLUMNS,
    "memory_terms": terms.COLUMNS,
    "memory_segments": snapshot.SEGMENT_COLUMNS,
    "memory_snapshot_live": snapshot.LIVE_COLUMNS,
}


@dataclasses.dataclass(frozen=True)
class Memory:
    tables: dict[str, pd.DataFrame]
    snapshots: list[dict]
    problems: list[str]
    stage_of: dict[int, int]
    device_memory_bytes: int | None


def empty(name: str) -> pd.DataFrame:
    """The memory table ``name`` without rows (its columns, of no type)."""
    return pd.DataFrame(columns=TABLES[name])


def _concat(parts: list[pd.DataFrame], name: str) -> pd.DataFrame:
    parts = [p for p in parts if p is not None and len(p)]
    cols = TABLES[name]
    if not parts:
        return empty(name)
    return pd.concat(parts, ignore_index=True).reindex(columns=cols)


def gather(per_rank: dict[int, dict[str, pd.DataFrame]], run, snapshot_files:
           list[tuple[pathlib.Path, bool]], device_memory_bytes: int | None,
           max_snapshot_bytes: int | None = None) -> Memory:
    """``per_rank``: rank → its tables (``rank_memory.rank_tables``); ``snapshot_files``:
    (path, given on the command line). A snapshot given on the command line that cannot be
    read raises ``snapshot.SnapshotError``; one found in the folder is a problem line."""
    ranks = sorted(per_rank)
    tables = {name: _concat([per_rank[r].get(name) for r in ranks], name)
              for name in TABLES if not name.startswith(("memory_segments",
                                                         "memory_snapshot"))}
    stage_of = {}
    if run is not None and run.pipeline_stages > 1:
        for r in ranks:
            s = run.stage_of(r)
            if s is not None:
                stage_of[r] = int(s)
    dev = tables["memory_devices"]
    if len(dev):
        dev["stage"] = dev["rank"].map(stage_of).astype("Int64") if stage_of else pd.NA
        if device_memory_bytes:
            accel = dev.groupby("rank")["device"].transform(lambda d: (d != "cpu").any())
            applies = dev["device_total_bytes"].isna() & ((dev["device"] != "cpu") | ~accel)
            dev.loc[applies, "device_total_bytes"] = device_memory_bytes
            dev.loc[applies, "device_total_source"] = "--device-memory"
    segments, live, summaries, problems = [], [], [], []
    for path, given in snapshot_files:
        try:
            snap = snapshot.read(path, max_snapshot_bytes)
        except snapshot.SnapshotError as e:
            if given:
                raise
            problems.append(f"{e}; skipped")
            continue
        rank = name_rank(path)
        rank = 0 if rank is None else rank
        seg, lv, summ = snapshot.analyse(rank, snap, path.name)
        for row, d in zip(summ, snapshot._devices(snap)):
            why = oom.explain(snap, d) if row["oom"] else None
            if why is not None:
                row["oom"].update(explained=why.text(), shortfall_bytes=why.shortfall_bytes,
                                  held_bytes=dict(why.held_bytes), fits_if=list(why.fits_if),
                                  sites=[f"{s} ({k}): {b:,} bytes" for s, k, b in why.sites])
        segments += seg
        live += lv
        summaries += summ
    tables["memory_segments"] = pd.DataFrame(segments, columns=TABLES["memory_segments"])
    tables["memory_snapshot_live"] = pd.DataFrame(live, columns=TABLES["memory_snapshot_live"])
    return Memory(tables=tables, snapshots=summaries, problems=problems, stage_of=stage_of,
                  device_memory_bytes=device_memory_bytes)


def main_devices(devices: pd.DataFrame) -> pd.DataFrame:
    """One row of ``memory_devices`` per rank, its main device: the accelerator with the
    largest peak, else its CPU."""
    if devices.empty:
        return devices
    d = devices.assign(_acc=devices["device"] != "cpu")
    d = d.sort_values(["rank", "_acc", "peak_allocated_bytes"], ascending=[True, False, False])
    return d.groupby("rank", as_index=False).head(1).drop(columns="_acc").reset_index(drop=True)


def stages(devices: pd.DataFrame, stage_of: dict[int, int]) -> list[dict]:
    """Per pipeline stage: its ranks and the largest peak among their main devices, and which
    rank it is (summary.json's ``memory.stages``)."""
    if devices.empty or not stage_of:
        return []
    main = main_devices(devices)
    out = []
    for stage in sorted(set(stage_of.values())):
        ranks = sorted(r for r, s in stage_of.items() if s == stage)
        mine = main[main["rank"].isin(ranks)]
        if mine.empty:
            continue
        top = mine.sort_values("peak_allocated_bytes", ascending=False).iloc[0]
        out.append({"stage": stage, "ranks": ranks,
                    "peak_allocated_bytes": int(top["peak_allocated_bytes"]),
                    "peak_rank": int(top["rank"]), "device": top["device"]})
    return out
