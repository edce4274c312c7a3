"""The ``meshscope`` command line.

Every stage is also a Python API (``meshscope.parallel.launch``, ``meshscope.analysis``,
``meshscope.dashboard``); the command modules here only parse options, call those, and turn
unusable input into one line on stderr and exit code 2 (``common.fail``). Each module imports
what its command needs inside the command, so ``meshscope --help`` and every command that does
not train start without torch.
"""
from __future__ import annotations

import click

from . import analyze_cmd, dashboard_cmd, layouts_cmd, run_cmd


@click.group()
@click.version_option(package_name="meshscope")
def main():
    """Profile and analyse parallel LLM training runs."""


for _module in (run_cmd, analyze_cmd, dashboard_cmd, layouts_cmd):
    for _command in _module.COMMANDS:
        main.add_command(_command)
