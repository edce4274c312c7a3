"""The human-readable summary that ``meshscope analyze`` prints (from summary.json alone)."""
from __future__ import annotations

from meshscope.analysis.report import reader
from meshscope.analysis.report.printable import printable_tree
from meshscope.analysis.report.model import trust_caveat_lines, trust_headline, trust_marks


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1000:9.2f}"


def _pct(x) -> str:
    return "    -" if x is None else f"{x:5.1f}"


def _num(x, width: int, digits: int) -> str:
    """A number right-aligned in ``width``; "-" where unknown (never 0 for unknown)."""
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.{digits}f}"


def _bytes(n) -> str:
    """Bytes in binary units, right-aligned in 10; "-" where unknown."""
    if n is None:
        return f"{'-':>10}"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:>6.2f} {unit}"
    return f"{int(n):>8} B"


def memory_lines(mem: reader.MemorySummary) -> list[str]:
    """The memory section: per rank and device, the peaks over the profiled steps and where
    they fall; the stages; the snapshots."""
    lines = []
    if mem.devices:
        lines += ["", "Memory per rank and device (largest over the profiled steps):",
                  "  rank device   peak alloc  step  peak reserved  reserved-alloc  "
                  "growth/step  device mem  at (operator)"]
        for d in mem.devices:
            growth = _bytes(d.growth_per_step_bytes) if d.growth_per_step_bytes else \
                f"{'0':>10}" if d.growth_per_step_bytes == 0 else f"{'-':>10}"
            where = d.peak_op or "-"
            if d.peak_module:
                where += f" in {d.peak_module}"
            lines.append(f"  {d.rank:>4} {d.device:<7} {_bytes(d.peak_allocated_bytes)} "
                         f"{d.peak_step if d.peak_step is not None else '-':>5}     "
                         f"{_bytes(d.peak_reserved_bytes)}      {_bytes(d.fragmentation_bytes)}"
                         f"   {growth}  {_bytes(d.device_total_bytes)}  {where}")
        kinds = {d.totals for d in mem.devices}
        if "since-start" in kinds:
            lines.append("  note: CPU totals count only what was allocated while the profiler "
                         "recorded (PyTorch's CPU allocator reports nothing older)")
        if "rebuilt" in kinds:
            lines.append("  note: the trace has no allocator totals (PyTorch 1.8): allocated "
                         "is rebuilt from the signed Bytes, from 0 at the trace's start")
    for s in mem.stages:
        peak = _bytes(s.peak_allocated_bytes).strip()
        lines.append(f"  stage {s.stage} (ranks {s.ranks}): peak {peak} on rank {s.peak_rank}")
    for s in mem.snapshots:
        b = {k: _bytes(v).strip() for k, v in (
            ("reserved", s.reserved_bytes), ("allocated", s.allocated_bytes),
            ("free", s.free_in_segments_bytes), ("largest", s.largest_allocated_bytes))}
        lines.append(f"  snapshot {s.source} (rank {s.rank}, {s.device}): reserved "
                     f"{b['reserved']}, allocated {b['allocated']}, free in segments "
                     f"{b['free']}; largest moment {b['largest']} allocated")
        if s.oom and s.oom.explained:
            lines.append(f"    why: {s.oom.explained}")
        if s.caveat:
            lines.append(f"    caveat: {s.caveat}")
        if s.oom:
            asked = _bytes(s.oom.requested_bytes).strip()
            free = _bytes(s.oom.device_free_bytes).strip()
            lines.append(f"    OUT OF MEMORY: asked for {asked} with {free} free on the device")
    return lines


def render(summary: dict) -> str:
    """The report as text (``meshscope analyze`` prints it, ``meshscope report`` too): the
    head, per-rank means, GPU idle by cause, the top kernels, the pipeline, the cross-rank
    verdicts, bandwidth, memory and the findings — each section from the typed summary
    (``reader.read_summary``), in that order."""
    summary = printable_tree(summary)       # names from input files may hold escapes
    typed = reader.read_summary(summary)
    return "\n".join([*_head_lines(typed), *_per_rank_lines(typed), *_gpu_idle_lines(typed),
                      *_kernel_lines(typed), *_pipeline_lines(typed),
                      *_cross_rank_lines(typed), *_bandwidth_lines(typed),
                      *memory_lines(typed.memory), *_finding_lines(typed)])


def _head_lines(typed: reader.Summary) -> list[str]:
    """The source, the layout, the device, the ranks, the step time, problems."""
    lines = []
    head = f"meshscope report — {typed.source}"
    if typed.run:
        head += (f"\n  layout {typed.run_fact('layout_str')}, {typed.run_fact('world_size')} "
                 f"ranks, schedule {typed.run_fact('schedule') or '-'}, "
                 f"{typed.run_fact('microbatches')} microbatches")
    lines.append(head)
    lines.append(f"  device {typed.device}; ranks analysed {typed.ranks}; "
                 f"profiled steps {typed.steps}")
    st = typed.step_time
    if st.us is not None:
        other = [f"{name} {_ms(v).strip()} ms" for name, v in
                 (("step timer", st.timer_us), ("replayed", st.replayed_us),
                  ("profiled window", st.window_us)) if v is not None and name != st.short]
        rate = ""       # tokens/s and MFU only beside the timer's step time (the reader's)
        if typed.tokens_per_s is not None:
            rate = f", {typed.tokens_per_s:,.0f} tokens/s"
            if typed.mfu_pct is not None:
                rate += f", MFU {typed.mfu_pct:.1f}%"
        lines.append(f"  step time {st.text()}{rate} — {st.label}"
                     + (f"; also {', '.join(other)}" if other else ""))
    lines.append(f"  evidence: {trust_headline(typed.trust, typed.schema_version)}")
    lines += [f"    {c}" for c in trust_caveat_lines(typed.trust)]
    if typed.missing_ranks:
        lines.append(f"  MISSING ranks: {typed.missing_ranks}")
    for p in typed.problems:
        lines.append(f"  problem: {p}")
    if not typed.per_rank_mean:
        lines.append("  (no profiled step in the traces: only the always-on records below)")
    return lines


def _per_rank_lines(typed: reader.Summary) -> list[str]:
    """Per rank, the means over profiled steps, and the notes."""
    lines = [""]
    lines.append("Per rank, mean over profiled steps (ms):")
    lines.append("  rank    window   compute      comm overlapped   exposed    bubble      idle"
                 "  overlap%")
    mark = trust_marks(typed.trust)
    for r in typed.per_rank_mean:
        lines.append(f"  {r.rank:>4}{mark.get(r.rank, ' ')}{_ms(r.window_us)} {_ms(r.compute_us)} "
                     f"{_ms(r.comm_us)}  {_ms(r.overlapped_comm_us)} "
                     f"{_ms(r.exposed_comm_us)} {_ms(r.bubble_us)} {_ms(r.idle_us)}"
                     f"     {_pct(r.overlap_pct)}")
    if mark:
        lines.append("  † usable with caveats, ‡ not trustworthy: see 'evidence' above")
    for note in typed.notes:
        lines.append(f"  note: {note}")
    return lines


def _gpu_idle_lines(typed: reader.Summary) -> list[str]:
    """Where each rank's GPU idle time goes, by cause."""
    lines: list[str] = []
    if typed.gpu_idle_per_rank_mean:
        lines.append("")
        lines.append("Where the GPU's idle time goes, per rank, mean over profiled steps (ms):")
        lines.append("  rank      idle  dataloader      sync  wait-rank   start-up    launch"
                     "       cpu    queued     other")
        idle = {m.rank: m.idle_us for m in typed.per_rank_mean}
        for r in typed.gpu_idle_per_rank_mean:
            c = r.by_cause_us
            lines.append(f"  {r.rank:>4} {_ms(idle.get(r.rank))}   {_ms(c.get('dataloader'))}"
                         f" {_ms(c.get('sync'))}  {_ms(c.get('wait_rank'))}  "
                         f"{_ms(c.get('startup'))} {_ms(c.get('launch'))} {_ms(c.get('cpu'))} "
                         f"{_ms(c.get('queued'))} {_ms(c.get('other'))}")
    return lines


def _kernel_lines(typed: reader.Summary) -> list[str]:
    """The top kernels per rank."""
    lines: list[str] = []
    if typed.top_kernels:
        lines.append("")
        lines.append("Top kernels per rank (time over the profiled steps):")
        for k in typed.top_kernels:
            name = k.name if len(k.name) <= 60 else k.name[:57] + "..."
            lines.append(f"  rank {k.rank:>3}  {k.total_us / 1000:9.2f} ms "
                         f"{k.share_pct or 0:5.1f}%  {k.count:>6}×  "
                         f"{k.category:<16} {name}")
    return lines


def _pipeline_lines(typed: reader.Summary) -> list[str]:
    """The bubble per stage against theory and the replay, and the stage imbalance."""
    lines: list[str] = []
    if typed.pipeline_stages:
        lines.append("")
        lines.append("Pipeline bubble per stage (fraction of the pipeline window):")
        lines.append("  stage  measured  replayed  theory  ranks")
        for s in typed.pipeline_stages:
            theory, replayed = s.theory_fraction, s.replayed_bubble_fraction
            lines.append(f"  {s.stage:>5}  {_num(s.bubble_fraction, 8, 3)}  "
                         f"{'-' if replayed is None else f'{replayed:8.3f}'}  "
                         f"{'-' if theory is None else f'{theory:6.3f}'}  {s.ranks}")
        measured = typed.stage_imbalance_measured
        corrected = typed.stage_imbalance_without_straggler
        if measured:
            lines.append(f"  stage imbalance, measured (compute per microbatch): max/mean "
                         f"{measured.max_over_mean:.3f}, slowest stage "
                         f"{measured.slowest_stage}")
        if corrected:
            lines.append(f"  stage imbalance, replayed with the straggler at its peers' pace: "
                         f"max/mean {corrected.max_over_mean:.3f}, slowest stage "
                         f"{corrected.slowest_stage}")
    return lines


def _cross_rank_lines(typed: reader.Summary) -> list[str]:
    """Why collectives cannot be matched, or the what-if savings and the straggler; hangs
    and desyncs."""
    lines: list[str] = []
    cross = typed.cross_rank
    if cross.why_not:
        lines.append("")
        lines.append("Collectives cannot be matched across ranks:")
        lines.extend(f"  {w}" for w in cross.why_not)
    else:
        st = cross.straggler
        savings = [r for r in cross.rank_savings if r.saving_us is not None]
        if savings:
            lines.append("")
            lines.append("What-if: the step with each rank's work at its reference pace "
                         "(ms saved per step):")
            lines.append("  " + "  ".join(f"rank {s.rank}: {_ms(s.saving_us).strip()}"
                                          for s in savings))
        if st and st.saving_us is not None:
            head = typed.step_time.us
            pct = "" if not head else \
                f" ({100 * st.saving_us / head:.0f}% of the {head / 1e3:.2f} ms step)"
            gate = "" if st.gate_us is None else (
                f"; it stands above the gate of {_ms(st.gate_us).strip()} ms (twice the "
                f"what-if's resolution)")
            lines.append(f"Straggler: rank {st.rank} — {st.saving_us / 1000:.1f} ms per "
                         f"step{pct} at its reference pace ({st.reference}){gate}")
        elif st:
            lines.append(f"Straggler: rank {st.rank}")
        elif savings:
            lines.append("No straggler: no rank's saving is steady over the steps and twice "
                         f"what the what-if resolves ({_ms(cross.resolution_us).strip()} ms: "
                         f"step noise {_ms(cross.noise_us).strip()} ms, what-if floor "
                         f"{_ms(cross.floor_us).strip()} ms).")
    lines += _hang_lines(typed)
    if typed.hangs_judged is False:
        lines.append("Flight Recorder: no records — hangs and desyncs cannot be judged.")
    elif typed.hangs_judged and not any(h.verdict in ("missing", "mismatch")
                                        for h in typed.hangs or []):
        if not typed.hang_causes:
            lines.append(f"Flight Recorder: the records of "
                         f"{len(typed.flight_recorder_ranks or [])} rank(s) show no hang and "
                         f"no desync.")
        else:       # no verdict row, but a cause: a stall, or ranks without a dump
            lines.append(f"Flight Recorder: no rank of the {len(typed.flight_recorder_ranks)} "
                         f"read is missing from a collective or disagrees on one — but see "
                         f"the cause{'s' * (len(typed.hang_causes) != 1)} above.")
    return lines


def _hang_lines(typed: reader.Summary) -> list[str]:
    """What the Flight Recorder says, once: how many collectives some ranks never reached or
    disagree on (the verdicts folded into one line each), then why — one line per cause with
    the collective as torch's analyser shows it, the evidence and what to do next. A report
    written before the causes existed prints its first verdicts as they are."""
    verdicts = [h for h in typed.hangs or [] if h.verdict in ("missing", "mismatch")]
    if typed.hang_causes is None:
        return [f"{'HANG' if h.verdict == 'missing' else 'DESYNC'}: {h.detail}"
                for h in verdicts[:5]]
    lines = []
    for verdict, word in (("missing", "some ranks never reached"),
                          ("mismatch", "the ranks disagree on")):
        these = [h for h in verdicts if h.verdict == verdict]
        if these:
            lines.append(f"Flight Recorder: {len(these)} collective{'s' * (len(these) != 1)} "
                         f"{word} (flight_recorder.parquet); the first: {these[0].detail}")
    for c in typed.hang_causes:
        ranks = ", ".join(map(str, c.ranks))
        at = f" at {c.collective}" if c.collective else ""
        lines.append(f"Cause: {c.cause} — rank{'s' * (len(c.ranks) != 1)} {ranks}{at}")
        lines.append(f"  evidence: {c.evidence}")
        lines.append(f"  next: {c.remedy}")
    return lines


def _bandwidth_lines(typed: reader.Summary) -> list[str]:
    """Collective bandwidth per dimension, op and size bucket (the first 20 rows)."""
    lines: list[str] = []
    bw = typed.bandwidth
    if bw:
        lines.append("")
        lines.append("Collective bandwidth (median per dimension, op and size bucket):")
        lines.append("   dim              op  ranks     bytes  transfer us  busbw GB/s  "
                     "efficiency")
        for b in bw[:20]:
            eff = b.efficiency
            lines.append(f"  {b.dim:>4} {b.op:>15} {b.group_size or '-':>6} "
                         f"{_num(b.msg_bytes, 9, 0)} {_num(b.transfer_us, 12, 1)} "
                         f"{_num(b.busbw_gbps, 11, 3)}  "
                         f"{'-' if eff is None else f'{eff:.0%}'}")
        if len(bw) > 20:
            lines.append(f"  … {len(bw) - 20} more rows in report/bandwidth_summary.parquet")
    return lines


def _finding_lines(typed: reader.Summary) -> list[str]:
    """The findings, largest cost first, each with its remedy."""
    lines: list[str] = []
    if typed.findings:
        lines.append("")
        lines.append("Findings (largest cost first):")
        for i, f in enumerate(typed.findings, 1):
            cost = "" if f.cost_us is None else \
                f" — costs {f.cost_us / 1000:.1f} ms/step" + \
                ("" if f.cost_pct is None else f" ({f.cost_pct:.1f}%)")
            if f.peak_saving_bytes:
                cost += f" — lowers the peak by {_bytes(f.peak_saving_bytes).strip()}"
            lines.append(f"  {i}. [{f.severity}] {f.title}{cost}")
            if f.caveats:
                lines.append(f"     rests on evidence that failed: {', '.join(f.caveats)}")
            lines.append(f"     remedy: {f.remedy}")
    return lines
