"""``meshscope history --fail-if``: the newest run of a series against its baseline.

The baseline is the last ``n`` comparable runs before the newest one: its value of a quantity
is their median, its noise the median of their step-to-step noises. A condition is compare's
(``analysis/compare/gate``: the same words, units and noise rule) judged on that pair, so a
slow drift — each run a little worse than the one before, none beyond the noise of its
neighbour — fails once the newest run stands out of the baseline's level as a step would.
"""
from __future__ import annotations

import dataclasses
import statistics

from meshscope.analysis.compare import gate
from meshscope.analysis.compare.records import Change
from meshscope.analysis.compare.sides import Side

from .series import trend

DEFAULT_RUNS = 5


@dataclasses.dataclass(frozen=True)
class _Quantities:
    """What ``gate.evaluate`` reads of a comparison: the one quantity's ``Change``."""
    quantities: dict[str, Change]


def baseline_change(runs: list[Side], name: str, n: int = DEFAULT_RUNS) -> Change:
    """``name`` of the newest run against the median of the ``n`` runs before it."""
    t = trend(runs[-(n + 1):], name)
    base = [v for v in t.values[:-1] if v is not None]
    noises = [x for x, v in zip(t.noises[:-1], t.values[:-1]) if v is not None and x is not None]
    return Change(name, t.unit, statistics.median(base) if base else None, t.values[-1],
                  statistics.median(noises) if len(noises) == len(base) and noises else None,
                  t.noises[-1])


def evaluate(cond: gate.Condition, runs: list[Side], n: int = DEFAULT_RUNS,
             allow_unmeasured: bool = False) -> gate.Verdict:
    """``cond`` on the newest of ``runs`` against its baseline (module docstring); GateError
    for a series of one run, or as compare's gate for an unmeasured quantity."""
    if len(runs) < 2:
        raise gate.GateError(f"--fail-if {cond.text!r}: the series has one run, no baseline")
    c = baseline_change(runs, cond.quantity, n)
    return gate.evaluate(cond, runs[-2], runs[-1], _Quantities({cond.quantity: c}),  # type: ignore[arg-type]
                         allow_unmeasured=allow_unmeasured)
