"""One check's outcome, as the checks return it and the verdict reads it."""
from __future__ import annotations

import dataclasses

from meshscope.vocabulary import TrustCheckId


@dataclasses.dataclass(frozen=True)
class Measured:
    """What one check found on one rank (``ranks`` of one) or on the run: ``severity`` None
    when it passed (the counts are kept: "3 zero-length kernels, within the threshold"),
    ``caveat`` or ``untrustworthy`` when it did not (docs/metrics.md "Trust")."""
    check: TrustCheckId
    severity: str | None
    ranks: tuple[int, ...]
    count: int
    of: int | None = None
    size_us: float | None = None
    share_pct: float | None = None
    steps: tuple[int, ...] = ()
    text: str = ""

    @property
    def failed(self) -> bool:
        return self.severity is not None


def graded(share: float, caveat_above: float, untrustworthy_above: float) -> str | None:
    """The severity of a share (or size) against a check's two thresholds: None at or below
    ``caveat_above``, ``caveat`` up to ``untrustworthy_above``, ``untrustworthy`` beyond."""
    if share > untrustworthy_above:
        return "untrustworthy"
    if share > caveat_above:
        return "caveat"
    return None


def pct(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole > 0 else None
