"""Comparing runs — before and after (docs/compare.md).

A review is almost always "before and after": another layout, NCCL version, kernel, or last
night's run. This package takes anything ``meshscope analyze`` takes (our run directories,
folders of anyone's traces, analysed reports) and says what changed and why:

- ``sides``: each input opened as a ``Side`` (analysed first where needed, cached reports
  reused);
- ``quantities``: the report's named quantities (``step_time``, ``exposed_comm.dp`` …), each
  with its per-step values and the run's noise of it;
- ``names``: kernel names folded so the same kernel pairs up across library versions;
- ``diff``: ``diff(before, after) -> RunDiff`` (``records``) — the step-time difference in
  parts that add up to it, with the kernels, operators and collectives behind each, bandwidth, findings
  gained and lost, per-rank deltas; ``story``: the same in a few sentences;
- ``gate``: the ``--fail-if`` conditions and the noise rule; ``outputs``: text, Markdown
  and JUnit;
- ``ranking``: three or more runs (or a sweep) ranked by step time, the layout sweep's view;
  ``ranking_text``: its terminal table.

    from meshscope.analysis.compare import open_side, diff
    d = diff(open_side("runs/before"), open_side("runs/after"))
    d.sentences, d.parts, d.residual_us
"""
from __future__ import annotations

from .diff import diff
from .records import RunDiff
from .ranking import Comparison, rank
from .sides import CompareError, Side, open_side, open_sides

__all__ = ["CompareError", "Comparison", "RunDiff", "Side", "diff", "open_side", "open_sides",
           "rank"]
