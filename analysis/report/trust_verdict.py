"""From the checks to the verdicts, and from a failed check to the numbers it affects.

The rule (docs/metrics.md "Trust"): a rank is *trusted* when every check of its trace passed,
*usable with caveats* when the worst that failed is a caveat, *not trustworthy* when one is
graded so; the run's verdict is the worst of its ranks' and of the checks across ranks. A
failed check names the numbers resting on it (``AFFECTS``); a finding whose numbers
(``FINDING_NUMBERS``) meet them carries the check in its ``caveats`` and says so.
"""
from __future__ import annotations

import dataclasses

from meshscope.analysis.report import model
from meshscope.analysis.trust.measured import Measured
from meshscope.vocabulary import (EXPOSED_COMM_PREFIX, TRUST_CHECK_IDS, TRUST_SEVERITIES,
                                  TRUST_VERDICTS, TrustCheckId as C)

_TIMELINE = ["step breakdown", "kernel times", "GPU idle", "operators",
             "exposed communication"]
_CROSS = ["waits and straggler", "pipeline bubble"]

#: check -> the numbers resting on what it counts.
AFFECTS: dict[str, list[str]] = {
    C.BAD_DURATIONS: _TIMELINE,
    C.ZERO_DURATIONS: ["kernel times", "GPU idle"],
    C.OVER_LONG: ["step breakdown", "operators", "exposed communication", "GPU idle"],
    C.LAUNCH_SKEW: ["launch latency", "GPU idle", "exposed communication",
                    "waits and straggler"],
    C.STREAM_OVERLAP: ["kernel times", "GPU idle", "step breakdown"],
    C.DROPPED_ACTIVITY: ["kernel times", "GPU idle", "step breakdown",
                         "exposed communication", "bandwidth"],
    C.CUT_SHORT: ["step breakdown", "step time", "GPU idle", "kernel times"],
    C.TIMESTAMP_PRECISION: [*_TIMELINE, "launch latency", "waits and straggler",
                            "step time"],
    C.MISSING_RANKS: [*_CROSS, "bandwidth"],
    C.DIFFERENT_STEPS: [*_CROSS, "step time"],
    C.COLLECTIVE_COUNTS: [*_CROSS, "bandwidth", "exposed communication"],
    C.CLOCK_OFFSETS: _CROSS,
}

_IDLE = ["GPU idle", "launch latency", "kernel times", "step breakdown"]
#: finding id (or its prefix) -> the numbers it rests on.
FINDING_NUMBERS: dict[str, list[str]] = {
    "hang": [], "desync": [],
    "straggler": ["waits and straggler", "step breakdown"],
    "host-bound": ["waits and straggler", "GPU idle"],
    "arrival-jitter": ["waits and straggler"],
    "stage-imbalance": ["pipeline bubble", "waits and straggler"],
    "pipeline-bubble": ["pipeline bubble"],
    EXPOSED_COMM_PREFIX: ["exposed communication", "step breakdown", "bandwidth"],
    "slow-steps": ["step time"],
    "data-loading-stall": _IDLE, "sync-stall": _IDLE, "launch-bound": _IDLE,
    "gpu-idle": _IDLE, "memcpy-on-critical-path": _IDLE,
    "low-gemm-efficiency": ["kernel times"],
    "near-oom": ["memory"], "memory-imbalance": ["memory"], "memory-growth": ["memory"],
    "memory-fragmentation": ["memory"], "largest-allocator": ["memory"],
}


def numbers_of(finding_id: str) -> list[str]:
    """The numbers a finding rests on (``FINDING_NUMBERS``; every number when unknown)."""
    if finding_id in FINDING_NUMBERS:
        return FINDING_NUMBERS[finding_id]
    if finding_id.startswith(EXPOSED_COMM_PREFIX):
        return FINDING_NUMBERS[EXPOSED_COMM_PREFIX]
    return sorted({n for v in AFFECTS.values() for n in v})


_ORDER = {None: 0, "caveat": 1, "untrustworthy": 2}


def _verdict(severities) -> str:
    worst = max((_ORDER[s] for s in severities), default=0)
    return TRUST_VERDICTS[worst]


def trust(per_rank: dict[int, list[Measured]], across: list[Measured]) -> model.Trust:
    """The ``Trust`` of a report: each rank's verdict, the run's, and every failed check
    (merged over the ranks it failed on), from the checks per rank and across ranks."""
    ranks = [model.RankTrust(r, _verdict(m.severity for m in ms),
                             [m.check.value for m in ms if m.failed])
             for r, ms in sorted(per_rank.items())]
    caveats = [_merge(c, [m for ms in per_rank.values() for m in ms if m.check == c and
                          m.failed] + [m for m in across if m.check == c and m.failed])
               for c in TRUST_CHECK_IDS]
    caveats = [c for c in caveats if c is not None]
    run_verdict = _verdict([*(m.severity for m in across),
                            *(s for r in ranks for s in _severities(r.verdict))])
    checked = [c for c in TRUST_CHECK_IDS
               if any(m.check == c for ms in [*per_rank.values(), across] for m in ms)]
    return model.Trust(verdict=run_verdict, ranks=ranks, caveats=caveats, checked=checked)


def _severities(verdict: str) -> list[str | None]:
    inverse = {v: k for k, v in TRUST_SEVERITIES.items()}
    return [inverse.get(verdict)]


def _merge(check: str, failed: list[Measured]) -> model.TrustCheck | None:
    """One caveat of ``check`` over every rank it failed on: counts summed, the largest size,
    the worst severity, each rank's sentence (the first three, then how many more)."""
    if not failed:
        return None
    worst = max(failed, key=lambda m: _ORDER[m.severity])
    sizes = [m.size_us for m in failed if m.size_us is not None]
    shares = [m.share_pct for m in failed if m.share_pct is not None]
    ofs = [m.of for m in failed if m.of is not None]
    texts = [m.text for m in failed if m.text]
    text = "; ".join(texts[:3]) + (f"; and {len(texts) - 3} more ranks" if len(texts) > 3
                                   else "")
    return model.TrustCheck(
        check=check, severity=str(worst.severity),
        ranks=sorted({r for m in failed for r in m.ranks}),
        count=sum(m.count for m in failed), of=sum(ofs) if ofs else None,
        size_us=max(sizes) if sizes else None, share_pct=max(shares) if shares else None,
        steps=sorted({s for m in failed for s in m.steps}),
        affects=list(AFFECTS[check]), text=text)


def with_caveats(findings: list[model.Finding], t: model.Trust) -> list[model.Finding]:
    """Each finding with the failed checks whose numbers it rests on (``caveats``)."""
    out = []
    for f in findings:
        mine = set(numbers_of(str(f.id)))
        hit = [c.check for c in t.caveats if mine & set(c.affects)]
        out.append(dataclasses.replace(f, caveats=hit) if hit != f.caveats else f)
    return out

