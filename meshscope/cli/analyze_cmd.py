"""``meshscope analyze``: a run directory or any folder of Kineto traces → its report."""
from __future__ import annotations

import dataclasses
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
    except InputError as e:             # a folder the report may not replace
        fail(str(e))
    except OSError as e:
        fail(f"{target}: cannot write the report ({e.strerror}); choose another with --out DIR")
    return report, target


#: The options of an analysis, in the order ``--help`` lists them: ``analyze`` takes them,
#: and ``compare`` takes the same for every path it analyses (``analysis_flags``).
_FLAGS = (
    click.option("--comm-kernel-regex", default=None,
                 help="Extra regular expression for communication kernels (e.g. custom "
                      "symmetric-memory or DeepEP kernels)."),
    click.option("--rank-regex", default=None,
                 help="For traces without distributedInfo whose file names are not rank<N> / "
                      "worker<N>: a regular expression with one group that captures the rank "
                      "from the file name, e.g. 'gpu(\\d+)'."),
    click.option("--step-annotation", default=None, metavar="REGEX",
                 help="For traces without ProfilerStep ranges (inference, custom loops): a "
                      "regular expression naming the host ranges that are steps (its first "
                      "group, if a number, numbers them); without it such a trace is one "
                      "window."),
    click.option("--no-cache", is_flag=True,
                 help="Parse every trace afresh instead of reusing the parquet copies kept in "
                      "the report directory's .cache/ (keyed by each file's content hash)."),
    click.option("--baseline", default=None, type=click.Path(exists=True),
                 help="Bandwidth baseline: `meshscope bench-comm`'s baseline.parquet, or "
                      "nccl-tests output (a log, or a folder of *.log)."),
    click.option("--layout", default=None,
                 help="For traces of another framework whose groups carry no mesh names: the "
                      "job's layout, e.g. dp=4,tp=2,pp=2, so that each process group maps to "
                      "its dimension by its ranks."),
    click.option("--rank-order", default=None,
                 help="With --layout: how ranks were laid out, dimensions from the "
                      "fastest-varying to the slowest, e.g. tp-cp-ep-dp-pp (Megatron's "
                      "default, also 'megatron'), tp-cp-dp-pp ('torchtitan', meshscope's own; "
                      "the default)."),
    click.option("--warmup-steps", default=0, show_default=True, type=click.IntRange(min=0),
                 help="Treat the first N steps as warm-up (besides those the step time "
                      "shows)."),
    click.option("--engine", default="local", show_default=True,
                 type=click.Choice(["local", "dask"]),
                 help="Where the per-rank work runs: this machine's processes, or a Dask "
                      "cluster (docs/scaling.md)."),
    click.option("--scheduler", default=None,
                 help="With --engine dask: the scheduler's address (tcp://host:8786); without "
                      "it a local cluster of --workers processes."),
    click.option("--max-trace-bytes", default=None, metavar="SIZE",
                 help="Budget: JSON text one trace may inflate to (default 8GiB); a trace past "
                      "any budget is refused while it is read, the other ranks analysed."),
    click.option("--max-events", default=None, type=click.IntRange(min=1), metavar="N",
                 help="Budget: events in one trace (default 20,000,000)."),
    click.option("--max-event-bytes", default=None, metavar="SIZE",
                 help="Budget: text of one event, so of any string in it (default 64MiB)."),
    click.option("--max-rank-memory", default=None, metavar="SIZE",
                 help="Budget: memory of one rank's event table, or of a trace that cannot be "
                      "streamed (default 8GiB)."),
    click.option("--max-nesting", default=None, type=click.IntRange(min=1), metavar="N",
                 help="Budget: levels of nested arrays and objects anywhere in one trace "
                      "(default 64; a Kineto event is about 5 deep)."),
    click.option("--snapshot", "snapshots", multiple=True,
                 type=click.Path(exists=True, dir_okay=False),
                 help="A PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's pickle, "
                      "or its JSON) to read beside the traces; repeatable. *.pickle / *.pkl "
                      "files under PATH are read too; PATH may be a snapshot alone."),
    click.option("--device-memory", default=None, metavar="SIZE",
                 help="Memory of one device (e.g. 80GiB), for the near-OOM finding where the "
                      "traces do not say (a CPU run's, a trace without deviceProperties)."),
    click.option("--workers", default=None, type=click.IntRange(min=1),
                 help="Worker processes (default: one per core; with --engine dask and no "
                      "--scheduler, the local cluster's size, default 2)."),
)
#: The keyword arguments ``_FLAGS`` give a command, in order.
FLAG_NAMES = ("comm_kernel_regex", "rank_regex", "step_annotation", "no_cache", "baseline",
              "layout", "rank_order", "warmup_steps", "engine", "scheduler", "max_trace_bytes",
              "max_events", "max_event_bytes", "max_rank_memory", "max_nesting", "snapshots",
              "device_memory", "workers")


def analysis_flags(f):
    """The analysis' options as a command's flags (``_FLAGS``): ``analyze`` and ``compare``."""
    for o in reversed(_FLAGS):
        f = o(f)
    return f


@dataclasses.dataclass(frozen=True)
class AnalysisFlags:
    """What the analysis flags of one command say: the options without their cache folder
    (each report directory has its own, ``options_for``), the baseline's path (part of the
    reuse key) and whether caches are off (``--no-cache``)."""
    options: object                     # AnalysisOptions
    baseline_path: str | None
    no_cache: bool

    def options_for(self, target: pathlib.Path):
        """The options of an analysis whose report goes to ``target``: its trace cache in
        ``target/.cache`` unless ``--no-cache``."""
        from meshscope.collectors.run_dir import ReportDir

        return dataclasses.replace(
            self.options, cache_dir=None if self.no_cache else ReportDir(target).cache)


def analysis_options(flags: dict) -> AnalysisFlags:
    """The ``AnalysisFlags`` of a command's keyword arguments (``FLAG_NAMES``); one line and
    exit code 2 for a budget that is not a size or a pattern that does not compile."""
    from meshscope.analysis.ingest import budgets
    from meshscope.analysis.report.options import AnalysisOptions

    sizes = {"events": flags["max_events"], "nesting": flags["max_nesting"]}
    for name, flag, text in (("trace_bytes", "--max-trace-bytes", flags["max_trace_bytes"]),
                             ("event_bytes", "--max-event-bytes", flags["max_event_bytes"]),
                             ("rank_memory", "--max-rank-memory", flags["max_rank_memory"])):
        try:
            sizes[name] = budgets.parse_size(text) if text is not None else None
        except ValueError as e:
            fail(f"{flag}: {e}")
    try:
        device_bytes = budgets.parse_size(flags["device_memory"]) \
            if flags["device_memory"] is not None else None
    except ValueError as e:
        fail(f"--device-memory: {e}")
    # The budgets in force: this process' environment, with the flags given over it.
    limits = dataclasses.replace(budgets.current(),
                                 **{k: v for k, v in sizes.items() if v is not None})
    options = AnalysisOptions(
        comm_kernel_re=flags["comm_kernel_regex"], rank_regex=flags["rank_regex"],
        step_annotation=flags["step_annotation"], workers=flags["workers"], progress=True,
        baseline=_load_baseline(flags["baseline"]), layout=flags["layout"],
        rank_order=flags["rank_order"], warmup_steps=flags["warmup_steps"],
        engine=flags["engine"], scheduler=flags["scheduler"], budgets=limits,
        snapshots=tuple(pathlib.Path(f) for f in flags["snapshots"]),
        device_memory=device_bytes)
    return AnalysisFlags(options, flags["baseline"], bool(flags["no_cache"]))


def before_analysis(options):
    """What a command does just before an analysis starts (not when a stored report is
    reused, which imports nothing heavy): the flags' patterns checked (one line, exit 2) and
    the system allocator set before pyarrow is imported."""
    def prepare():
        from meshscope.analysis.report.process_memory import use_system_allocator

        use_system_allocator()
        _check_patterns(options)
    return prepare


def ensure_report(path, target, flags: AnalysisFlags):
    """``analysis.report.ensure.analysed`` for a command: the stored report of ``path`` in
    ``target`` when its inputs and options are unchanged, else analysed and written; one line
    and exit code 2 for bad input or a report that cannot be written."""
    from meshscope.analysis.errors import InputError
    from meshscope.analysis.report.ensure import analysed
    from meshscope.collectors.run_dir import RunDirError

    try:
        return analysed(pathlib.Path(path), pathlib.Path(target), flags.options_for(target),
                        baseline_path=flags.baseline_path, reuse_report=not flags.no_cache,
                        before_analysis=before_analysis(flags.options))
    except (InputError, RunDirError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{target}: cannot write the report ({e.strerror}); choose another with --out DIR")


@click.command()
@click.argument("path", type=click.Path())
@click.option("--out", type=click.Path(file_okay=False),
              help="Report directory (default: PATH/report).")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of text.")
@analysis_flags
def analyze(path, out, as_json, **flags):
    """Analyse a run directory or any folder of Kineto traces."""
    parsed = analysis_options(flags)
    target = report_dir(path, out)
    done = ensure_report(path, target, parsed)
    summary = done.summary
    verb = "unchanged (its inputs are; --no-cache computes it afresh)" if done.reused \
        else "written"
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


COMMANDS = (analyze,)
