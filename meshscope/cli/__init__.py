"""The ``meshscope`` command line.

Every stage is also a Python API (``meshscope.parallel.launch``, ``meshscope.analysis``,
``meshscope.dashboard``); the command modules here only parse options, call those, and turn
unusable input into one line on stderr and exit code 2 (``common.fail``). Each module imports
what its command needs inside the command, so ``meshscope --help`` and every command that does
not train start without torch.
"""
from __future__ import annotations

import importlib
import sys

import click

# Each command and the module that defines it (its ``COMMANDS``): a command's module is
# imported when that command runs (or ``--help`` lists them all), so ``meshscope analyze``
# does not import what ``run``, ``plan`` or ``dashboard`` need (tests/test_cli_lazy.py holds
# this table to the modules).
COMMAND_MODULES = {"run": "run_cmd", "bench-comm": "run_cmd", "demo": "run_cmd",
                   "analyze": "analyze_cmd", "dashboard": "dashboard_cmd",
                   "report": "dashboard_cmd", "export": "dashboard_cmd",
                   "compare": "compare_cmd", "sweep": "sweep_cmd", "plan": "plan_cmd",
                   "schema": "schema_cmd", "index": "history_cmd", "query": "history_cmd",
                   "history": "history_cmd", "mcp": "mcp_cmd"}


class _Commands(click.Group):
    """A group whose commands are imported from their modules (``COMMAND_MODULES``) when
    asked for."""

    def list_commands(self, ctx) -> list[str]:
        return sorted({*COMMAND_MODULES, *self.commands})

    def get_command(self, ctx, name: str):
        if name not in self.commands and name in COMMAND_MODULES:
            module = importlib.import_module(f"{__name__}.{COMMAND_MODULES[name]}")
            for command in module.COMMANDS:
                self.commands.setdefault(command.name, command)
        return self.commands.get(name)

    @property
    def every_command(self) -> dict:
        """Every command, its module imported (``--help``, the start-up benchmark)."""
        for name in self.list_commands(None):
            self.get_command(None, name)
        return self.commands


@click.group(cls=_Commands)
@click.version_option(package_name="meshscope")
def main():
    """Profile and analyse parallel LLM training runs."""


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

