"""The CLI imports a command's module when that command runs (``meshscope.cli``): every
command is where ``COMMAND_MODULES`` says, and ``meshscope analyze`` imports none of the other
commands' modules (the runner's, the planner's, the dashboard's)."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys

from conftest import ROOT

from meshscope import cli

MODULES = sorted(set(cli.COMMAND_MODULES.values()))


def test_every_command_is_where_the_table_says():
    found = {}
    for name in MODULES:
        for command in importlib.import_module(f"meshscope.cli.{name}").COMMANDS:
            found[command.name] = name
    assert found == cli.COMMAND_MODULES
    assert sorted(cli.main.every_command) == sorted(found)


def test_analyze_imports_no_other_command(tmp_path):
    trace = ROOT / "samples" / "dp2-pp2-1f1b" / "traces" / "rank0.json.gz"
    code = ("import json, sys\n"
            "from meshscope.cli import main\n"
            "try:\n"
            f"    main(['analyze', '--no-cache', {str(trace)!r}, '--out', "
            f"{str(tmp_path / 'report')!r}, '--json'])\n"
            "except SystemExit as e:\n"
            "    assert e.code in (0, None), e.code\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('meshscope'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    loaded = set(json.loads(out.strip().splitlines()[-1]))
    assert "meshscope.cli.analyze_cmd" in loaded
    others = {f"meshscope.cli.{m}" for m in MODULES} - {"meshscope.cli.analyze_cmd"}
    assert not loaded & others
    assert not {m for m in loaded if m.startswith(("meshscope.parallel",
                                                    "meshscope.dashboard"))}
