"""Each headline quantity defined once (issue 37): the tree is searched for a second
definition of each, and the test fails when one appears.

- the headline step time is chosen by ``reader.choose_headline`` alone (its order of sources
  spelled once, ``HEADLINE_ORDER``);
- nccl-tests' bus factors, ``(n − 1)/n`` and ``2(n − 1)/n``, are written in
  ``meshscope/theory/bus_factors.py`` alone (the bandwidth table maps its pairs through it);
- the robust noise's constant (MAD → σ) in ``analysis/records/steps.py`` alone;
- FLOPs per token (its formula; the wrappers only ask it), overlap %, the bus factor and the
  noise each have one ``def``;
- a report's finding is one class (``analysis/report/model.Finding``).
"""
from __future__ import annotations

import re

from conftest import ROOT

PACKAGES = ("analysis", "collectors", "dashboard", "meshscope", "parallel")


def _code_lines(path):
    """(number, line) of the file's code: comments and docstrings left out."""
    text = path.read_text(encoding="utf-8")
    inside = False
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        quotes = stripped.count('"""') + stripped.count("'''")
        if inside:
            if quotes % 2:
                inside = False
            continue
        if stripped.startswith(('"""', "'''", 'r"""')):
            if quotes % 2:
                inside = True
            continue
        if stripped.startswith("#"):
            continue
        yield i, line.split("  #")[0]


def _where(pattern: str) -> set[str]:
    rx = re.compile(pattern)
    found = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for _, line in _code_lines(path):
                if rx.search(line):
                    found.add(str(path.relative_to(ROOT)))
    return found


def test_the_headline_step_time_is_chosen_in_one_place():
    assert _where(r"def choose_headline\b") == {"analysis/report/model.py"}
    assert _where(r'"timer",\s*"window",\s*"replayed"') == {"analysis/report/model.py"}
    # no reader picks its own: the old spelling of the choice is nowhere
    assert _where(r"\(timer, \"timer\"\), \(replayed") == set()


def test_bus_factors_are_written_once():
    assert _where(r"\(n\s*-\s*1\)\s*/\s*n\b") == {"meshscope/theory/bus_factors.py"}
    assert _where(r"def bus_factor\b") == {"meshscope/theory/bus_factors.py",
                                          "analysis/comm/bandwidth.py"}   # the spelling map


def test_the_robust_noise_is_written_once():
    assert _where(r"1\.4826") == {"analysis/records/steps.py"}
    # the estimator, and a comparison's noise of a difference (two sides' in quadrature)
    assert _where(r"def noise\b") == {"analysis/records/steps.py",
                                      "analysis/compare/records.py"}


def test_flops_overlap_and_findings_have_one_definition():
    # FLOPs per token: one formula; the model config and the planner's spec ask it
    assert _where(r"def training_flops_per_token\b") == {"meshscope/theory/flops.py"}
    for path in _where(r"def flops_per_token\b"):
        text = (ROOT / path).read_text()
        body = text.split("def flops_per_token", 1)[1].split("\n    def ", 1)[0]
        assert "return training_flops_per_token(" in body, path
    assert _where(r"def overlap_pct\b") == {"analysis/timeline/breakdown.py"}
    assert _where(r"^class Finding\b") == {"analysis/report/model.py"}
