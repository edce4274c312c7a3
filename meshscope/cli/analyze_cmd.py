"""``meshscope analyze``: a run directory or any folder of Kineto traces → its report."""
from __future__ import annotations

import dataclasses
import json
import pathlib

import click

from .common import fail, register

def _load_baseline(path: str | None):
    """``--baseline``: a bandwidth baseline (``nccl_tests.read_baseline``), or a clear error."""
    if not path:
        return None
    from meshscope.analysis.comm import nccl_tests

    try:
        return nccl_tests.read_baseline(pathlib.Path(path))
    except (OSError, ValueError) as e:
        fail(f"{path}: not a usable baseline ({e})")


def report_dir(path, out=None) -> pathlib.Path:
    """Where the report of ``path`` goes: ``out``, else ``PATH/report`` (a file analysed
    alone: ``PATH.report`` beside it)."""
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


def _flag_options() -> list:
    """The analysis' flags, built from the one declaration of each option
    (``AnalysisOptions.flags()``: flag, help, kind; ``budgets.FLAGS`` / ``HELP``), and
    ``--no-cache``: what ``analyze`` takes, and ``compare`` for every path it analyses."""
    from meshscope.analysis.ingest import budgets
    from meshscope.analysis.report.options import AnalysisOptions

    types = {"path": click.Path(exists=True), "int": click.IntRange(min=0),
             "count": click.IntRange(min=1)}
    out = []
    for name, flag, default in AnalysisOptions.flags():
        kw: dict = {"help": flag.help, "metavar": flag.metavar}
        if flag.kind == "paths":
            kw.update(multiple=True, type=click.Path(exists=True, dir_okay=False))
        elif flag.kind in ("texts", "ints"):
            kw.update(multiple=True, type=click.IntRange(min=0) if flag.kind == "ints"
                      else str)
        elif flag.kind == "choice":
            kw.update(default=default, show_default=True, type=click.Choice(flag.choices))
        elif flag.kind == "int":
            kw.update(default=default, show_default=True, type=types["int"])
        elif flag.kind in types:
            kw.update(default=None, type=types[flag.kind])
        else:                                   # text, regex, a size read by parse_size
            kw.update(default=None)
        out.append(click.option(flag.flag, name, **{k: v for k, v in kw.items()
                                                      if v is not None}))
    out.append(click.option(
        "--no-cache", "no_cache", is_flag=True,
        help="Parse every trace afresh instead of reusing the parquet copies kept in the "
             "report directory's .cache/ (keyed by each file's content hash)."))
    for name, flag in budgets.FLAGS.items():
        out.append(click.option(flag, f"max_{name}", default=None, help=budgets.HELP[name],
                                metavar="N" if name in budgets.COUNTS else "SIZE",
                                type=click.IntRange(min=1) if name in budgets.COUNTS
                                else None))
    return out


def analysis_flags(f):
    """The analysis' options as a command's flags (``_flag_options``): ``analyze`` and
    ``compare``."""
    for o in reversed(_flag_options()):
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
    """The ``AnalysisFlags`` of a command's keyword arguments (``_flag_options``: one per
    option, named as its field; ``max_<budget>``; ``no_cache``): each value read as its
    ``Flag.kind`` says; one line and exit code 2 for a size or budget that is not one."""
    from meshscope.analysis.ingest import budgets
    from meshscope.analysis.report.options import AnalysisOptions

    sizes = {}
    for name, flag in budgets.FLAGS.items():
        value = flags[f"max_{name}"]
        try:
            sizes[name] = value if value is None or name in budgets.COUNTS \
                else budgets.parse_size(value)
        except ValueError as e:
            fail(f"{flag}: {e}")
    fields: dict = {}
    for name, flag, _ in AnalysisOptions.flags():
        value = flags[name]
        if flag.kind == "size" and value is not None:
            try:
                value = budgets.parse_size(value)
            except ValueError as e:
                fail(f"{flag.flag}: {e}")
        elif flag.kind == "paths":
            value = tuple(pathlib.Path(f) for f in value)
        elif flag.kind in ("texts", "ints"):
            value = tuple(value)
        elif name == "baseline":
            value = _load_baseline(value)
        fields[name] = value
    # The budgets in force: this process' environment, with the flags given over it.
    limits = dataclasses.replace(budgets.current(),
                                 **{k: v for k, v in sizes.items() if v is not None})
    options = AnalysisOptions(**fields, progress=True, budgets=limits)
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
              help="Report directory (default: PATH/report; for a file analysed alone, "
                   "such as a memory snapshot, PATH.report beside it).")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of text.")
@click.option("--index", "index_path", default=None, type=click.Path(dir_okay=False),
              help="Register the report in this index (default: $MESHSCOPE_INDEX, else "
                   "~/.cache/meshscope/index.sqlite; docs/history.md).")
@analysis_flags
def analyze(path, out, as_json, index_path, **flags):
    """Analyse a run directory or any folder of Kineto traces."""
    parsed = analysis_options(flags)
    target = report_dir(path, out)
    done = ensure_report(path, target, parsed)
    register(target, index_path)
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
