"""``meshscope sweep``: run every valid layout of N ranks for a model, analyse each, compare them.

A sweep folder holds::

    SWEEP/
      sweep.json        what was asked (world size, model, dimensions, schedules, microbatches,
                        steps …) and every run's state: pending, running, completed or failed
                        (with its error and the stage it failed in), start, end, seconds
      plan.json         the planner's prediction for every layout, made before the first run
      comparison.json   ``meshscope compare SWEEP --json``, rewritten after every run
      comparison.csv    the same table for spreadsheets
      logs/NAME.log     each run's output (the launcher's and its ranks')
      NAME/             one run directory per layout (run.json, traces/, steps/, comms/,
                        report/), NAME as ``Candidate.name``: dp2-pp2-1f1b-mb4

**Enumeration** (``candidates``): every split of N into dp · tp · pp · cp over the dimensions
asked for (ep, when asked for and the model is a MoE, over the divisors of dp · cp), crossed
with the schedules (for pp > 1), microbatch counts and dp modes (for dp · cp > 1), kept when
``parallel.layout.validate`` — the check ``meshscope run`` makes before launch — accepts it.

**Running**: each layout runs in a child process (``python -m meshscope.layouts.sweep
SWEEP NAME``) that calls ``parallel.launch.launch`` and then ``analysis.report.analyze`` and
writes the report into the run directory; the sweep itself never imports torch. The child is
tied to the sweep (Linux: it receives SIGTERM when the sweep dies, even by SIGKILL, and
torchrun's launcher then stops its ranks), so an interrupted sweep leaves no ranks behind.
A run whose ranks fail, or whose analysis fails, is recorded as failed with its error (the
last line of its log when it died without one) and the sweep goes on.

**Resuming**: starting the same sweep again on the same folder (the same options, or
``--resume SWEEP``) skips every completed run (its run.json says completed and its report is
written), re-runs what was running or pending from scratch, and keeps failed runs as they are
unless ``--retry-failed``. Options that differ from the folder's sweep.json are refused.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

from meshscope.collectors.run_dir import SWEEP_JSON, ReportDir, RunDirError, write_json_atomic
from meshscope.collectors.run_json import read_run_info

from meshscope.parallel.config import PRESETS, ModelConfig
from .plan.candidate import Candidate
from .plan.enumerate import ChoiceError, enumerate_candidates

SWEEP_SCHEMA_VERSION = 1
STATUSES = ("pending", "running", "completed", "failed")


class SweepError(ChoiceError):
    """A sweep that cannot start or be read; the message is one line (``ChoiceError``:
    the layouts cannot be chosen)."""


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """What a sweep runs: the layouts come from ``candidates(spec)``."""
    world: int
    model: str = "tiny"
    model_overrides: tuple[tuple[str, int], ...] = ()
    dims: tuple[str, ...] = ("dp", "tp", "pp")
    schedules: tuple[str, ...] = ("1f1b",)
    microbatches: tuple[int, ...] = (4,)
    dp_modes: tuple[str, ...] = ("ddp",)
    layouts: tuple[str, ...] | None = None      # explicit layouts instead of every split
    steps: int = 4
    global_batch: int = 16
    seed: int = 0
    profile_steps: tuple[int, int] | None = None
    sp: bool = True
    faults: tuple[str, ...] = ()     # ``meshscope run --inject`` texts, applied to every run

    @property
    def model_config(self) -> ModelConfig:
        if self.model not in PRESETS:
            raise SweepError(f"unknown model {self.model!r} (known: {', '.join(PRESETS)})")
        return dataclasses.replace(PRESETS[self.model], **dict(self.model_overrides))

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model_overrides"] = dict(self.model_overrides)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SweepSpec":
        d = dict(d)
        d["model_overrides"] = tuple(sorted((d.get("model_overrides") or {}).items()))
        for key in ("dims", "schedules", "microbatches", "dp_modes"):
            d[key] = tuple(d[key])
        d["faults"] = tuple(d.get("faults") or ())
        d["layouts"] = tuple(d["layouts"]) if d.get("layouts") else None
        d["profile_steps"] = tuple(d["profile_steps"]) if d.get("profile_steps") else None
        return cls(**d)


def candidates(spec: SweepSpec) -> list[Candidate]:
    """The layouts a sweep runs (``plan.enumerate``); SweepError naming one it cannot."""
    try:
        return enumerate_candidates(spec.world, spec.model_config, dims=spec.dims,
                                    schedules=spec.schedules, microbatches=spec.microbatches,
                                    dp_modes=spec.dp_modes, global_batch=spec.global_batch,
                                    sp=spec.sp, layouts=spec.layouts)
    except ChoiceError as e:
        raise SweepError(str(e)) from None


# -- the sweep folder -----------------------------------------------------------------------

def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass
class SweepRun:
    """One layout's state in sweep.json (an item of ``runs``, written in this order)."""
    name: str
    candidate: dict                 # ``Candidate.as_dict()``
    status: str = "pending"         # one of STATUSES
    error: str | None = None        # why it failed
    stage: str | None = None        # the stage it was in: run, analyze
    started: str | None = None      # ISO times, UTC
    finished: str | None = None
    wall_s: float | None = None

    @property
    def layout(self) -> str | None:
        layout = self.candidate.get("layout")
        return layout if isinstance(layout, str) else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SweepFile:
    """A sweep folder's sweep.json, read (``read_sweep``)."""
    spec: dict
    created: str | None
    runs: list[SweepRun]


def _sweep_run(path: pathlib.Path, i: int, d) -> SweepRun:
    """Item ``i`` of sweep.json's runs as a SweepRun; SweepError naming the field."""
    def bad(field: str, what: str) -> SweepError:
        return SweepError(f"{path}: field runs[{i}].{field} must be {what}")

    if not isinstance(d, dict):
        raise SweepError(f"{path}: field runs[{i}] must be an object")
    if not isinstance(d.get("name"), str):
        raise bad("name", "a string")
    if d.get("status") not in STATUSES:
        raise bad("status", f"one of {', '.join(STATUSES)}")
    candidate = d.get("candidate") or {}
    if not isinstance(candidate, dict):
        raise bad("candidate", "an object")
    for field in ("error", "stage", "started", "finished"):
        if d.get(field) is not None and not isinstance(d[field], str):
            raise bad(field, "a string or null")
    wall_s = d.get("wall_s")
    if wall_s is not None and (isinstance(wall_s, bool) or not isinstance(wall_s, (int, float))):
        raise bad("wall_s", "a number or null")
    return SweepRun(d["name"], candidate, d["status"], d.get("error"), d.get("stage"),
                    d.get("started"), d.get("finished"), wall_s)


def read_sweep(folder: pathlib.Path) -> SweepFile:
    """A sweep folder's sweep.json, typed (SweepError naming the file, the field and the
    problem)."""
    path = pathlib.Path(folder) / SWEEP_JSON
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{path}: no such file (not a sweep folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SweepError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema_version") != SWEEP_SCHEMA_VERSION:
        raise SweepError(f"{path}: unknown schema_version "
                         f"{data.get('schema_version') if isinstance(data, dict) else None!r}"
                         f" (this meshscope reads version {SWEEP_SCHEMA_VERSION})")
    runs = data.get("runs")
    if not isinstance(runs, list):
        raise SweepError(f"{path}: field runs must be a list of runs with a name and a status "
                         f"({', '.join(STATUSES)})")
    spec = data.get("spec")
    created = data.get("created")
    return SweepFile(spec if isinstance(spec, dict) else {},
                     created if isinstance(created, str) else None,
                     [_sweep_run(path, i, r) for i, r in enumerate(runs)])


def is_complete_run(run: pathlib.Path) -> bool:
    """The run trained to the end and its report is written."""
    try:
        info = read_run_info(run)
    except (OSError, RunDirError):
        return False
    return info is not None and info.status == "completed" and \
        ReportDir.of_run(run).summary.is_file()


class Sweep:
    """A sweep folder being run: its spec, its candidates and each run's state."""

    def __init__(self, folder: pathlib.Path, spec: SweepSpec):
        self.folder = pathlib.Path(folder)
        self.spec = spec
        self.candidates = candidates(spec)
        self.state: dict[str, SweepRun] = {}
        self.created = _now()

    @classmethod
    def open(cls, folder: pathlib.Path, spec: SweepSpec | None = None) -> "Sweep":
        """A new sweep in ``folder``, or the one already there (``spec`` None: take it from
        sweep.json). SweepError when ``spec`` differs from the folder's."""
        folder = pathlib.Path(folder)
        existing = (folder / SWEEP_JSON).exists()
        if not existing:
            if spec is None:
                raise SweepError(f"{folder / SWEEP_JSON}: no such file (not a sweep folder)")
            if folder.exists() and any(folder.iterdir()):
                raise SweepError(f"output folder {folder} exists, is not empty and holds no "
                                 f"sweep.json (choose a new one)")
        data = read_sweep(folder) if existing else None
        if data is not None:
            try:
                stored = SweepSpec.from_dict(data.spec)
            except (KeyError, TypeError, ValueError) as e:
                raise SweepError(f"{folder / SWEEP_JSON}: field spec is not usable ({e})") \
                    from None
            if spec is not None and spec != stored:
                diff = [k for k, v in spec.as_dict().items() if stored.as_dict().get(k) != v]
                raise SweepError(f"{folder} holds a sweep started with other options "
                                 f"({', '.join(diff)} differ); resume it with `meshscope sweep "
                                 f"--resume {folder}` or choose a new --out")
            spec = stored
        sweep = cls(folder, spec)
        if data is not None:
            sweep.state = {r.name: r for r in data.runs}
        for c in sweep.candidates:
            sweep.state.setdefault(c.name, SweepRun(c.name, c.as_dict()))
        if data is not None:
            sweep.created = data.created or sweep.created
        return sweep

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.folder / SWEEP_JSON, {
            "schema_version": SWEEP_SCHEMA_VERSION, "kind": "meshscope-sweep",
            "created": self.created, "updated": _now(), "spec": self.spec.as_dict(),
            "runs": [self.state[c.name].to_dict() for c in self.candidates]})

    def run_dir(self, name: str) -> pathlib.Path:
        return self.folder / name

    def log_path(self, name: str) -> pathlib.Path:
        return self.folder / "logs" / f"{name}.log"

    def todo(self, retry_failed: bool = False) -> list[Candidate]:
        """Candidates still to run: not completed (or completed but its run directory is not,
        e.g. deleted since), and not failed unless ``retry_failed``."""
        out = []
        for c in self.candidates:
            st = self.state[c.name]
            if st.status == "completed" and is_complete_run(self.run_dir(c.name)):
                continue
            if st.status == "failed" and not retry_failed:
                continue
            out.append(c)
        return out


# -- one run, in a child process ------------------------------------------------------------

def _result_path(sweep_dir: pathlib.Path, name: str) -> pathlib.Path:
    return sweep_dir / "logs" / f"{name}.result.json"


def _run_one(sweep_dir: pathlib.Path, name: str) -> int:
    """The child: train and analyse one candidate; writes logs/NAME.result.json."""
    from meshscope.parallel.rank_start import rank_modules, start_server

    sweep = Sweep.open(sweep_dir)
    cand = next(c for c in sweep.candidates if c.name == name)
    start_server(rank_modules(cand.layout, cand.dp_mode))  # importing torch beside this process
    from meshscope.parallel.faults import parse_fault
    from meshscope.parallel.launch import LaunchError, launch
    from meshscope.parallel.options import RunOptions

    result = _result_path(sweep_dir, name)
    spec = sweep.spec

    def report(**kw):
        write_json_atomic(result, kw)

    report(status="running", stage="run")
    opts = RunOptions(layout=cand.layout, model=spec.model_config, out=sweep.run_dir(name),
                      schedule=cand.schedule, microbatches=cand.microbatches, steps=spec.steps,
                      seed=spec.seed, global_batch=cand.global_batch,
                      profile_steps=spec.profile_steps, model_preset=spec.model,
                      virtual_stages=cand.virtual, dp_mode=cand.dp_mode, sp=cand.sp,
                      command=["meshscope", "sweep", str(sweep_dir), name])
    try:
        opts.faults = [parse_fault(f) for f in spec.faults]
        launch(opts)
    except (LaunchError, ValueError) as e:     # ValueError: LayoutError, a bad --inject
        report(status="failed", stage="run", error=str(e))
        return 1
    report(status="running", stage="analyze")
    from meshscope.analysis.errors import InputError
    from meshscope.analysis.report.ensure import analysed
    from meshscope.analysis.report.options import AnalysisOptions
    run = sweep.run_dir(name)
    report_dir = ReportDir.of_run(run)
    try:
        # As `meshscope analyze RUN` does: the report keyed by its inputs and options, so a
        # later analyze, compare or dashboard of the run reuses it instead of analysing again.
        analysed(run, report_dir.path, AnalysisOptions(cache_dir=report_dir.cache))
    except (InputError, RunDirError, OSError) as e:
        report(status="failed", stage="analyze", error=str(e))
        return 1
    report(status="completed", stage=None)
    return 0


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the sweep process dies (Linux prctl)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _last_line(path: pathlib.Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


@dataclasses.dataclass
class RunOutcome:
    name: str
    status: str
    error: str | None
    wall_s: float
    stage: str | None = None      # where a failed run failed: run or analyze


def _launch_child(sweep: Sweep, cand: Candidate, on_stage=None) -> RunOutcome:
    name = cand.name
    run = sweep.run_dir(name)
    if run.exists():
        shutil.rmtree(run)           # what an interrupted attempt left
    log = sweep.log_path(name)
    log.parent.mkdir(parents=True, exist_ok=True)
    result = _result_path(sweep.folder, name)
    result.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "meshscope.layouts.sweep",
                                 str(sweep.folder), name], stdout=out,
                                stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent if sys.platform == "linux"
                                else None)
        stage = None
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                try:
                    now = json.loads(result.read_text()).get("stage")
                except (OSError, ValueError):
                    now = stage
                if now != stage and now is not None and on_stage:
                    on_stage(now)
                stage = now
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    wall = time.monotonic() - start
    try:
        res = json.loads(result.read_text())
    except (OSError, ValueError):
        res = {}
    if res.get("status") == "completed" and proc.returncode == 0:
        return RunOutcome(name, "completed", None, wall)
    error = res.get("error") or (f"the run's process exited with code {proc.returncode}: "
                                 f"{_last_line(log) or 'no output'} (see {log})")
    return RunOutcome(name, "failed", error, wall, res.get("stage") or "run")


class _Display:
    """Progress on stderr: a rich bar and the current run's stage on a terminal, one plain
    line per run otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done = total, 0
        self.rich = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn)
            self.rich = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(file=sys.stderr))
            self.rich.start()
            self.task = self.rich.add_task("sweep", total=total)
        self.enabled = enabled

    def start(self, name: str) -> None:
        if self.rich:
            self.rich.update(self.task, description=f"{name}: training")
        elif self.enabled:
            print(f"meshscope sweep: [{self.done + 1}/{self.total}] {name} ...",
                  file=sys.stderr, flush=True)

    def stage(self, name: str, stage: str) -> None:
        if self.rich:
            word = {"run": "training", "analyze": "analysing"}.get(stage, stage)
            self.rich.update(self.task, description=f"{name}: {word}")

    def finish(self, outcome: RunOutcome, line: str) -> None:
        self.done += 1
        if self.rich:
            self.rich.console.print(line)
            self.rich.update(self.task, completed=self.done)
        elif self.enabled:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.rich:
            self.rich.stop()


def run_sweep(sweep: Sweep, *, retry_failed: bool = False, progress: bool = True,
              after_run=None) -> list[RunOutcome]:
    """Run every candidate still to do, one after the other; ``after_run(sweep)`` is called
    after each (the CLI rewrites the comparison there). Returns this invocation's outcomes."""
    todo = sweep.todo(retry_failed)
    sweep.save()
    display = _Display(len(todo), progress)
    outcomes = []
    try:
        for cand in todo:
            st = sweep.state[cand.name] = SweepRun(cand.name, cand.as_dict(), "running",
                                                   stage="run", started=_now())
            sweep.save()
            display.start(cand.name)
            outcome = _launch_child(sweep, cand,
                                    on_stage=lambda s, n=cand.name: display.stage(n, s))
            st.status, st.error, st.stage = outcome.status, outcome.error, outcome.stage
            st.finished, st.wall_s = _now(), round(outcome.wall_s, 1)
            sweep.save()
            outcomes.append(outcome)
            mark = "done" if outcome.status == "completed" else "FAILED"
            line = f"  {mark:6} {cand.name} ({outcome.wall_s:.0f} s)" + \
                (f": {outcome.stage} failed: {outcome.error}" if outcome.error else "")
            display.finish(outcome, line)
            if after_run is not None:
                after_run(sweep)
    finally:
        display.close()
    return outcomes


if __name__ == "__main__":
    sys.exit(_run_one(pathlib.Path(sys.argv[1]), sys.argv[2]))
