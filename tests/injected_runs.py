"""Runner jobs with a known hang cause injected (issue 47 item 4), made once per session and
shared: ``conftest.injected_runs`` (a session fixture) is an ``InjectedRuns``, and
``injected_runs["host-stall"]`` runs that job the first time it is asked for and returns its
``InjectedRun`` — the run folder (``run``), PyTorch's own pickles of it (``fr``, written because
``TORCH_FR_DUMP_TEMP_FILE`` names ``fr/_dump_``), the injected rank and step, and how the
command ended. The folders are ``<session tmp>/injected-runsN/<name>/{run,fr}``, fixed for the
session whoever asks first.

Every job is the same 4-rank ``dp=2,pp=2`` layout (the world group, two dp pairs and two pp
pairs: a verdict must name the right one) of ``STEPS`` steps with a group timeout of
``TIMEOUT_S`` seconds, the fault at step ``STEP`` (two steps of entries before it), and
``OMP_NUM_THREADS=1``. The three causes issue 47 adds (``parallel/faults.py``):

- ``size-mismatch`` — rank 1's extra world all_reduce holds 8 elements, its peers' 4;
- ``order-divergence`` — rank 2 issues the world broadcast before the world all_reduce its
  peers issue first;
- ``host-stall`` — rank 3's host waits for a lock before the extra world all_reduce that its
  peers wait in until they time out.

``hang``, ``crash``, ``desync`` (the older faults, at the same step) and ``healthy`` (none) are
there for a comparison; tests/test_injected_causes.py runs the three new ones only.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Iterator, Mapping

from conftest import meshscope

LAYOUT = "dp=2,pp=2"
WORLD = 4
STEPS = 3
STEP = 2
TIMEOUT_S = 10

# name → the rank the fault is on (None: no fault).
FAULT_RANK: dict[str, int | None] = {
    "size-mismatch": 1, "order-divergence": 2, "host-stall": 3,
    "hang": 2, "crash": 1, "desync": 1, "healthy": None,
}


@dataclasses.dataclass(frozen=True)
class InjectedRun:
    name: str                 # the --inject kind, or "healthy"
    rank: int | None          # the rank the fault is on
    step: int                 # the step it acts at
    run: pathlib.Path         # the run folder (run.json, comms/, logs/, traces)
    fr: pathlib.Path          # PyTorch's own pickles of the run: fr/_dump_<R>
    returncode: int           # of `meshscope run`
    stderr: str
    wall_s: float

    @property
    def inject(self) -> str | None:
        return None if self.rank is None else f"{self.name}={self.rank}:{self.step}"

    def run_json(self) -> dict:
        return json.loads((self.run / "run.json").read_text())

    def dump(self, rank: int) -> dict:
        """The runner's own dump of ``rank`` (comms/rank{R}.json)."""
        return json.loads((self.run / "comms" / f"rank{rank}.json").read_text())


class InjectedRuns(Mapping):
    """name → ``InjectedRun``, each job run on first use (one at a time)."""

    def __init__(self, root: pathlib.Path):
        self.root = pathlib.Path(root)
        self._made: dict[str, InjectedRun] = {}

    def __getitem__(self, name: str) -> InjectedRun:
        if name not in FAULT_RANK:
            raise KeyError(name)
        if name not in self._made:
            self._made[name] = _make(self.root / name, name)
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(FAULT_RANK)

    def __len__(self) -> int:
        return len(FAULT_RANK)


def _make(root: pathlib.Path, name: str) -> InjectedRun:
    rank = FAULT_RANK[name]
    run, fr = root / "run", root / "fr"
    root.mkdir(parents=True)
    inject = [] if rank is None else ["--inject", f"{name}={rank}:{STEP}"]
    t0 = time.monotonic()
    proc = meshscope("run", "--layout", LAYOUT, "--steps", STEPS, "--timeout", TIMEOUT_S,
                     *inject, "--out", run, timeout=240,
                     env={"TORCH_FR_DUMP_TEMP_FILE": f"{fr}/_dump_"})
    return InjectedRun(name=name, rank=rank, step=STEP, run=run, fr=fr,
                       returncode=proc.returncode, stderr=proc.stderr,
                       wall_s=time.monotonic() - t0)
