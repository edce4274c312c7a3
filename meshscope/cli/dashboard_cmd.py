"""``meshscope dashboard``, ``meshscope report`` and ``meshscope export``: looking at analysed
runs — in the browser, as one static HTML file, as a Chrome/Perfetto trace."""
from __future__ import annotations

import logging
import pathlib

import click

from .common import default_runs_dir, fail


def _entry(run: str):
    """A dashboard ``RunEntry`` for the run directory (or trace folder) ``run``."""
    from meshscope.collectors.run_dir import RUN_JSON
    from meshscope.dashboard.runs import RunEntry

    path = pathlib.Path(run)
    if not path.is_dir():
        fail(f"{path}: no such directory")
    real = path.resolve()
    return RunEntry(real.name, real, None, (real / RUN_JSON).is_file())


def serve(runs_dir: pathlib.Path, host: str = "127.0.0.1", port: int = 8050,
          threads: int = 4, allowed_hosts=None, token: str | None = None,
          limits=None, report_cache_mb: int | None = None,
          page_timeout_s: float = 20.0) -> None:
    """Serve the dashboard over ``runs_dir`` until Ctrl-C or SIGTERM (``meshscope dashboard``,
    ``meshscope demo``); the server log goes to stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    from meshscope.dashboard.server import default_allowed_hosts, is_loopback
    from meshscope.dashboard.server import serve as serve_wsgi

    hosts = tuple(allowed_hosts) if allowed_hosts else default_allowed_hosts(host)
    click.echo(f"meshscope dashboard on http://{host}:{port}/ over {runs_dir} (Ctrl-C stops)")
    if not is_loopback(host) and not token:
        click.echo(f"meshscope: warning: serving on {host}, beyond this machine, without "
                   f"--auth-token: anyone who can reach port {port} reads every report",
                   err=True)
    if not is_loopback(host) and "*" not in hosts and set(hosts) <= {"localhost", "127.0.0.1",
                                                                    "::1"}:
        click.echo("meshscope: note: only requests naming localhost are answered; add the "
                   "names clients use with --allowed-hosts", err=True)
    try:
        serve_wsgi(runs_dir, host=host, port=port, threads=threads, allowed_hosts=hosts,
                   token=token, limits=limits, page_timeout_s=page_timeout_s,
                   report_cache_bytes=None if report_cache_mb is None else report_cache_mb << 20)
    except OSError as e:
        fail(f"cannot serve on {host}:{port} ({e.strerror or e})")


@click.command()
@click.argument("runs_dir", required=False, type=click.Path(file_okay=False))
@click.option("--port", default=8050, show_default=True, type=click.IntRange(1, 65535))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind: loopback unless you mean to share the dashboard "
                   "(e.g. 0.0.0.0 on a trusted network).")
@click.option("--threads", default=4, show_default=True, type=click.IntRange(1, 64),
              help="Worker threads of the WSGI server (waitress).")
@click.option("--allowed-hosts", default=None, metavar="NAMES",
              help="Comma-separated names the Host header may carry (default: localhost, "
                   "127.0.0.1, ::1 and the --host address); others are refused (DNS "
                   "rebinding). '*' allows any.")
@click.option("--auth-token", default=None, envvar="MESHSCOPE_DASHBOARD_TOKEN",
              help="Require this token on every request (Authorization: Bearer TOKEN, or as "
                   "the password of the browser's login prompt). Also read from "
                   "$MESHSCOPE_DASHBOARD_TOKEN, which keeps it out of the process list.")
@click.option("--analysis-timeout", default=600, show_default=True,
              type=click.IntRange(1, None), metavar="SECONDS",
              help="Time limit of each analysis the dashboard starts (runs opened before "
                   "being analysed).")
@click.option("--analysis-memory", default=4096, show_default=True,
              type=click.IntRange(256, None), metavar="MiB",
              help="Memory (address space) limit of each analysis the dashboard starts.")
@click.option("--analysis-workers", default=2, show_default=True,
              type=click.IntRange(1, 64), help="Analyses run at the same time.")
@click.option("--page-timeout", default=20.0, show_default=True,
              type=click.FloatRange(0.1, None), metavar="SECONDS",
              help="The longest a request waits for its page to be built; past it the page "
                   "says it is still being built and asks again (a very large report never "
                   "holds a server thread).")
@click.option("--report-cache-mb", default=256, show_default=True,
              type=click.IntRange(0, None), metavar="MB",
              help="Memory for reports kept between requests (least recently used dropped "
                   "first; the report being shown is always kept).")
def dashboard(runs_dir, port, host, threads, allowed_hosts, auth_token, analysis_timeout,
              analysis_memory, analysis_workers, page_timeout, report_cache_mb):
    """Serve the web dashboard over RUNS_DIR (default: the bundled samples/).

    Every run directory and folder of traces under RUNS_DIR (and in its sweep folders) is
    listed; one not analysed yet is analysed when first opened, within a time and memory
    limit of its own. The server log (requests refused, reports that cannot be read, analyses
    run) goes to stderr.
    """
    from meshscope.dashboard.jobs import Limits

    path = pathlib.Path(runs_dir) if runs_dir else default_runs_dir()
    if not path.is_dir():
        fail(f"{path}: no such directory")
    hosts = [h.strip() for h in allowed_hosts.split(",") if h.strip()] if allowed_hosts \
        else None
    serve(path, host, port, threads, allowed_hosts=hosts, token=auth_token or None,
          limits=Limits(timeout_s=analysis_timeout, memory_mb=analysis_memory,
                        workers=analysis_workers), report_cache_mb=report_cache_mb,
          page_timeout_s=page_timeout)


@click.command()
@click.argument("run", type=click.Path())
@click.option("--html", "html_out", required=True, type=click.Path(dir_okay=False),
              help="Where to write the self-contained HTML report.")
def report(run, html_out):
    """Write RUN's report as one self-contained HTML file (figures included; it opens with no
    server and no network). RUN is analysed first if it has no report yet."""
    from meshscope.dashboard.data import ReportUnreadable
    from meshscope.dashboard.static_report import write_html

    entry = _entry(run)
    if not entry.analysed:
        from .analyze_cmd import run_analysis
        click.echo(f"{run} has no report yet: analysing it first", err=True)
        run_analysis(str(entry.path))
    try:
        out = write_html(entry, pathlib.Path(html_out))
    except ReportUnreadable as e:
        fail(f"{e}; run `meshscope analyze --no-cache {run}` to rewrite the report")
    except OSError as e:
        fail(f"{html_out}: cannot write ({e.strerror})")
    click.echo(f"report written: {out} ({out.stat().st_size / 1e6:.1f} MB)")


@click.command()
@click.argument("run", type=click.Path())
@click.option("--perfetto", "perfetto_out", required=True, type=click.Path(dir_okay=False),
              help="Where to write the trace (.json, or .json.gz to compress).")
def export(run, perfetto_out):
    """Export RUN's merged timeline as a Chrome/Perfetto trace: one process per rank, clocks
    aligned with the offsets of RUN's report, a flow arrow through the ranks of each matched
    collective. Open it in ui.perfetto.dev or chrome://tracing."""
    from meshscope.analysis.errors import InputError
    from meshscope.analysis.report.perfetto import export as do_export

    entry = _entry(run)
    try:
        s = do_export(entry.path, pathlib.Path(perfetto_out), report_dir=entry.report_dir)
    except InputError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{perfetto_out}: cannot write ({e.strerror})")
    moved = ", ".join(f"rank {r} {a / 1e3:+.3f} ms" for r, a in s.applied_us.items() if a)
    click.echo(f"trace written: {s.path} — {len(s.ranks)} ranks, {s.events:,} events, "
               f"{s.flows} matched collectives linked; clocks moved: {moved or 'none'}")
    for note in s.notes:
        click.echo(f"meshscope: note: {note}", err=True)


COMMANDS = (dashboard, report, export)
