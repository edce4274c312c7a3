"""Change points of a trend: the runs where a quantity moved beyond the runs' noise.

The method is PELT (Killick, Fearnhead & Eckley 2012, exact penalised segmentation) with the
least-squares cost, from ``ruptures`` (a maintained change-point library; deterministic: no
permutation, no seed). The penalty is not a threshold of ours but the noise's:

- the series is put in units of its noise ``sigma``: the larger of the runs' own step-to-step
  noise of the quantity (their median; compare's noise, ``analysis/compare/quantities``) and
  the run-to-run scatter (the same robust noise, ``records.steps.noise``, of
  the first differences, / √2: a few level shifts do not move it);
- in those units a split costs ``PENALTY_PER_LOG_N`` × ln(n): a Bayesian-information penalty
  scaled by compare's noise rule (``NOISE_FACTOR``² = 4: a change must stand out by twice the
  noise), so n runs of pure noise give no change;
- every change kept must move the level (the means of the segments either side) by more than
  ``NOISE_FACTOR`` × ``sigma`` — compare's rule for one difference;
- a segment holds at least ``MIN_RUNS`` runs: one odd run is an outlier, not a change of
  level (the newest run is judged by the gate, ``baseline.py``, not here).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from meshscope.analysis.compare.records import NOISE_FACTOR
from meshscope.analysis.records.steps import noise as robust_noise

from .series import Trend

MIN_RUNS = 2
PENALTY_PER_LOG_N = NOISE_FACTOR ** 2


@dataclasses.dataclass(frozen=True)
class ChangePoint:
    """The quantity's level moved at run ``at`` (its position in the trend's runs, the first
    run of the new level): from ``before`` (the mean of the runs since the previous change) to
    ``after`` (up to the next), with the noise ``sigma`` it was judged against."""
    quantity: str
    unit: str
    at: int
    before: float
    after: float
    sigma: float

    @property
    def delta(self) -> float:
        return self.after - self.before

    @property
    def rel(self) -> float | None:
        return self.delta / abs(self.before) if self.before else None


def _robust_scale(x: np.ndarray) -> float:
    """The run-to-run scatter: the robust noise (``records.steps.noise``, the one estimator
    of the run's own noise) of the first differences, over √2 (a difference holds two runs'
    scatter); a few level shifts are outliers to it."""
    s = robust_noise(np.diff(x)) if len(x) >= 4 else math.nan
    return 0.0 if math.isnan(s) else s / math.sqrt(2.0)


def sigma_of(values: np.ndarray, noises: list[float]) -> float:
    """The noise a change is judged against (module docstring)."""
    own = float(np.median(noises)) if noises else 0.0
    s = max(own, _robust_scale(values))
    if s > 0:
        return s
    level = float(np.max(np.abs(values))) if len(values) else 0.0
    return level * 1e-9 or 1e-12          # a constant series: any move is a change


def change_points(t: Trend) -> list[ChangePoint]:
    """The change points of ``t`` (module docstring), in run order; runs that do not measure
    the quantity are left out of the search (the positions are the trend's own)."""
    import ruptures

    where = [i for i, v in enumerate(t.values) if v is not None]
    if len(where) < 2 * MIN_RUNS:
        return []
    x = np.array([t.values[i] for i in where], dtype=float)
    sigma = sigma_of(x, [n for i, n in enumerate(t.noises) if n is not None and i in where])
    z = (x / sigma).reshape(-1, 1)
    pen = PENALTY_PER_LOG_N * math.log(len(x))
    ends = ruptures.Pelt(model="l2", min_size=MIN_RUNS, jump=1).fit(z).predict(pen=pen)
    bounds = [0, *ends]                   # ruptures gives each segment's end, the last is n
    out = []
    for k in range(1, len(bounds) - 1):
        a, b, c = bounds[k - 1], bounds[k], bounds[k + 1]
        before, after = float(x[a:b].mean()), float(x[b:c].mean())
        if abs(after - before) > NOISE_FACTOR * sigma:
            out.append(ChangePoint(t.name, t.unit, where[b], before, after, sigma))
    return out
