"""A comparison written out: the terminal text, Markdown for a pull request, JUnit XML for CI.

``text(diff)`` — the sentences, the parts of the step-time difference ranked by size (with
their noise and what is behind each), the kernels, operators and collectives that changed,
bandwidth per size bucket, findings and per-rank deltas. ``markdown(diffs, verdicts)`` — the
same in short, for a pull-request comment. ``junit(diffs, verdicts)`` — one test case per
condition and candidate, a ``failure`` where the gate fails (the form CI systems read).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from meshscope.analysis.comm.bandwidth import bucket_label

from .records import Part, RunDiff
from .gate import Verdict
from .story import EVIDENCE_SENTENCE

KERNEL_ROWS = 12


def _ms(us, sign: bool = False) -> str:
    if us is None:
        return "-"
    return f"{us / 1e3:+.2f}" if sign else f"{us / 1e3:.2f}"


_ITEMS = {"kernels": "the kernels that moved most", "operators":
          "the operators that moved most, inclusive time", "copies": "the copies",
          "collectives": "its operations per step and rank"}


def _mb(b) -> str:
    return "-" if b is None else f"{b / 1e6:.2f}"


def _mib(b) -> str:
    return "-" if b is None else f"{b / (1 << 20):,.1f}"


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _noise(p: Part) -> str:
    n = p.change.noise
    if n is None:
        return "?"
    return f"±{n / 1e3:.2f}" + (" (within)" if p.change.within_noise else "")


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n - 1] + "…"


def _part_rows(d: RunDiff) -> list[tuple[str, Part]]:
    """(indent, part) ranked by |Δ|, each exposed-communication part followed by its ops."""
    rows = []
    for p in sorted(d.parts, key=lambda p: -abs(p.delta_us)):
        rows.append(("", p))
        for s in sorted(p.sub, key=lambda s: -abs(s.delta_us)):
            rows.append(("    ", s))
        rows += [("item", p)] if p.items else []
    return rows


def text(d: RunDiff) -> str:
    """The terminal text of one comparison (module docstring): the sentences, the step time,
    where the difference is, then kernels, operators, collectives, bandwidth, findings,
    memory and ranks where they changed, and the notes."""
    return "\n".join([*_step_lines(d), *_kernel_lines(d), *_operator_lines(d),
                      *_collective_lines(d), *_bandwidth_lines(d), *_finding_lines(d),
                      *_memory_lines(d), *_rank_lines(d), *(f"note: {n}" for n in d.notes)])


def _step_lines(d: RunDiff) -> list[str]:
    """The head, the sentences, the step time and its parts with the window and the residual."""
    said = any(s.startswith(EVIDENCE_SENTENCE) for s in d.sentences)
    out = [f"meshscope compare — {d.before.name} → {d.after.name}",
           *([] if said else (f"  evidence of {s.name}: {s.evidence}"
                              for s in (d.before, d.after))), ""]
    out += [f"  {s}" for s in d.sentences]
    c = d.step_time
    out += ["", f"Step time (ms): {_ms(c.before)} → {_ms(c.after)}  Δ {_ms(c.delta, True)}"
            + (f" ({c.rel:+.1%})" if c.rel is not None else "")
            + (f"  noise ±{_ms(c.noise)}" if c.noise is not None else "  noise unknown")
            + f"  [{d.before.step_time_source or '-'} / {d.after.step_time_source or '-'}]"]
    out += ["", "Where the difference is, per step (ms; profiled steps, mean over ranks):",
            f"  {'part':<44} {'before':>9} {'after':>9} {'Δ':>9} {'share':>6}  noise"]
    for indent, p in _part_rows(d):
        if indent == "item":
            out.append(f"    ({_ITEMS.get(p.items_are, p.items_are)})")
            for i in p.items[:3]:
                if p.items_are == "collectives":
                    out.append(f"  {'':<4}{_clip(i.name, 40):<40} "
                               f"{i.count_before:>8.3g}× {i.count_after:>8.3g}× a step")
                else:
                    out.append(f"  {'':<4}{_clip(i.name, 40):<40} {_ms(i.before_us):>9} "
                               f"{_ms(i.after_us):>9} {_ms(i.delta_us, True):>9}")
            continue
        share = f"{p.share:.0%}" if p.share is not None and not indent else ""
        out.append(f"  {_clip(indent + p.label, 44):<44} {_ms(p.change.before):>9} "
                   f"{_ms(p.change.after):>9} {_ms(p.delta_us, True):>9} {share:>6}  "
                   f"{_noise(p)}")
    # Not the report's window (summary window_us, the longest rank's): the mean over ranks,
    # which the parts (means over ranks too) add up to exactly (quantities, ``window``).
    w = d.window
    out.append(f"  {'window (mean over ranks; the parts add up)':<44} {_ms(w.before):>9} "
               f"{_ms(w.after):>9} {_ms(w.delta, True):>9}")
    if d.residual_us is not None:
        out.append(f"  residual: Δ step time − Σ Δ parts = {_ms(d.residual_us, True)} ms"
                   + _residual_why(d))
    return out


def _kernel_lines(d: RunDiff) -> list[str]:
    """The kernels, matched by folded name (the first ``KERNEL_ROWS``)."""
    out: list[str] = []
    if d.kernels:
        out += ["", "Kernels (per step, mean over ranks; matched by folded name):",
                f"  {'kernel':<48} {'count':>13} {'total ms':>17} {'Δ ms':>8}  status"]
        for k in d.kernels[:KERNEL_ROWS]:
            out.append(f"  {_clip(k.key, 48):<48} {k.count_before:>6g}→{k.count_after:<6g} "
                       f"{_ms(k.total_before_us):>8}→{_ms(k.total_after_us):<8} "
                       f"{_ms(k.delta_us, True):>8}  {k.status}")
        if len(d.kernels) > KERNEL_ROWS:
            out.append(f"  … {len(d.kernels) - KERNEL_ROWS} more (--json has every kernel)")
    return out


def _operator_lines(d: RunDiff) -> list[str]:
    """The operators whose launches per step changed (ten at most)."""
    out: list[str] = []
    if d.operators:
        out += ["", "Operators whose launches per step changed (mean over ranks):"]
        for o in sorted(d.operators, key=lambda o: -abs(o.count_after - o.count_before))[:10]:
            out.append(f"  {_clip(o.name, 48):<48} {o.count_before:>8g} → {o.count_after:<8g}"
                       f" {o.status}")
    return out


def _collective_lines(d: RunDiff) -> list[str]:
    """The collectives whose count or bytes per step changed."""
    out: list[str] = []
    moved = [c for c in d.collectives if c.count_before != c.count_after
             or c.bytes_before != c.bytes_after]
    if moved:
        out += ["", "Collectives per step and rank (count, MB):"]
        for c in moved:
            out.append(f"  {c.dim:<8} {c.op:<16} {c.count_before:>7.3g} → {c.count_after:<7.3g} "
                       f"{_mb(c.bytes_before):>9} → {_mb(c.bytes_after):<9} {c.status}")
    return out


def _bandwidth_lines(d: RunDiff) -> list[str]:
    """The bus bandwidth per size bucket, where either side has one."""
    out: list[str] = []
    bw = [b for b in d.bandwidth if b.busbw_before_gbps is not None
          or b.busbw_after_gbps is not None]
    if bw:
        out += ["", "Bus bandwidth by size (median GB/s):"]
        for b in bw:
            out.append(f"  {b.dim:<8} {b.op:<16} {bucket_label(b.size_bucket):>8}  "
                       f"{_num(b.busbw_before_gbps):>8} → {_num(b.busbw_after_gbps)}")
    return out


def _finding_lines(d: RunDiff) -> list[str]:
    """The findings gained, lost or whose cost changed."""
    out: list[str] = []
    changed = [f for f in d.findings if f.status != "both" or f.cost_before_us != f.cost_after_us]
    if changed:
        out += ["", "Findings:"]
        for f in changed:
            out.append(f"  {f.status:<5} {_clip(f.title, 80)}  cost "
                       f"{_ms(f.cost_before_us)} → {_ms(f.cost_after_us)} ms")
    return out


def _memory_lines(d: RunDiff) -> list[str]:
    """Each rank's allocator peaks before and after."""
    out: list[str] = []
    if d.memory:
        out += ["", "Memory: each rank's allocator peak on its main device (MiB, largest over "
                    "the profiled steps):",
                "  rank     device      allocated before → after      reserved before → after"]
        for m in d.memory:
            label = str(m.rank_after) if m.rank_before == m.rank_after else \
                f"{m.rank_before}→{m.rank_after}"
            out.append(f"  {label:<8} {m.device:<10} {_mib(m.allocated_before_bytes):>10} → "
                       f"{_mib(m.allocated_after_bytes):<10}   "
                       f"{_mib(m.reserved_before_bytes):>10} → "
                       f"{_mib(m.reserved_after_bytes):<10}")
    return out


def _rank_lines(d: RunDiff) -> list[str]:
    """Per rank, the change of each part."""
    out: list[str] = []
    if d.ranks:
        out += ["", f"Per rank, Δ per step (ms; ranks matched by {d.rank_match}):",
                "  rank     window   compute   exposed    bubble     other      idle"]
        for r in d.ranks:
            label = str(r.rank_after) if r.rank_before == r.rank_after else \
                f"{r.rank_before}→{r.rank_after}"
            out.append(f"  {label:<6}" + "".join(
                f"{_ms(r.delta(p), True):>10}" for p in
                ("window", "compute", "exposed_comm", "bubble", "other", "idle")))
    return out


def _residual_why(d: RunDiff) -> str:
    """Why the parts need not add up to the headline's change: what each one measures."""
    sources = {d.before.step_time_source, d.after.step_time_source}
    if sources == {"window"}:
        return " (the headline is the longest rank's window; the parts, the mean over ranks)"
    words = {"timer": "the step timer over every non-warm-up step",
             "replayed": "the replayed makespan of the profiled steps"}
    heads = " and ".join(sorted(words.get(s, "the profiled window") for s in sources if s))
    return f" (the parts are the profiled steps' windows; the headline is {heads})"


def gate_text(verdicts: list[tuple[str, Verdict]]) -> str:
    """One line per condition and candidate."""
    return "\n".join(f"gate [{name}] {v.message}" for name, v in verdicts)


def markdown(diffs: list[RunDiff], verdicts: list[tuple[str, Verdict]]) -> str:
    """A pull-request comment: the gate's verdict, then per comparison the sentences and the
    parts table."""
    out = ["## meshscope compare", ""]
    for d in diffs:     # before any verdict or cause: the runs are not alike
        if d.unlike:
            out += [f"**Not like for like** ({_md(d.before.name)} → {_md(d.after.name)}): "
                    + _md("; ".join(d.unlike)), ""]
    if verdicts:
        failed = [v for _, v in verdicts if v.failed]
        unchecked = [v for _, v in verdicts if not v.checked]
        out.append(f"**Gate: {'failed' if failed else 'passed'}** "
                   f"({len(failed)} of {len(verdicts)} condition(s) failed"
                   + (f"; {len(unchecked)} not checked: not measured" if unchecked else "")
                   + ")")
        out += ["", "| | condition | run | result |", "|---|---|---|---|"]
        for name, v in verdicts:
            mark = "❌" if v.failed else "✅" if v.checked else "⚪ not checked"
            out.append(f"| {mark} | `{v.condition.text}` | {name} | "
                       f"{_md(v.message.split(' — ', 1)[-1])} |")
        out.append("")
    for d in diffs:
        out += [f"### {_md(d.before.name)} → {_md(d.after.name)}", ""]
        out += [f"Evidence of {_md(s.name)}: {_md(s.evidence)}  " for s in (d.before, d.after)]
        out += [""]
        out += [f"- {_md(s)}" for s in d.sentences]
        out += ["", "| part | before ms | after ms | Δ ms | share | noise ms |",
                "|---|---:|---:|---:|---:|---:|"]
        for indent, p in _part_rows(d):
            if indent:      # the table of a comment: the parts only
                continue
            n = p.change.noise
            out.append(f"| {_md(p.label)} | {_ms(p.change.before)} | {_ms(p.change.after)} | "
                       f"{_ms(p.delta_us, True)} | "
                       f"{'' if p.share is None else format(p.share, '.0%')} | "
                       f"{'?' if n is None else _ms(n)} |")
        out.append(f"| **window** (mean over ranks) | {_ms(d.window.before)} | "
                   f"{_ms(d.window.after)} | "
                   f"{_ms(d.window.delta, True)} | | |")
        if d.residual_us is not None:
            out.append("")
            out.append(f"Residual (Δ step time − Σ Δ parts): {_ms(d.residual_us, True)} ms.")
        out.append("")
    return "\n".join(out)


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def junit(verdicts: list[tuple[str, Verdict]], diffs: list[RunDiff]) -> str:
    """JUnit XML: a ``testsuite`` named ``meshscope compare`` (its properties: where the runs
    are not alike, and each run's evidence), a ``testcase`` per condition
    and candidate (classname: the candidate run), a ``failure`` where the gate fails; with no
    condition, one case per comparison that always passes and carries its sentences."""
    suite = ET.Element("testsuite", name="meshscope compare")
    unlike = {d.after.name: d.unlike for d in diffs if d.unlike}
    props = ET.SubElement(suite, "properties")
    for name, what in unlike.items():   # said before any verdict: the runs are not alike
        ET.SubElement(props, "property", name=f"not_like_for_like.{name}",
                      value="; ".join(what))
    sides = {s.name: s.evidence for d in diffs for s in (d.before, d.after)}
    for name, evidence in sides.items():     # what each run's numbers rest on
        ET.SubElement(props, "property", name=f"evidence.{name}", value=evidence)
    failures = 0
    if verdicts:
        for name, v in verdicts:
            case = ET.SubElement(suite, "testcase", classname=f"meshscope.compare.{name}",
                                 name=v.condition.text)
            if name in unlike:
                ET.SubElement(case, "system-err").text = \
                    "Not like for like — " + "; ".join(unlike[name])
            if v.failed:
                failures += 1
                f = ET.SubElement(case, "failure", message=v.message, type="regression")
                f.text = v.message
            elif not v.checked:
                ET.SubElement(case, "skipped", message=v.message)
            else:
                ET.SubElement(case, "system-out").text = v.message
    else:
        for d in diffs:
            case = ET.SubElement(suite, "testcase", classname="meshscope.compare",
                                 name=f"{d.before.name} -> {d.after.name}")
            ET.SubElement(case, "system-out").text = "\n".join(d.sentences)
    cases = len(suite.findall("testcase"))
    suite.set("tests", str(cases))
    suite.set("skipped", str(len(suite.findall("testcase/skipped"))))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    root = ET.Element("testsuites", tests=str(cases), failures=str(failures), errors="0")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
