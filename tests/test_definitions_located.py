"""Where each definition lives (issue 37): the tree is searched for a second spelling of each,
and the test fails when one appears. This only locates definitions; that each quantity is one
number wherever it is shown is tests/test_one_definition.py (issue 44).

- the headline step time is chosen by ``model.choose_headline`` alone (its order of sources
  spelled once, ``HEADLINE_ORDER``), from the step timers' summary taken once an analysis;
- nccl-tests' bus factors, ``(n − 1)/n`` and ``2(n − 1)/n``, are written in
  ``meshscope/theory/bus_factors.py`` alone (the bandwidth table maps its pairs through it);
- the robust noise's constant (MAD → σ) in ``analysis/records/steps.py`` alone;
- FLOPs per token (its formula; the wrappers only ask it), overlap %, the bus factor and the
  noise each have one ``def``;
- a report's finding is one class (``analysis/report/model.Finding``);
- the per-rank mean of a per-step table (the breakdown, the GPU idle) is taken once
  (``breakdown.rank_means``: summary.json, the findings and compare read it), and
  the order exposed communication is credited in is spelled once (the vocabulary), and the
  crediting itself done by one function; the mesh's order and a rank's label once;
- the dashboard's pages read a report through ``report/reader.py`` and ``report/model.py``
  alone: no page imports an analyser.
"""
from __future__ import annotations

import ast
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
    # its profiled-window source, the longest rank's window per step, is taken in one place
    assert _where(r'groupby\("step"\)\["window_us"\]') == {"analysis/timeline/breakdown.py"}
    assert _where(r'"timer",\s*"window",\s*"replayed"') == {"analysis/report/model.py"}
    # no reader picks its own: the old spelling of the choice is nowhere
    assert _where(r"\(timer, \"timer\"\), \(replayed") == set()
    # The step timers' summary (their step time, the headline's first source) is taken once
    # per analysis, by the always-on records' stage, for the findings and summary.json alike.
    assert _where(r"throughput_summary\(") == {"analysis/records/steps.py",
                                                "analysis/report/always_on.py",
                                                "analysis/report/without_traces.py"}


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


def test_idle_means_and_the_dimension_order_are_written_once():
    assert _where(r'groupby\("rank"\)\.mean\(\)') == {"analysis/timeline/breakdown.py"}
    # the slowest rank per step of the step timers: one function
    assert _where(r'groupby\("step"\)\[(column|"wall_time_us")\]\.max\(\)') == \
        {"analysis/records/steps.py"}
    assert _where(r'\("pp", "tp", "cp", "ep", "dp", "unknown"\)') == {"meshscope/vocabulary.py"}
    # exposed communication is credited to dimensions once (the breakdown's columns and the
    # timeline's segments both ask credit_by_dim)
    assert _where(r"for dim in DIM_ORDER") == {"analysis/timeline/breakdown.py"}
    assert _where(r"def credit_by_dim\b") == {"analysis/timeline/breakdown.py"}
    # the mesh's order (and a rank's coordinates in it, as every view labels a rank) once
    assert _where(r'"pp", "dp", "cp", "tp"') == {"meshscope/vocabulary.py"}
    assert _where(r"for d in COORDINATE_ORDER") == {"collectors/run_info.py"}


# What a page may import of meshscope besides the reader and the model: the vocabulary; the
# compare page the comparison (its own model, analysis/compare) and the planner's ranking of
# layouts; the runs list the run directory contract (it lists run directories, not reports).
PAGE_IMPORTS = {"*": {"meshscope.analysis.report.reader", "meshscope.analysis.report.model",
                      "meshscope.analysis.report", "meshscope.vocabulary"},
                "compare.py": {"meshscope.analysis.compare", "meshscope.analysis.compare.diff",
                               "meshscope.analysis.compare.ranking", "meshscope.layouts"},
                "runs_list.py": {"meshscope.collectors.run_dir", "meshscope.collectors.run_json"},
                # a series of runs: the history's own review (issue 50), compare's sides
                "history.py": {"meshscope.analysis.compare", "meshscope.history.review",
                               "meshscope.history.series"},
                # the trace view's named events: not a report table, read for one rank and
                # step from the run's trace by the report side (issue 51 item 4)
                "timeline.py": {"meshscope.analysis.report.trace_view"}}


def _meshscope_imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("meshscope"):
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names if a.name.startswith("meshscope"))


def test_pages_read_a_report_through_the_reader_and_the_model_only():
    pages = sorted((ROOT / "dashboard" / "pages").glob("*.py"))
    assert len(pages) >= 10
    seen = set()
    for path in pages:
        allowed = PAGE_IMPORTS["*"] | PAGE_IMPORTS.get(path.name, set())
        for module, names in _meshscope_imports(path):
            seen.add(module)
            assert module in allowed, (path.name, module)
            if module == "meshscope.analysis.report":      # the package: its reader only
                assert names == ["reader"], (path.name, names)
    assert "meshscope.analysis.report" in seen     # the scan does see the pages' imports
