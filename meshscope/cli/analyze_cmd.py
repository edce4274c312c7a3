"""``meshscope analyze``: a run directory or any folder of Kineto traces → its report."""
from __future__ import annotations

import json
import pathlib

import click

from .common import fail

def _load_baseline(path: str | None):
    """A bandwidth baseline: bench-comm's baseline.parquet/.csv, or nccl-tests output (a log
    file or a folder of them)."""
    if not path:
        return None
    import pandas as pd

    from meshscope.analysis.comm import nccl_tests

    p = pathlib.Path(path)
    try:
        if p.is_dir():
            frames = [nccl_tests.read(f) for f in sorted(p.glob("*.log"))]
            return pd.concat(frames, ignore_index=True) if frames else None
        if p.suffix == ".parquet":
            return pd.read_parquet(p)
        if p.suffix == ".csv":
            return pd.read_csv(p)
        return nccl_tests.read(p)
    except (OSError, ValueError) as e:
        fail(f"{p}: not a usable baseline ({e})")


def report_dir(path, out=None) -> pathlib.Path:
    """Where the report of ``path`` goes: ``out``, else ``PATH/report``."""
    from meshscope.collectors.run_dir import ReportDir

    return pathlib.Path(out) if out else ReportDir.of_run(path).path


def default_options(target: pathlib.Path):
    """The options of a plain ``meshscope analyze`` writing to ``target``: the trace cache in
    ``target/.cache``, a progress bar (what ``meshscope run``'s demo and ``dashboard --html``
    analyse with)."""
    from meshscope.analysis.report.options import AnalysisOptions
    from meshscope.collectors.run_dir import ReportDir

    return AnalysisOptions(cache_dir=ReportDir(target).cache, progress=True)


def _check_patterns(options) -> None:
    """One line and exit code 2 for a flag's regular expression that does not compile."""
    try:
        options.patterns()
    except ValueError as e:
        fail(str(e))


def run_analysis(path, out=None, options=None):
    """Analyse ``path`` as ``options`` say (``AnalysisOptions``; None: ``default_options``)
    and write its report to ``out`` (default ``PATH/report``); one line and exit code 2 on
    bad input. Returns the report and its directory."""
    from meshscope.analysis.report.process_memory import use_system_allocator

    use_system_allocator()          # before the analysis imports pyarrow
    from meshscope.analysis.errors import InputError
    from meshscope.analysis.report.analyze import analyze as do_analyze
    from meshscope.collectors.run_dir import RunDirError

    target = report_dir(path, out)
    options = options if options is not None else default_options(target)
    _check_patterns(options)
    try:
        report = do_analyze(pathlib.Path(path), options)
    except (InputError, RunDirError) as e:
        fail(str(e))
    try:
        report.write(target)
    except OSError as e:
        fail(f"{target}: cannot write the report ({e.strerror}); choose another with --out DIR")
    return report, target


@click.command()
@click.argument("path", type=click.Path())
@click.option("--out", type=click.Path(file_okay=False),
              help="Report directory (default: PATH/report).")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of text.")
@click.option("--comm-kernel-regex", default=None,
              help="Extra regular expression for communication kernels (e.g. custom "
                   "symmetric-memory or DeepEP kernels).")
@click.option("--rank-regex", default=None,
              help="For traces without distributedInfo whose file names are not rank<N> / "
                   "worker<N>: a regular expression with one group that captures the rank "
                   "from the file name, e.g. 'gpu(\\d+)'.")
@click.option("--step-annotation", default=None, metavar="REGEX",
              help="For traces without ProfilerStep ranges (inference, custom loops): a "
                   "regular expression naming the host ranges that are steps (its first "
                   "group, if a number, numbers them); without it such a trace is one "
                   "window.")
@click.option("--no-cache", is_flag=True,
              help="Parse every trace afresh instead of reusing the parquet copies kept in "
                   "the report directory's .cache/ (keyed by each file's content hash).")
@click.option("--baseline", default=None, type=click.Path(exists=True),
              help="Bandwidth baseline: `meshscope bench-comm`'s baseline.parquet, or "
                   "nccl-tests output (a log, or a folder of *.log).")
@click.option("--layout", default=None,
              help="For traces of another framework whose groups carry no mesh names: the "
                   "job's layout, e.g. dp=4,tp=2,pp=2, so that each process group maps to its "
                   "dimension by its ranks.")
@click.option("--rank-order", default=None,
              help="With --layout: how ranks were laid out, dimensions from the fastest-varying "
                   "to the slowest, e.g. tp-cp-ep-dp-pp (Megatron's default, also "
                   "'megatron'), tp-cp-dp-pp ('torchtitan', meshscope's own; the default).")
@click.option("--warmup-steps", default=0, show_default=True, type=click.IntRange(min=0),
              help="Treat the first N steps as warm-up (besides those the step time shows).")
@click.option("--engine", default="local", show_default=True,
              type=click.Choice(["local", "dask"]),
              help="Where the per-rank work runs: this machine's processes, or a Dask cluster "
                   "(docs/scaling.md).")
@click.option("--scheduler", default=None,
              help="With --engine dask: the scheduler's address (tcp://host:8786); without it "
                   "a local cluster of --workers processes.")
@click.option("--max-trace-bytes", default=None, metavar="SIZE",
              help="Budget: JSON text one trace may inflate to (default 8GiB); a trace past "
                   "any budget is refused while it is read, the other ranks analysed.")
@click.option("--max-events", default=None, type=click.IntRange(min=1), metavar="N",
              help="Budget: events in one trace (default 20,000,000).")
@click.option("--max-event-bytes", default=None, metavar="SIZE",
              help="Budget: text of one event, so of any string in it (default 64MiB).")
@click.option("--max-rank-memory", default=None, metavar="SIZE",
              help="Budget: memory of one rank's event table, or of a trace that cannot be "
                   "streamed (default 8GiB).")
@click.option("--max-nesting", default=None, type=click.IntRange(min=1), metavar="N",
              help="Budget: levels of nested arrays and objects anywhere in one trace "
                   "(default 64; a Kineto event is about 5 deep).")
@click.option("--snapshot", "snapshots", multiple=True, type=click.Path(exists=True,
                                                                       dir_okay=False),
              help="A PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's pickle, or "
                   "its JSON) to read beside the traces; repeatable. *.pickle / *.pkl files "
                   "under PATH are read too; PATH may be a snapshot alone.")
@click.option("--device-memory", default=None, metavar="SIZE",
              help="Memory of one device (e.g. 80GiB), for the near-OOM finding where the "
                   "traces do not say (a CPU run's, a trace without deviceProperties).")
@click.option("--workers", default=None, type=click.IntRange(min=1),
              help="Worker processes (default: one per core; with --engine dask and no "
                   "--scheduler, the local cluster's size, default 2).")
def analyze(path, out, as_json, comm_kernel_regex, rank_regex, step_annotation, no_cache,
            baseline, layout, rank_order, warmup_steps, engine, scheduler, workers,
            max_trace_bytes, max_events, max_event_bytes, max_rank_memory, max_nesting,
            snapshots, device_memory):
    """Analyse a run directory or any folder of Kineto traces."""
    import dataclasses

    from meshscope.analysis.ingest import budgets
    from meshscope.analysis.report import reuse
    from meshscope.analysis.report.options import AnalysisOptions
    from meshscope.collectors.run_dir import ReportDir

    flags = {"events": max_events, "nesting": max_nesting}
    for name, flag, text in (("trace_bytes", "--max-trace-bytes", max_trace_bytes),
                             ("event_bytes", "--max-event-bytes", max_event_bytes),
                             ("rank_memory", "--max-rank-memory", max_rank_memory)):
        try:
            flags[name] = budgets.parse_size(text) if text is not None else None
        except ValueError as e:
            fail(f"{flag}: {e}")
    try:
        device_bytes = budgets.parse_size(device_memory) if device_memory is not None else None
    except ValueError as e:
        fail(f"--device-memory: {e}")
    # The budgets in force: this process' environment, with the flags given over it.
    limits = dataclasses.replace(budgets.current(),
                                 **{k: v for k, v in flags.items() if v is not None})
    target = report_dir(path, out)
    options = AnalysisOptions(
        comm_kernel_re=comm_kernel_regex, rank_regex=rank_regex,
        step_annotation=step_annotation, cache_dir=None if no_cache else ReportDir(target).cache,
        workers=workers, progress=True, baseline=_load_baseline(baseline), layout=layout,
        rank_order=rank_order, warmup_steps=warmup_steps, engine=engine, scheduler=scheduler,
        budgets=limits, snapshots=tuple(pathlib.Path(s) for s in snapshots),
        device_memory=device_bytes)
    digest = reuse.key(pathlib.Path(path), target, _reuse_options(options, baseline)) \
        if pathlib.Path(path).exists() else None
    summary = reuse.cached_summary(target, digest) if digest and not no_cache else None
    if summary is None:
        _, target = run_analysis(path, target, options)
        if digest:
            reuse.store(target, digest)
        summary = json.loads(ReportDir(target).summary.read_text())
        verb = "written"
    else:
        verb = "unchanged (its inputs are; --no-cache computes it afresh)"
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        from meshscope.analysis.report.printable import printable
        from meshscope.analysis.report.reader import read_summary
        from meshscope.analysis.report.text import render
        for p in read_summary(summary).problems:
            click.echo(f"meshscope: warning: {printable(p)}", err=True)
        click.echo(render(summary))
        click.echo(f"\nreport {verb}: {printable(target)}")


def _reuse_options(options, baseline_path: str | None) -> dict:
    """The options that change the report, as the reuse key holds them
    (``analysis/report/reuse.py``): the patterns, the layout, the warm-up, the baseline's file
    (its content is stat-ed by the key) and the budgets where they are not the defaults.
    Where and how fast the work runs (engine, workers, cache) changes no number."""
    from meshscope.analysis.ingest.budgets import non_default

    key = {"comm_kernel_regex": options.comm_kernel_re, "rank_regex": options.rank_regex,
           "layout": options.layout, "rank_order": options.rank_order,
           "warmup_steps": options.warmup_steps, "baseline": baseline_path,
           "step_annotation": options.step_annotation}
    if options.snapshots:
        key["snapshots"] = [str(s) for s in options.snapshots]
    if options.device_memory is not None:
        key["device_memory"] = options.device_memory
    if (budgets := non_default(options.budgets)) is not None:
        key["budgets"] = budgets
    return key


COMMANDS = (analyze,)
