"""The regression gate of ``meshscope compare BASELINE CANDIDATE --fail-if COND …``.

A condition is ``QUANTITY OP THRESHOLD`` (spaces allowed between them):

- ``QUANTITY``: a name of ``quantities`` (``step_time``, ``exposed_comm.dp``, ``idle.sync``,
  ``peak_memory`` …);
- ``OP``: ``>``, ``>=``, ``<`` or ``<=``;
- ``THRESHOLD``: a number with a unit that fits the quantity — times ``us``, ``ms``, ``s``;
  bytes ``B``, ``KB``, ``MB``, ``GB``, ``TB`` (powers of 1000) or ``KiB``, ``MiB``, ``GiB``,
  ``TiB`` (of 1024); bandwidths ``GB/s``; percentages and rates as bare numbers — or a
  percentage ``%``.

A threshold with a sign (``+5%``, ``+2ms``, ``-3``) or a percentage speaks of the *change*
from the baseline to the candidate: ``%`` relative to the baseline's value, anything else
absolute (``step_time>+5%``: the step time grew by more than 5%; ``exposed_comm.dp>+2ms``: by
more than 2 ms; ``mfu_pct<-3``: MFU fell by more than 3 points). A threshold without a sign
speaks of the candidate's own value (``peak_memory>70GiB``, ``mfu_pct<40``).

**The noise rule.** Runs vary from step to step; a condition fails the gate only when it holds
*and* what it measures stands out of that noise: for a change, |Δ| > 2 × noise(Δ) (both
runs' noise of the quantity added in quadrature, ``diff.Change``, ``diff.NOISE_FACTOR``); for
a level, |value − threshold| > 2 × the candidate's noise. A change inside the noise never
fails a build. Where a run's noise is unknown (fewer than three steps measured it), the
condition is judged on its values alone and the result says so.

``parse(text) -> Condition`` raises ``GateError`` (a ``ValueError``) naming the problem — a
misspelt quantity lists the valid names; ``evaluate(condition, diff) -> Verdict``.
"""
from __future__ import annotations

import dataclasses
import difflib
import operator
import re
import unicodedata

from . import quantities as Q
from .diff import change
from .records import NOISE_FACTOR, Change, RunDiff
from .sides import Side


class GateError(ValueError):
    """A condition that cannot be read or evaluated (the command exits 2)."""


_TIME = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
_BYTES = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_RATE = {"GB/s": 1.0}
UNITS = {Q.US: _TIME, Q.BYTES: _BYTES, Q.GBPS: _RATE, Q.PCT: {}, Q.RATE: {}}
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_RX = re.compile(r"^\s*(?P<q>[A-Za-z_][\w./-]*)\s*(?P<op>>=|<=|>|<)\s*"
                 r"(?P<sign>[+-])?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[A-Za-zµ/%]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Condition:
    """One parsed condition: the quantity, the comparison, the threshold in the quantity's
    unit (µs, bytes, GB/s, %, 1/s) or as a fraction (``relative``), and whether it speaks of
    the change or of the candidate's level."""
    text: str
    quantity: str
    op: str
    threshold: float
    relative: bool
    is_change: bool


#: Characters a pasted condition often holds instead of ASCII (a typographic minus or dash);
#: others are shown as their compatibility form (a fullwidth ``＞`` is ``>``).
_LOOKALIKE = {"\u2212": "-", "\u2013": "-", "\u2014": "-", "\u2264": "<=", "\u2265": ">="}


def parse(text: str, known: list[str] | None = None) -> Condition:
    """The ``Condition`` of ``text`` (module docstring); ``known``: the quantities these runs
    have, listed in the message for a misspelt one (default: every name form)."""
    odd = next(((i, ch) for i, ch in enumerate(text or "") if ord(ch) > 127 and ch != "µ"),
               None)
    if odd is not None:
        i, ch = odd
        plain = _LOOKALIKE.get(ch) or unicodedata.normalize("NFKC", ch)
        hint = f": write {plain!r}" if plain != ch and plain.isascii() else ""
        raise GateError(f"--fail-if {text!r}: character {i + 1} is {ch!r} "
                        f"(U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}){hint}")
    m = _RX.match(text or "")
    if not m:
        raise GateError(f"--fail-if {text!r}: not QUANTITY OP THRESHOLD (e.g. "
                        f"'step_time>+5%', 'exposed_comm.dp>+2ms', 'peak_memory>70GiB')")
    q, op, sign, num, unit = m["q"], m["op"], m["sign"], float(m["num"]), m["unit"]
    kind = Q.unit_of(q)
    if kind is None:
        names = known or Q.valid_names()
        close = difflib.get_close_matches(q, names, n=1)
        raise GateError(f"--fail-if {text!r}: no quantity {q!r}"
                        + (f" (did you mean {close[0]!r}?)" if close else "")
                        + "; the quantities are: " + ", ".join(names) + " — "
                        + "; ".join(f"{k}: {', '.join(v)}" for k, v in Q.WORDS.items()))
    value = -num if sign == "-" else num
    if unit == "%":
        return Condition(text, q, op, value / 100.0, relative=True, is_change=True)
    scale = UNITS[kind]
    if not unit:
        if scale:
            raise GateError(f"--fail-if {text!r}: {q} needs a unit ("
                            + ", ".join(u for u in scale if u != "µs") + ")")
        factor = 1.0
    else:
        # times as written (ms, us, s); bytes and GB/s in any case (gib, GiB)
        factor = scale.get(unit) if kind == Q.US else \
            {k.lower(): v for k, v in scale.items()}.get(unit.lower())
        if factor is None:
            fits = ", ".join(u for u in scale if u != "µs") or "none: a bare number"
            raise GateError(f"--fail-if {text!r}: {unit!r} is not a unit of {q} "
                            f"(its units: {fits})")
    return Condition(text, q, op, value * factor, relative=False, is_change=sign is not None)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A condition evaluated on a pair of runs: ``failed`` when it holds beyond the noise
    (module docstring); ``holds`` whether it holds on the values alone; ``measured`` the
    change or level it was judged on, in the condition's terms; ``message`` one line."""
    condition: Condition
    change: Change
    holds: bool
    failed: bool
    measured: float | None
    noise: float | None
    message: str
    checked: bool = True          # False: a side does not measure it (--allow-unmeasured)


def _fmt(kind: str, x: float | None, sign: bool = False) -> str:
    if x is None:
        return "-"
    s = "+" if sign and x >= 0 else ""
    if kind == Q.US:
        return f"{s}{x / 1e3:.3f} ms"
    if kind == Q.BYTES:
        return f"{s}{x / (1 << 20):.1f} MiB"
    if kind == Q.GBPS:
        return f"{s}{x:.2f} GB/s"
    if kind == Q.PCT:
        return f"{s}{x:.2f}"
    return f"{s}{x:,.1f}"


def evaluate(cond: Condition, before: Side, after: Side, diff: RunDiff | None = None,
             allow_unmeasured: bool = False) -> Verdict:
    """``cond`` on the pair (module docstring). A quantity a run does not measure — no value,
    or communication it cannot attribute to the condition's dimension
    (``quantities.unattributed``) — is a GateError, whatever the quantity: a condition the gate
    cannot judge is a bad input, never a pass. With ``allow_unmeasured`` it is a verdict that
    is not checked (``checked`` False), which fails nothing and says so."""
    c = diff.quantities.get(cond.quantity) if diff is not None else None
    c = c if c is not None else change(before, after, cond.quantity)
    kind = c.unit
    for side, value in ((before, c.before), (after, c.after)):
        if not (cond.is_change or side is after):
            continue
        why = Q.unattributed(side, cond.quantity) if value is not None else \
            _why(cond.quantity)
        if why is None:
            continue
        said = f"{side.name} does not measure {cond.quantity} ({why})"
        if not allow_unmeasured:
            raise GateError(f"--fail-if {cond.text!r}: {said}; --allow-unmeasured reports "
                            f"it as not checked")
        return Verdict(cond, c, False, False, None, None,
                       f"not checked: {cond.text} — {said}", checked=False)
    compare = _OPS[cond.op]
    if cond.is_change:
        if cond.relative and not c.before:      # judged before dividing: never a crash
            raise GateError(f"--fail-if {cond.text!r}: {cond.quantity} is 0 in "
                            f"{before.name}: a change relative to it has no meaning")
        measured = c.delta / abs(c.before) if cond.relative else c.delta
        holds = compare(measured, cond.threshold)
        noise = c.noise
        outside = noise is None or abs(c.delta) > NOISE_FACTOR * noise
        shown = (f"{measured:+.1%}" if cond.relative else _fmt(kind, measured, True))
        what = f"{cond.quantity} changed {shown} ({_fmt(kind, c.before)} → " \
               f"{_fmt(kind, c.after)})"
    else:
        measured = c.after
        holds = compare(measured, cond.threshold)
        noise = c.noise_after
        outside = noise is None or abs(measured - cond.threshold) > NOISE_FACTOR * noise
        what = f"{cond.quantity} is {_fmt(kind, measured)} in {after.name}"
    failed = holds and outside
    if noise is None:
        tail = "noise unknown: judged on the values alone"
    else:
        tail = f"noise ±{_fmt(kind, noise)}"
    if failed:
        verdict = "FAIL"
    elif holds:
        verdict = "pass (holds, but within the noise)"
    else:
        verdict = "pass"
    return Verdict(cond, c, holds, failed, measured, noise,
                   f"{verdict}: {cond.text} — {what}; {tail}")


def _why(name: str) -> str:
    if name in ("tokens_per_s", "mfu_pct", "peak_memory"):
        return "it has no step timers, or they did not record it"
    if name.startswith(("idle.", "kernels.")):
        return "it is not a GPU run"
    if name.startswith("busbw."):
        return "no operation of that kind with known bytes and transfer time"
    return "its report has no profiled step"
