"""The comparison in words: the few sentences a reviewer would write under a before/after.

``sentences(diff)``: first the step time and whether its change stands above the runs' noise;
then the parts that moved it most (at most ``TOP_PARTS``, each at least ``MIN_SHARE`` of the
change and ``MIN_OF_STEP`` of the step, and outside its noise), each with what is behind it —
the kernels or operators of compute, the operations of exposed communication, the copies of other device work; then a rank
whose own compute moved far more than its peers' (the cause, where the others' waits are the
symptom); communication operations that appeared or vanished; kernels that appeared or
vanished; findings gained and lost.
"""
from __future__ import annotations

from meshscope.vocabulary import TRUST_VERDICTS

from .records import Part, RunDiff

TOP_PARTS = 3
MIN_SHARE = 0.05
MIN_OF_STEP = 0.01
#: A rank's compute change stands out when it is this many times its peers' largest.
RANK_STANDS_OUT = 3.0


def _ms(us: float | None, sign: bool = False) -> str:
    if us is None:
        return "-"
    return f"{us / 1e3:+.2f} ms" if sign else f"{us / 1e3:.2f} ms"


def _verb(delta: float, up: str = "rose", down: str = "fell") -> str:
    return up if delta > 0 else down


def _headline(d: RunDiff) -> str:
    c = d.step_time
    if c.delta is None:
        missing = d.before.name if c.before is None else d.after.name
        return f"{missing} has no step time: only its parts can be compared."
    if c.delta == 0:
        return f"Step time stayed at {_ms(c.before)} ({d.before.name} and {d.after.name}): " \
               f"no measurable change."
    rel = f", {c.rel:+.1%}" if c.rel is not None else ""
    text = (f"Step time {_verb(c.delta, 'rose', 'fell')} from "
            f"{_ms(c.before)} ({d.before.name}) to {_ms(c.after)} ({d.after.name}) "
            f"({_ms(c.delta, True)}{rel})")
    if c.noise is None:
        return text + "; the noise of a side is unknown, so whether that is more than noise " \
                      "cannot be said."
    if c.within_noise:
        return text + f", within the step-to-step noise (±{_ms(c.noise)}, counted twice): " \
                      f"no measurable change."
    return text + f", beyond the step-to-step noise (±{_ms(c.noise)}, counted twice)."


def _items_text(p: Part, per_count: bool = False) -> str:
    parts = []
    for i in p.items[:3]:
        if per_count or (i.before_us == 0 and i.after_us == 0):
            parts.append(f"{i.name} {i.count_before:g} → {i.count_after:g} a step")
        else:
            parts.append(f"{i.name} {_ms(i.delta_us, True)} "
                         f"({_ms(i.before_us)} → {_ms(i.after_us)})")
    return "; ".join(parts)


def _part_sentence(p: Part, total: float) -> str:
    d = p.delta_us
    share = f" ({abs(d) / abs(total):.0%} of the change)" if total else ""
    text = f"{p.label[0].upper()}{p.label[1:]} {_verb(d, 'grew', 'shrank')} " \
           f"{_ms(abs(d))} a step{share}"
    if p.sub:
        moved = sorted((s for s in p.sub if abs(s.delta_us) > 0), key=lambda s: -abs(s.delta_us))
        if moved:
            text += ": " + ", ".join(f"{s.label} {_ms(s.delta_us, True)}" for s in moved[:3])
    if p.items:
        behind = _items_text(p, per_count=p.name.startswith("exposed_comm"))
        lead = ("its operations per step: " if p.name.startswith("exposed_comm")
                else "the kernels that moved most: " if p.items_are == "kernels"
                else "the copies: " if p.name == "other"
                else "the operators that moved most (inclusive time): ")
        text += ("; " if p.sub else ": ") + lead + behind
    return text + "."


def _moving_parts(d: RunDiff) -> list[Part]:
    """The parts worth a sentence: at least ``MIN_SHARE`` of the change, at least
    ``MIN_OF_STEP`` of the step, and outside their noise."""
    total = d.window.delta or 0.0
    scale = abs(total) if total else max((abs(p.delta_us) for p in d.parts), default=0.0)
    step = max(abs(d.window.before or 0.0), abs(d.window.after or 0.0))
    chosen = []
    for p in sorted(d.parts, key=lambda p: -abs(p.delta_us)):
        if not scale or abs(p.delta_us) < MIN_SHARE * scale or p.change.within_noise \
                or abs(p.delta_us) < MIN_OF_STEP * step:
            continue
        chosen.append(p)
        if len(chosen) == TOP_PARTS:
            break
    return chosen


def _rank_sentence(d: RunDiff) -> str | None:
    if len(d.ranks) < 2:
        return None
    deltas = sorted(((r.delta("compute"), r) for r in d.ranks), key=lambda x: -abs(x[0]))
    (top, who), rest = deltas[0], deltas[1:]
    peers = max((abs(x) for x, _ in rest), default=0.0)
    if abs(top) <= RANK_STANDS_OUT * max(peers, 1.0) or abs(top) < MIN_SHARE * max(
            abs(d.window.delta or 0.0), 1.0):
        return None
    text = (f"Rank {who.rank_after} computes {_ms(abs(top))} {'more' if top > 0 else 'less'} "
            f"a step than before (its peers {_ms(peers)} at most)")
    waits = [(sum(r.delta(p) for r in d.ranks if r is not who) / (len(d.ranks) - 1), p)
             for p in ("bubble", "exposed_comm", "idle")]
    wait, part = max(waits, key=lambda x: x[0])
    if top > 0 and wait > 0:
        dims = [p for p in d.parts if p.name.startswith("exposed_comm.") and p.delta_us > 0]
        where = {"bubble": "in the pipeline bubble (pp)", "idle": "idle",
                 "exposed_comm": "in exposed communication"
                 + (f" ({', '.join(p.name.split('.')[1] for p in dims)})" if dims else "")}[part]
        text += f"; the other ranks wait for it: {_ms(wait)} more a step {where}"
    return text + "."


def _collectives_sentence(d: RunDiff) -> str | None:
    new = [c for c in d.collectives if c.status == "new"]
    gone = [c for c in d.collectives if c.status == "gone"]
    if not new and not gone:
        return None
    bits = []
    if new:
        bits.append("new: " + ", ".join(f"{c.dim} {c.op} ({c.count_after:g} a step)"
                                        for c in new))
    if gone:
        bits.append("gone: " + ", ".join(f"{c.dim} {c.op} ({c.count_before:g} a step)"
                                         for c in gone))
    return "Communication operations changed — " + "; ".join(bits) + "."


def _kernels_sentence(d: RunDiff) -> str | None:
    new = [k for k in d.kernels if k.status == "new" and k.total_after_us > 0]
    gone = [k for k in d.kernels if k.status == "gone" and k.total_before_us > 0]
    if not new and not gone:
        return None
    bits = []
    if new:
        bits.append(f"{len(new)} kernel(s) appeared (" + ", ".join(
            f"{k.key} {_ms(k.total_after_us)}" for k in new[:3]) + ")")
    if gone:
        bits.append(f"{len(gone)} vanished (" + ", ".join(
            f"{k.key} {_ms(k.total_before_us)}" for k in gone[:3]) + ")")
    return "Per step, " + " and ".join(bits) + "."


def _mib(b: float) -> str:
    return f"{b / (1 << 20):,.1f} MiB"


def _memory_sentence(d: RunDiff) -> str | None:
    """The allocator's peak, when it moved by at least ``MIN_SHARE`` and 1 MiB and beyond its
    noise: which rank holds the largest after, and the largest per-rank change."""
    c = d.quantities.get("peak_allocated")
    if c is None or c.delta is None or not c.before:
        return None
    if abs(c.delta) < max(MIN_SHARE * abs(c.before), 1 << 20) or c.within_noise:
        return None
    text = (f"Peak allocated memory {_verb(c.delta)} from {_mib(c.before)} to {_mib(c.after)} "
            f"({c.rel:+.0%})")
    moved = [m for m in d.memory if m.allocated_delta_bytes is not None]
    if moved:
        top = max(moved, key=lambda m: abs(m.allocated_delta_bytes))
        text += (f"; rank {top.rank_after} ({top.device}) "
                 f"{'+' if top.allocated_delta_bytes >= 0 else '−'}"
                 f"{_mib(abs(top.allocated_delta_bytes))}")
    return text + "."


def _findings_sentences(d: RunDiff) -> list[str]:
    out = []
    for f in d.findings:
        cost = f.cost_after_us if f.status == "new" else f.cost_before_us
        cost_text = f" (costs {_ms(cost)} a step)" if cost else ""
        if f.status == "new":
            out.append(f"New finding: {f.title}{cost_text}.")
        elif f.status == "gone":
            out.append(f"Finding gone: {f.title}{cost_text}.")
    return out


def _unlike_sentence(d: RunDiff) -> str | None:
    """What the runs differ in besides the change under review, said before any cause."""
    if not d.unlike:
        return None
    return ("Not like for like — " + "; ".join(d.unlike) + ": read every cause below with "
            "that in mind.")


#: How the sentence on the runs' evidence begins (the text's head leaves its own lines out
#: when the sentence says it).
EVIDENCE_SENTENCE = "Evidence — "


def _evidence_sentence(d: RunDiff) -> str | None:
    """Where either run's numbers rest on evidence that failed a check (``analysis/trust/``):
    each side's verdict, before any cause. (A report that predates the checks says so in
    the head of every view, not here: nothing was found against it.)"""
    sides = (d.before, d.after)
    if not any(s.trust_verdict in TRUST_VERDICTS[1:] for s in sides):
        return None
    return (EVIDENCE_SENTENCE + "; ".join(f"{s.name}: {s.evidence}" for s in sides)
            + ": a cause resting on the numbers named there is no firmer than they are.")


_OTHER_HARDWARE = " (on other hardware: the device changed)"


def sentences(d: RunDiff) -> list[str]:
    """The comparison in a few sentences (module docstring): first, where the runs are not
    alike, what differs; then the headline and the causes. Under a change of device every
    kernel-level sentence says the hardware changed."""
    out = [s for s in (_unlike_sentence(d), _evidence_sentence(d)) if s] + [_headline(d)]
    total = d.window.delta or 0.0
    for p in _moving_parts(d):
        text = _part_sentence(p, total)
        if d.hardware_changed and p.items and p.items_are == "kernels":
            text = text[:-1] + _OTHER_HARDWARE + "."
        out.append(text)
    for s in (_rank_sentence(d), _memory_sentence(d), _collectives_sentence(d),
              _kernels_sentence(d)):
        if s:
            if d.hardware_changed and s is not None and s.startswith("Per step, "):
                s = s[:-1] + _OTHER_HARDWARE + "."
            out.append(s)
    out += _findings_sentences(d)
    return out
