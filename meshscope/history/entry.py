"""What identifies one analysed run in the index: ``RunEntry``, read from a report folder.

``entry_of(report)`` reads the report's ``summary.json`` (``analysis/report/reader``), its
reuse key (``ReportDir.key``; a report without one — the shipped samples, a report copied by
hand — is keyed by a digest of its summary) and, for a run's own report (``RUN/report``), the
run's ``run.json``. It only reads: nothing is written into the folder (issue 40).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

from meshscope.analysis.report import reader
from meshscope.collectors.run_dir import (CACHE, REPORT, RUN_JSON, SUMMARY, ReportDir,
                                         RunDirError, unusable_file)
from meshscope.collectors.run_json import read_run_info


class EntryError(ValueError):
    """A folder that is not a readable report; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class FindingRow:
    """One finding of a report, as the index keeps it (``findings`` view)."""
    finding: str
    severity: str
    dimension: str | None
    cost_us: float | None
    cost_pct: float | None
    title: str


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """One report as the index registers it (docs/history.md, view ``runs``)."""
    report_path: str                 # the report folder, absolute
    run_path: str | None             # the run folder of a run's own report (RUN/report)
    report_key: str                  # .cache/report.key, else "summary:" + digest of summary
    summary_mtime_ns: int            # summary.json's modification time: unchanged → skipped
    run_id: str | None
    model: str | None                # run.json's model preset
    layout: str | None               # run.json's layout ("dp=2,pp=2")
    world_size: int | None
    schedule: str | None
    device: str | None               # the traces' device type: cpu | gpu
    device_name: str | None          # the traces' device model, else run.json's device name
    start_time: str | None           # run.json's start time (ISO 8601)
    command: str | None              # run.json's command, as one JSON list
    torch_version: str | None        # run.json's, else the traces'
    nccl_version: str | None
    cuda_runtime: str | None
    trust_verdict: str | None        # issue 45's verdict; None before summary schema 5
    step_time_us: float | None
    step_time_source: str | None
    noise_us: float | None           # the step timers' step-to-step noise
    window_us: float | None
    tokens_per_s: float | None
    mfu_pct: float | None
    ranks: int
    findings: tuple[FindingRow, ...] = ()


def _joined(values: list) -> str | None:
    return " / ".join(map(str, values)) if values else None


def report_key(report: pathlib.Path) -> str:
    """The report's reuse key (what it was made from), else a digest of its summary."""
    files = ReportDir(report)
    try:
        key = files.key.read_text(encoding="utf-8").strip()
        if key:
            return key
    except OSError:
        pass
    try:
        digest = hashlib.blake2b(files.summary.read_bytes(), digest_size=16).hexdigest()
    except OSError as e:
        raise EntryError(f"{files.summary}: cannot be read ({e.strerror or e})") from None
    return f"summary:{digest}"


def entry_of(report: pathlib.Path) -> RunEntry:
    """The ``RunEntry`` of the report folder ``report``; EntryError when it is not one."""
    report = pathlib.Path(report).resolve()
    files = ReportDir(report)
    for path in (files.summary, files.key):      # never open a FIFO or a device (it hangs)
        why = unusable_file(path)
        if why and (path == files.summary or path.exists() or path.is_symlink()):
            raise EntryError(f"{path}: {why}")
    try:
        mtime = files.summary.stat().st_mtime_ns
        doc = reader.read_summary_file(report)
        s = reader.read_summary(doc)
    except OSError as e:
        raise EntryError(f"{files.summary}: cannot be read ({e.strerror or e})") from None
    except reader.ReportError as e:
        raise EntryError(str(e)) from None
    info = None
    run_path = None
    # run.json is read only where it is a regular file inside the run (a FIFO would hang
    # the reader, as a damaged run's may be): else the summary's own run facts stand alone.
    if report.name == REPORT and unusable_file(report.parent / RUN_JSON, report.parent) is None:
        run_path = str(report.parent)
        try:
            info = read_run_info(report.parent)
        except RunDirError as e:
            raise EntryError(str(e)) from None
    elif report.name == REPORT:
        run_path = str(report.parent)
    run = s.run
    env = s.environment
    torch = (info.versions.get("torch") if info is not None else None) or \
        _joined(env.torch_versions)
    findings = tuple(FindingRow(f.id.value, f.severity, f.dimension, f.cost_us, f.cost_pct,
                                f.title) for f in s.findings)
    return RunEntry(
        report_path=str(report), run_path=run_path, report_key=report_key(report),
        summary_mtime_ns=mtime,
        run_id=run.run_id if run else None,
        model=s.model_preset,
        layout=run.layout_str if run else None,
        world_size=(run.world_size if run and run.world_size else
                    (env.world_sizes[0] if env.world_sizes else None)),
        schedule=run.schedule if run else None,
        device=s.device,
        device_name=_joined(env.devices) or (run.device.name if run else None),
        start_time=(info.start_time if info is not None else None),
        command=json.dumps(list(info.command)) if info is not None and info.command else None,
        torch_version=str(torch) if torch else None,
        nccl_version=_joined(env.nccl_versions),
        cuda_runtime=_joined(env.cuda_runtime_versions),
        trust_verdict=s.trust.verdict if s.trust is not None else None,
        step_time_us=s.step_time_us, step_time_source=s.step_time_source,
        noise_us=s.cross_rank.noise_us, window_us=s.window_us,
        tokens_per_s=s.tokens_per_s, mfu_pct=s.mfu_pct, ranks=len(s.ranks),
        findings=findings)


def reports_under(folder: pathlib.Path) -> list[pathlib.Path]:
    """Every report folder at or under ``folder`` (a report itself, a run with ``report/``, a
    folder of runs), sorted; a report's own ``.cache`` is not searched."""
    folder = pathlib.Path(folder)
    if (folder / SUMMARY).is_file():
        return [folder]
    out = []
    for summary in sorted(folder.rglob(SUMMARY)):
        if CACHE in summary.parts[len(folder.parts):]:
            continue
        out.append(summary.parent)
    return out
