"""The ``meshscope`` command line.

Every stage is also a Python API (``meshscope.parallel.launch``, ``meshscope.analysis``,
``meshscope.dashboard``); the command modules here only parse options, call those, and turn
unusable input into one line on stderr and exit code 2 (``common.fail``). Each module imports
what its command needs inside the command, so ``meshscope --help`` and every command that does
not train start without torch.
"""
from __future__ import annotations

import sys

import click

from . import analyze_cmd, compare_cmd, dashboard_cmd, layouts_cmd, run_cmd


@click.group()
@click.version_option(package_name="meshscope")
def main():
    """Profile and analyse parallel LLM training runs."""


for _module in (run_cmd, analyze_cmd, dashboard_cmd, compare_cmd, layouts_cmd):
    for _command in _module.COMMANDS:
        main.add_command(_command)


def entry() -> None:
    """The ``meshscope`` executable (and ``python -m meshscope``): ``main``, then the exit.

    A command that imported torch (``run``, ``sweep``, ``bench-comm``) leaves through
    ``parallel/process_exit.leave_now``, without the 1.5–2 s of torch's teardown; without
    torch the exit is Python's own. (``main`` itself raises ``SystemExit`` as click does, for
    callers in Python.)"""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if "torch" not in sys.modules:
        sys.exit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    from meshscope.parallel.process_exit import leave_now

    leave_now(code or 0)

