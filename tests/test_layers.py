"""The layers hold (docs/architecture.md): import-linter's contracts in pyproject.toml, run by
``.ci/lint-imports`` over the whole checkout — theory at the bottom with no third-party
imports, analysis and parallel independent, layouts above both, dashboard, cli on top — and no
cycle between siblings anywhere (acyclic_siblings)."""
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


def test_every_layer_contract_is_kept():
    lint = pathlib.Path(sys.executable).parent / "lint-imports"
    if not lint.exists() and shutil.which("lint-imports") is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    proc = subprocess.run([str(ROOT / ".ci" / "lint-imports")], capture_output=True, text=True,
                          env={"LINT_IMPORTS": str(lint if lint.exists() else
                                                   shutil.which("lint-imports")),
                               "PATH": "/usr/bin:/bin"}, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Contracts: 3 kept, 0 broken." in out
    assert "Layers of docs/architecture.md: cli on top, vocabulary at the bottom KEPT" in out
    assert "No cycles between sibling packages or modules KEPT" in out
