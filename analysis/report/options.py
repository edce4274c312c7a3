"""What an analysis is asked to do: ``AnalysisOptions``, one frozen record, each option declared
once — its type and default, and (``Flag``, the field's metadata) its flag, help and place in
the reuse key; ``meshscope analyze`` and ``meshscope compare`` build their flags from it
(``cli/analyze_cmd._flag_options``) and the reuse key its fields (``key_fields``).

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
  without ``ProfilerStep`` (``timeline/step_windows.host_step_ranges``); ``--step-annotation``.
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
- ``fr_groups`` / ``fr_ranks`` — read only these process groups' Flight Recorder entries (a
  group's name or description) and these ranks' dumps (``inputs.select_flight``); none given:
  all; ``--fr-group NAME`` / ``--fr-rank R``, each repeatable.
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
class Flag:
    """How an option is given on the command line, declared with the option
    (``AnalysisOptions``' field metadata): its flag, its help, what it takes (``kind``: text,
    regex, path, int, count, size, choice, paths — a repeatable path, texts / ints —
    repeatable text / integers), and ``key``: the name
    the reuse key (``analysis/report/reuse.py``) holds it under, None for an option that
    changes no number (where and how fast the work runs). ``meshscope analyze`` and
    ``meshscope compare`` build their flags from these (``cli/analyze_cmd.analysis_flags``)."""
    flag: str
    help: str
    kind: str = "text"
    key: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()


def _option(default, flag: Flag, **field):
    return dataclasses.field(default=default, metadata={"flag": flag}, **field)


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
    """Every option of one analysis (module docstring, field by field), each declared once:
    its type and default here, its flag, help and place in the reuse key in ``Flag``."""
    comm_kernel_re: str | None = _option(None, Flag(
        "--comm-kernel-regex", "Extra regular expression for communication kernels (e.g. "
        "custom symmetric-memory or DeepEP kernels).", "regex", key="comm_kernel_regex"))
    rank_regex: str | None = _option(None, Flag(
        "--rank-regex", "For traces without distributedInfo whose file names are not rank<N> "
        "/ worker<N>: a regular expression with one group that captures the rank from the file "
        "name, e.g. 'gpu(\\d+)'.", "regex", key="rank_regex"))
    step_annotation: str | None = _option(None, Flag(
        "--step-annotation", "For traces without ProfilerStep ranges (inference, custom "
        "loops): a regular expression naming the host ranges that are steps (its first group, "
        "if a number, numbers them); without it such a trace is one window.", "regex",
        key="step_annotation", metavar="REGEX"))
    cache_dir: pathlib.Path | None = None
    workers: int | None = _option(None, Flag(
        "--workers", "Worker processes (default: one per core; with --engine dask and no "
        "--scheduler, the local cluster's size, default 2).", "count"))
    progress: bool = False
    baseline: pd.DataFrame | None = _option(None, Flag(
        "--baseline", "Bandwidth baseline: `meshscope bench-comm`'s baseline.parquet, or "
        "nccl-tests output (a log, or a folder of *.log).", "path", key="baseline"),
        compare=False)
    layout: str | None = _option(None, Flag(
        "--layout", "For traces of another framework whose groups carry no mesh names: the "
        "job's layout, e.g. dp=4,tp=2,pp=2, so that each process group maps to its dimension "
        "by its ranks.", key="layout"))
    rank_order: str | None = _option(None, Flag(
        "--rank-order", "With --layout: how ranks were laid out, dimensions from the "
        "fastest-varying to the slowest, e.g. tp-cp-ep-dp-pp (Megatron's default, also "
        "'megatron'), tp-cp-dp-pp ('torchtitan', meshscope's own; the default).",
        key="rank_order"))
    warmup_steps: int = _option(0, Flag(
        "--warmup-steps", "Treat the first N steps as warm-up (besides those the step time "
        "shows).", "int", key="warmup_steps"))
    engine: str = _option("local", Flag(
        "--engine", "Where the per-rank work runs: this machine's processes, or a Dask "
        "cluster (docs/scaling.md).", "choice", choices=("local", "dask")))
    scheduler: str | None = _option(None, Flag(
        "--scheduler", "With --engine dask: the scheduler's address (tcp://host:8786); without "
        "it a local cluster of --workers processes."))
    budgets: Budgets | None = None      # the --max-* flags (budgets.FLAGS, budgets.HELP)
    snapshots: tuple[pathlib.Path, ...] = _option((), Flag(
        "--snapshot", "A PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's pickle, "
        "or its JSON) to read beside the traces; repeatable. *.pickle / *.pkl files under PATH "
        "are read too; PATH may be a snapshot alone.", "paths", key="snapshots"))
    device_memory: int | None = _option(None, Flag(
        "--device-memory", "Memory of one device (e.g. 80GiB), for the near-OOM finding where "
        "the traces do not say (a CPU run's, a trace without deviceProperties).", "size",
        key="device_memory", metavar="SIZE"))
    fr_groups: tuple[str, ...] = _option((), Flag(
        "--fr-group", "Read only this process group's Flight Recorder entries (its name, as "
        "the dumps give it, or its description, e.g. mesh_dp or default_pg); repeatable. As "
        "torch's fr_trace --pg-filters.", "texts", key="fr_groups", metavar="NAME"))
    fr_ranks: tuple[int, ...] = _option((), Flag(
        "--fr-rank", "Read only this rank's Flight Recorder dump; repeatable.", "ints",
        key="fr_ranks", metavar="RANK"))

    @classmethod
    def flags(cls) -> list[tuple[str, Flag, object]]:
        """(field name, its ``Flag``, its default) of every option given by a flag, in the
        order ``--help`` lists them."""
        return [(f.name, f.metadata["flag"], f.default) for f in dataclasses.fields(cls)
                if "flag" in f.metadata]

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
        they are not the defaults, the snapshots named (their paths: the key hashes each one's
        content, ``reuse.key``) and the device memory given. Where and how fast the work runs
        (engine, workers, cache, progress) changes no number."""
        from meshscope.analysis.ingest.budgets import non_default

        key: dict = {}
        for name, flag, _ in self.flags():
            if flag.key is None:
                continue
            value = getattr(self, name)
            if name == "baseline":          # the table's file: the key stats its content
                key[flag.key] = baseline_path
            elif name == "snapshots":       # named files: the key hashes their content
                if value:
                    key[flag.key] = [str(f) for f in value]
            elif name in ("fr_groups", "fr_ranks"):
                if value:
                    key[flag.key] = sorted(value)
            elif name == "device_memory":
                if value is not None:
                    key[flag.key] = value
            else:
                key[flag.key] = value
        if (limits := non_default(self.budgets)) is not None:
            key["budgets"] = limits
        return key

    def patterns(self) -> Patterns:
        """The regular expressions of these options, compiled: the one place they are
        checked (the command before it starts, the analysis for the API). ValueError naming
        the flag, the pattern and the problem, on one line."""
        from meshscope.analysis.ingest.rank_naming import compile_rank_regex

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


@dataclasses.dataclass(frozen=True)
class Patterns:
    """``AnalysisOptions.patterns()``: each regular expression compiled, None when not given."""
    comm_kernel_re: re.Pattern | None
    rank_regex: re.Pattern | None
    step_annotation: re.Pattern | None
