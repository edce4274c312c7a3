"""What an analysis is asked to do: ``AnalysisOptions``, one frozen record.

``analyze(path, options)`` (``analysis/report/analyze.py``) reads everything it may vary from
here; ``meshscope analyze`` builds one from its flags (``cli/analyze_cmd.py``), and the notebook
API (``analysis.open(path, **fields)``) from its keyword arguments. Every field has the default
that ``meshscope analyze`` without the flag has, so ``AnalysisOptions()`` is the plain analysis.

Fields, one by one:

- ``comm_kernel_re`` — an extra regular expression for communication kernels (custom
  symmetric-memory or DeepEP kernels that the built-in patterns miss); ``--comm-kernel-regex``.
- ``rank_regex`` — a regular expression with one group that takes the rank from a trace's
  file name, for traces without ``distributedInfo`` whose names are not ``rank<N>`` /
  ``worker<N>``; ``--rank-regex``.
- ``step_annotation`` — a regular expression naming the host ranges that are steps, for traces
  without ``ProfilerStep`` (``timeline/rank_timeline.host_step_ranges``); ``--step-annotation``.
- ``cache_dir`` — the folder of the parquet copies of the event tables
  (``analysis/ingest/cache.py``); None reads every trace afresh. The command uses
  ``<report dir>/.cache`` unless ``--no-cache``.
- ``workers`` — per-rank worker processes: with the local engine, default one per core and at
  most one per file; with ``engine="dask"`` and no ``scheduler``, the local cluster's size
  (default 2).
- ``progress`` — a progress bar on stderr when it is a terminal and the per-rank work takes
  over a second (the command sets it; the API does not).
- ``baseline`` — a bandwidth baseline table (``meshscope bench-comm``'s baseline, or
  nccl-tests output read by ``analysis/comm/nccl_tests``) for the efficiency column of the
  bandwidth summary; ``--baseline`` names the file, the command reads it into this table.
- ``layout`` / ``rank_order`` — for traces of another framework whose groups carry no mesh
  names: the job's layout (``dp=4,tp=2,pp=2``) and how its ranks were laid out, fastest
  dimension first (``analysis/comm/dims.py``, ``LayoutMap``); ``--layout`` / ``--rank-order``.
- ``warmup_steps`` — the first N steps count as warm-up whatever the step timers say;
  ``--warmup-steps``.
- ``engine`` / ``scheduler`` — where the per-rank work runs (``analysis/report/engines.py``):
  ``local`` processes, or ``dask`` on the cluster at ``scheduler`` (``tcp://host:8786``), a
  local one without; ``--engine`` / ``--scheduler``.
- ``snapshots`` — PyTorch memory snapshots to read beside the traces (``--snapshot FILE``,
  repeatable: ``torch.cuda.memory._dump_snapshot`` pickles or their JSON form,
  ``analysis/memory/snapshot.py``); ``*.pickle`` / ``*.pkl`` files under the analysed folder
  are read too.
- ``device_memory`` — bytes of memory of one device, for the near-OOM finding where the
  traces do not say (``--device-memory 80GiB``; ``analysis/memory/gather.py``).
- ``budgets`` — the reading budgets of every trace (``analysis/ingest/budgets.py``: bytes,
  events, event size, rank memory, nesting). None: those this process' environment sets (the
  defaults where it sets none). Given, they are in force for the analysis alone — set in this
  process' environment while it runs, which the local pool's workers inherit and every Dask
  task carries — and the environment is as it was afterwards.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import TYPE_CHECKING

from meshscope.analysis.ingest.budgets import Budgets

if TYPE_CHECKING:
    import pandas as pd


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
    """Every option of one analysis (module docstring, field by field)."""
    comm_kernel_re: str | None = None
    rank_regex: str | None = None
    step_annotation: str | None = None
    cache_dir: pathlib.Path | None = None
    workers: int | None = None
    progress: bool = False
    baseline: pd.DataFrame | None = dataclasses.field(default=None, compare=False)
    layout: str | None = None
    rank_order: str | None = None
    warmup_steps: int = 0
    engine: str = "local"
    scheduler: str | None = None
    budgets: Budgets | None = None
    snapshots: tuple[pathlib.Path, ...] = ()
    device_memory: int | None = None

    @classmethod
    def of(cls, options: AnalysisOptions | None = None, **fields) -> AnalysisOptions:
        """``options`` with ``fields`` replaced (``AnalysisOptions()`` when None): what
        ``analyze(path, options, **fields)`` and ``analysis.open(path, **fields)`` use.
        An unknown field is a TypeError naming it."""
        base = options if options is not None else cls()
        return dataclasses.replace(base, **fields) if fields else base

    def key_fields(self, baseline_path: str | None = None) -> dict:
        """The options that change the report, as the reuse key holds them
        (``analysis/report/reuse.py``): the patterns, the layout, the warm-up, the baseline's
        file (``baseline_path``: its content is stat-ed by the key) and the budgets where
        they are not the defaults, the snapshots named (path, size and time) and the device
        memory given. Where and how fast the work runs (engine, workers, cache, progress)
        changes no number."""
        from meshscope.analysis.ingest.budgets import non_default

        key = {"comm_kernel_regex": self.comm_kernel_re, "rank_regex": self.rank_regex,
               "layout": self.layout, "rank_order": self.rank_order,
               "warmup_steps": self.warmup_steps, "baseline": baseline_path,
               "step_annotation": self.step_annotation}
        if self.snapshots:          # named files outside the analysed folder: their stat
            key["snapshots"] = [_stat(f) for f in self.snapshots]
        if self.device_memory is not None:
            key["device_memory"] = self.device_memory
        if (limits := non_default(self.budgets)) is not None:
            key["budgets"] = limits
        return key

    def patterns(self) -> Patterns:
        """The regular expressions of these options, compiled: the one place they are
        checked (the command before it starts, the analysis for the API). ValueError naming
        the flag, the pattern and the problem, on one line."""
        from meshscope.analysis.ingest.events import compile_rank_regex

        compiled = {}
        for flag, name in (("--comm-kernel-regex", "comm_kernel_re"),
                           ("--step-annotation", "step_annotation")):
            pattern = getattr(self, name)
            try:
                compiled[name] = re.compile(pattern) if pattern else None
            except re.error as e:
                raise ValueError(f"{flag} {pattern!r} is not a regular expression ({e})") \
                    from None
        return Patterns(rank_regex=compile_rank_regex(self.rank_regex), **compiled)


def _stat(path: pathlib.Path) -> list:
    """A file's path, size and modification time (what the reuse key holds of a file named by
    a flag, outside the analysed folder)."""
    try:
        st = pathlib.Path(path).stat()
        return [str(path), st.st_size, st.st_mtime_ns]
    except OSError:
        return [str(path), None, None]


@dataclasses.dataclass(frozen=True)
class Patterns:
    """``AnalysisOptions.patterns()``: each regular expression compiled, None when not given."""
    comm_kernel_re: re.Pattern | None
    rank_regex: re.Pattern | None
    step_annotation: re.Pattern | None
