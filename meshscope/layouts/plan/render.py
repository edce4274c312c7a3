"""A plan as the text ``meshscope plan`` prints: the ranked table and, with ``detail``, every
term, every operation and every device value with its source.

The table keeps each layout's full name (its width follows the longest), gives each its
micro-batch size, recomputation and data-parallel mode, marks the layouts that do not fit
the device's memory, and — when the plan has an uncertainty — shows the predicted step's ±
band (a MoE job's tokens/s as a low–high range, with the reason) and marks the layouts within it of the fastest that fits as ties (``≈``; none when no
layout fits). When nothing fits, the changes that make a layout fit follow the warning.
Byte counts are binary (KiB, MiB, GiB), as a device's memory is given.
"""
from __future__ import annotations


def fmt_bytes(b: float) -> str:
    """Bytes in binary units: ``80.0 GiB``, ``1.5 MiB``."""
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def _header(p) -> list[str]:
    job = p.training is not None and p.training.framework != "runner"
    if job:
        t = p.training
        prec = t.precision + (f" ({', '.join(t.fp8_ops)} in fp8, {t.fp8_recipe} scaling)"
                              if t.precision == "fp8" else "")
        rc = "searched" if "recompute" in p.searched else t.recompute
        what = (f"{t.framework} ({t.job_style} style), {prec}, {t.optimizer} "
                f"(states {t.optimizer_states}), recompute {rc}")
    else:
        what = f"precision {p.precision.name}"
    m = p.model
    extra = f" + {m.mtp_params() / 1e6:,.1f} M in MTP modules" if m.mtp_layers else ""
    lines = [f"model {m.name}: {m.n_params() / 1e6:,.1f} M parameters{extra} "
             f"({m.active_params() / 1e6:,.1f} M active), "
             f"{m.flops_per_token() / 1e6:,.1f} MFLOP/token, sequence {m.seq_len}, {what}"]
    if p.device is not None:
        lines.append(f"device {p.device.name}: {p.device.memory_bytes / 2**30:.0f} GiB, "
                     f"bf16 peak {p.device.peak_bf16 / 1e12:g} TFLOP/s"
                     + (f", fp8 {p.device.peak_flops['fp8'] / 1e12:g}"
                        if "fp8" in p.device.peak_flops else ""))
    return lines


def _fit_changes(p) -> list[str]:
    """The lines that say what makes a layout fit, when none does."""
    if not p.warnings or not any(r.fits is False for r in p.rows) or \
            any(r.fits for r in p.rows):
        return []
    if not p.fit_changes:
        return ["no single change tried (recomputation, data-parallel mode, micro-batch "
                "size, optimizer states, offload, more GPUs, a larger device) makes a layout "
                "fit"]
    out = ["to make a layout fit, change one of:"]
    for c in p.fit_changes:
        if c.frees_bytes > 0:
            out.append(f"  {c.text:<28} frees {fmt_bytes(c.frees_bytes):>10}  (the smallest "
                       f"layout then needs {fmt_bytes(c.peak_bytes)} a GPU)")
        else:
            out.append(f"  {c.text:<28} {fmt_bytes(c.memory_bytes)} a GPU holds the "
                       f"smallest layout's {fmt_bytes(c.peak_bytes)}")
    return out


def render_plan(p, detail: bool = False, top: int | None = None) -> str:
    lines = _header(p)
    lines += [f"WARNING: {w}" for w in p.warnings]
    lines += _fit_changes(p)
    if p.searched:
        lines.append(f"searched within each layout: {', '.join(p.searched)} (memory first: "
                     f"only what fits is timed)"
                     + (f"; {p.not_shown_over_memory} layouts fit no variant and are not "
                        f"shown" if p.not_shown_over_memory and any(r.fits for r in p.rows)
                        else ""))
    rows = p.rows[:top] if top else p.rows
    width = max([len(r.name) for r in rows] + [6])
    band = p.uncertainty
    rng = p.throughput_range
    job = p.training is not None and p.training.framework != "runner"
    tok_w = 15 if rng else 10
    head = (f"{'#':>3}  {'layout':<{width}} {'mbs':>4} {'recompute':>9} {'dp mode':>14} "
            f"{'peak mem':>10} {'fits':>4} {'params':>10} "
            f"{'grads':>10} {'optim':>10} {'buffers':>10} {'activ':>10}  {'bubble':>6} "
            f"{'step ms':>10} {'±':>5} {'tok/s/GPU':>{tok_w}} {'MFU':>5} {'fp8 TF/s':>8}  "
            f"comm/step sent (* between nodes)")
    lines.append(head)
    for i, r in enumerate(rows, 1):
        m = r.peak
        wire = r.wire_bytes or r.comm_bytes
        comm = ", ".join(f"{d}{'*' if r.link_level.get(d) == 'inter' else ''} "
                         f"{fmt_bytes(b)}" for d, b in wire.items()) or "-"
        est = r.estimate
        fits = {True: "yes", False: "NO", None: "?"}[r.fits]
        mark = "≈" if r.tie else " "
        world = r.candidate.layout.world_size
        if est:
            per_gpu = est.tokens_per_s / world
            tok = (f"{per_gpu * rng.low_factor:,.0f}–{per_gpu * rng.high_factor:,.0f}"
                   if rng else f"{per_gpu:.0f}")
            tail = (f"{est.step_time_us / 1e3:10.1f} "
                    + (f"{band * 100:4.0f}%" if band is not None else f"{'-':>5}")
                    + f" {tok:>{tok_w}} "
                    + (f"{est.mfu_pct:5.1f}" if est.mfu_pct is not None else f"{'-':>5}")
                    + (f" {est.fp8_tflops_per_gpu:8.0f}" if est.fp8_tflops_per_gpu
                       else f" {'-':>8}"))
        else:
            tail = f"{'-':>10} {'-':>5} {'-':>{tok_w}} {'-':>5} {'-':>8}"
        c = r.candidate
        rc = c.recompute or (p.training.recompute if job else "-")
        lines.append(
            f"{i:>2}{mark} {r.name:<{width}} {c.micro_batch_size:>4} {rc:>9} "
            f"{c.dp_mode:>14} {fmt_bytes(m.total_bytes):>10} {fits:>4} "
            f"{fmt_bytes(m.params_bytes):>10} {fmt_bytes(m.grads_bytes):>10} "
            f"{fmt_bytes(m.optimizer_bytes):>10} {fmt_bytes(m.buffers_bytes):>10} "
            f"{fmt_bytes(m.activations_bytes):>10}  {r.theory_bubble_fraction * 100:5.0f}% "
            f"{tail}  {comm}")
        if detail:
            lines += _detail(r)
    if top and len(p.rows) > top:
        lines.append(f"({len(p.rows) - top} more layouts not shown: --top)")
    lines.append("(mbs = sequences a microbatch on a data-parallel rank; memory per GPU, "
                 "the fullest pipeline rank, GiB = 2^30 bytes; comm = bytes each rank sends "
                 "per step, mean over ranks; bubble = the schedule's closed form; MFU against "
                 "the bf16 peak, fp8 TF/s the FLOP/s of the fp8 GEMMs)")
    if rng is not None:
        lines.append(f"(tok/s/GPU is a range for this MoE job, {rng.low_factor:.2f}–"
                     f"{rng.high_factor:.2f}× the predicted point: {rng.reason})")
    if band is not None and any(r.tie for r in p.rows):
        ties = sum(1 for r in p.rows if r.tie)
        lines.append(f"(± {band * 100:.0f}%: {p.uncertainty_source}; ≈ marks the {ties} "
                     f"layout{'s' if ties != 1 else ''} within it of the fastest that fits)")
    if detail and p.device is not None:
        lines.append(f"device {p.device.name}, every value and its source:")
        lines += [f"  {field}: {value}  [{source}]" for field, value, source in
                  p.device.values()]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _detail(r) -> list[str]:
    m = r.peak
    out = ["     memory: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in m.terms.items())
           + (f"; offloaded to the host {fmt_bytes(m.cpu_bytes)}" if m.cpu_bytes else "")]
    for t in r.transfers:
        out.append(f"     pp rank {t.pp_rank} {t.dim:<10} {t.op:<15} {t.count:>5} × "
                   f"{fmt_bytes(t.msg_bytes):>9} = {fmt_bytes(t.bytes):>9}  "
                   f"(sent {fmt_bytes(t.wire_bytes):>9})  {t.what}")
    est = r.estimate
    if est:
        exp = ", ".join(f"{d} {v / 1e3:.1f}" for d, v in est.exposed_comm_us.items())
        out.append(f"     step {est.step_time_us / 1e3:.1f} ms = compute "
                   f"{est.compute_us / 1e3:.1f} (optimizer {est.optimizer_us / 1e3:.1f}) + "
                   f"exposed [{exp or '-'}] + bubble {est.bubble_us / 1e3:.1f} + overhead "
                   f"{est.overhead_us / 1e3:.1f}")
        if est.terms:
            out.append("     terms: " + ", ".join(
                f"{k} {v / 1e3:.1f} ms" if k.endswith("_us") else f"{k} {v:.3f}"
                for k, v in est.terms.items())
                + (f"; {est.hw_tflops_per_gpu:.0f} TFLOP/s a GPU with recomputation"
                   if est.hw_tflops_per_gpu else ""))
    return out
