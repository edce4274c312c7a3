"""``meshscope dashboard``: the web app over a folder of runs."""
from __future__ import annotations

import pathlib

import click

from .common import default_runs_dir, fail

def serve(runs_dir: pathlib.Path, host: str, port: int) -> None:
    from meshscope.dashboard.app import create_app

    app = create_app(runs_dir)
    click.echo(f"meshscope dashboard on http://{host}:{port}/ over {runs_dir} (Ctrl-C stops)")
    app.run(host=host, port=port, debug=False)


@click.command()
@click.argument("runs_dir", required=False, type=click.Path(file_okay=False))
@click.option("--port", default=8050, show_default=True, type=int)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; loopback unless you mean to share it.")
def dashboard(runs_dir, port, host):
    """Serve the web dashboard over RUNS_DIR (default: the bundled samples/)."""
    path = pathlib.Path(runs_dir) if runs_dir else default_runs_dir()
    if not path.is_dir():
        fail(f"{path}: no such directory")
    serve(path, host, port)



COMMANDS = (dashboard,)
