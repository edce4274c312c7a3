"""Findings of memory: why a rank runs out, or would, and what to change.

They join the time findings in one ranked list (``findings.findings``): ``near-oom`` right
after a hang or desync (a job about to fail outranks one that is slow), the others after the
time findings, largest peak saving first. A memory finding has no time cost (``cost_us``
null); ``peak_saving_bytes`` is by how much its remedy would lower the peak where that can be
computed, and ``what_if.peak_bytes`` the peak it would leave. Severity: ``near-oom`` is high;
the others by the share they would save (``severity``) of the device's memory where it is known
(the trace's ``deviceProperties`` or ``--device-memory``), else of the peak, said in the
evidence (``severity_of``) — high ≥ 10%, medium ≥ 3%, low below — then moved by the run's
headroom where the device's memory is known (``severity_adjusted``): one level higher when its
peak leaves under ``TIGHT_HEADROOM`` (20%) of the device free, where any saving is what the
next batch size or sequence length needs; one level lower when it leaves over
``ROOMY_HEADROOM`` (50%) free, where saving memory buys nothing until the job grows.

Each is judged on ``memory_devices`` (one row per rank and device, ``analysis/memory/
rank_memory.py``), one device per rank (its ``main`` device: the accelerator with the largest
peak, else the CPU), and fires only where its stated threshold is passed:

- ``near-oom`` — the peak reserved (allocated where the allocator reserves nothing) within
  ``NEAR_OOM_MARGIN`` (10%) of the device's memory, when it is known — from the trace's
  ``deviceProperties`` or ``--device-memory`` — or a memory snapshot recorded an out-of-memory
  error. It must shed what lies above the margin; the remedy names what would: the memory
  held free in the allocator's segments (``expandable_segments``), the growth, the largest
  allocator.
- ``memory-imbalance`` — the peaks of the pipeline stages (each stage's largest rank), or of
  the ranks without a pipeline, differ: max/mean above ``IMBALANCE_RATIO`` (1.1) and by at
  least ``MIN_BYTES``. Under 1F1B the first stage holds the most activations (p microbatches
  in flight against the last stage's one). Saving: the largest peak down to the mean.
- ``memory-growth`` — a device ends every profiled step higher than the step before (at least
  two steps after the first) by a mean of at least ``MIN_GROWTH_BYTES`` and 0.5% of its peak:
  something keeps memory from every step (a leak: tensors appended to a list, a graph kept
  alive by a loss accumulated without ``.item()``/``.detach()``). Saving: what it added over
  the profiled steps; the evidence says how many more steps the device lasts at that rate,
  where its memory is known.
- ``memory-fragmentation`` — at the allocated peak, reserved − allocated (memory the caching
  allocator holds in segments but no tensor uses) is at least ``FRAGMENTATION_SHARE`` (25%)
  of the reserved and at least ``MIN_FRAGMENTATION_BYTES``; remedy
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, which lowers the peak reserved by up to
  that much.
- ``largest-allocator`` — on the rank with the largest peak, one (operator, module, range,
  phase) group holds at least ``LARGEST_SHARE`` (25%) of the peak, and ``MIN_LARGEST_BYTES``
  (1 MiB), in blocks live at it (``memory_live``), or the memory live at it that was allocated
  before the trace began (not on a run that leaves over ``ROOMY_HEADROOM`` of its device free:
  sharding the model's state trades communication for memory the run does not need). The
  remedy is by what made the memory (``remedy_of``), each with the saving of a stated model (``evidence.remedy_model``): attention scores (a batched matmul or
  softmax) → fused attention, which never materialises them (saves all of it); activations of
  the forward → recomputation or a smaller microbatch (halving it saves half); gradients (the
  backward) → ZeRO-2/FSDP over the data-parallel ranks (keeps 1/N); optimizer state → ZeRO-1
  (keeps 1/N), else CPU offload; the model's state held from before the trace (weights, and
  the optimizer state and gradients kept between steps) → FSDP/ZeRO-3 (keeps 1/N), else bf16
  (half of fp32); a tensor made in the step itself, outside forward, backward and optimizer →
  how to name it (``with_stack=True``, a memory snapshot's frames), no saving claimed. N is the
  run's data-parallel size (run.json), else the trace's world size (every rank a replica,
  stated). ``peak_saving_bytes`` is the modelled saving; with no model, the group's bytes (at
  most what freeing it saves).

Each cites its rows (``finding_rules.cite``): the ``memory_devices`` row of the rank and
device it names (``near-oom`` first its ``memory_steps`` row of the peak's step, growth that
device's ``memory_steps``, the largest allocator its ``memory_live`` rows); an out-of-memory
error of a snapshot its entry of summary.json's ``memory.snapshots``.
"""
from __future__ import annotations

import dataclasses
import math
import re

import pandas as pd

from meshscope.analysis.memory.gather import main_devices
from meshscope.analysis.memory.live import BEFORE_TRACE
from meshscope.analysis.report.finding_rules import cite
from meshscope.analysis.report.model import Finding, human_bytes

NEAR_OOM_MARGIN = 0.10
IMBALANCE_RATIO = 1.10
MIN_BYTES = 1 << 20
MIN_GROWTH_BYTES = 1 << 20
GROWTH_SHARE = 0.005
FRAGMENTATION_SHARE = 0.25
MIN_FRAGMENTATION_BYTES = 64 << 20
LARGEST_SHARE = 0.25
MIN_LARGEST_BYTES = 1 << 20
TIGHT_HEADROOM = 0.20
ROOMY_HEADROOM = 0.50
LEVELS = ("low", "medium", "high")


def _num(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


@dataclasses.dataclass(frozen=True)
class Severity:
    """A finding's severity, what it was judged against and how the run's headroom moved it
    (module docstring)."""
    level: str
    of: str                       # "the device's memory" or "the peak (…)"
    headroom_bytes: float | None  # the device's memory less the peak, where known
    adjusted: str | None          # why the headroom moved the level, if it did


def severity(saving: float, peak: float, device_total: float | None) -> Severity:
    """The severity of saving ``saving`` bytes on a device whose peak is ``peak`` (module
    docstring): by its share of the device's memory where known, else of the peak; one level
    higher when the peak leaves less than ``TIGHT_HEADROOM`` of the device free, one lower
    when it leaves more than ``ROOMY_HEADROOM``."""
    basis = device_total if device_total else peak
    share = saving / basis if basis else 0.0
    level = 2 if share >= 0.10 else 1 if share >= 0.03 else 0
    if not device_total:
        return Severity(LEVELS[level], "the peak (the device's memory is not known)", None,
                        None)
    headroom = device_total - peak
    adjusted = None
    if headroom < TIGHT_HEADROOM * device_total and level < 2:
        level, adjusted = level + 1, (f"one level up: the run leaves under "
                                      f"{TIGHT_HEADROOM:.0%} of the device free")
    elif headroom > ROOMY_HEADROOM * device_total and level > 0:
        level, adjusted = level - 1, (f"one level down: the run leaves over "
                                      f"{ROOMY_HEADROOM:.0%} of the device free")
    return Severity(LEVELS[level], "the device's memory", headroom, adjusted)


def _finding(fid, dim, title, evidence, remedy, saving, peak, assumption, level=None,
             cites=(), device_total=None):
    """A memory finding; its severity ``level`` as given (``near-oom``: high), else judged by
    ``severity`` on ``saving``, with what it was judged against in the evidence."""
    if level is None:
        judged = severity(saving or 0.0, peak, device_total)
        level = judged.level
        evidence = {**evidence, "severity_of": judged.of,
                    "headroom_bytes": judged.headroom_bytes,
                    "severity_adjusted": judged.adjusted}
    return Finding(fid, level, dim, None, None, title,
                   evidence, remedy, {"peak_bytes": peak - saving if saving is not None
                                      else None, "assumption": assumption},
                   peak_saving_bytes=float(saving) if saving is not None else None,
                   cites=list(cites))


def _device(row) -> list:
    """The citation of a ``memory_devices`` row (its rank and device)."""
    return [cite("memory_devices", rank=row["rank"], device=str(row["device"]))]


def _peak_of(row) -> float:
    """The peak that counts against the device: reserved where the allocator reserves, else
    allocated."""
    res = _num(row.get("peak_reserved_bytes"))
    return res if res is not None else float(row["peak_allocated_bytes"])


def near_oom(main: pd.DataFrame, snapshots: list[dict], live: pd.DataFrame,
             replicas: int | None = None) -> Finding | None:
    worst, worst_share = None, 0.0
    for _, row in main.iterrows():
        total = _num(row.get("device_total_bytes"))
        if not total:
            continue
        share = _peak_of(row) / total
        if share >= 1 - NEAR_OOM_MARGIN and share > worst_share:
            worst, worst_share = row, share
    oom = next((s for s in snapshots if s.get("oom")), None)
    if worst is None and oom is None:
        return None
    if worst is not None:
        total = float(worst["device_total_bytes"])
        peak = _peak_of(worst)
        shed = peak - (1 - NEAR_OOM_MARGIN) * total
        frag = _num(worst.get("fragmentation_bytes")) or 0.0
        growth = _num(worst.get("growth_per_step_bytes"))
        options = []
        if frag > 0:
            options.append(f"expandable_segments would return up to {human_bytes(frag)} held "
                           f"free in the allocator's segments")
        if worst.get("growth_monotone") and growth:
            options.append(f"the memory growing {human_bytes(growth)} a step (a leak)")
        top = _top_live(live, int(worst["rank"]), str(worst["device"]))
        if top is not None:
            options.append(f"the largest allocator, {_what(top)}, holds "
                           f"{human_bytes(top['bytes'])}: {remedy_of(top, replicas).text}")
        title = (f"Rank {int(worst['rank'])} peaks at {human_bytes(peak)} of its "
                 f"{human_bytes(total)} {worst['device']} ({worst_share:.0%}): within "
                 f"{NEAR_OOM_MARGIN:.0%} of running out")
        step = _num(worst.get("peak_step"))     # None where no step held the peak
        evidence = {"rank": int(worst["rank"]), "device": worst["device"], "peak_bytes": peak,
                    "device_total_bytes": total, "share": worst_share,
                    "margin": NEAR_OOM_MARGIN, "to_shed_bytes": shed,
                    "device_total_source": worst.get("device_total_source"),
                    "peak_step": None if step is None else int(step),
                    "peak_op": worst.get("peak_op")}
        remedy = ("lower the peak by at least " + human_bytes(shed) + ": "
                  + ("; ".join(options) if options else
                     "activation recomputation, a ZeRO/FSDP stage that shards more, or a "
                     "smaller microbatch"))
        saving = max(shed, 0.0)
        cites = [cite("memory_steps", rank=worst["rank"], step=worst["peak_step"],
                      device=str(worst["device"]))] if step is not None else []
        cites += _device(worst)
    else:
        o = oom["oom"]
        peak = float(o.get("reserved_bytes") or 0)
        title = (f"Rank {oom['rank']} ran out of memory on {oom['device']}: it asked for "
                 f"{human_bytes(o.get('requested_bytes'))} with "
                 f"{human_bytes(o.get('device_free_bytes'))} free "
                 f"({human_bytes(o.get('allocated_bytes'))} allocated, "
                 f"{human_bytes(o.get('reserved_bytes'))} reserved; snapshot {oom['source']})")
        evidence = {"rank": oom["rank"], "device": oom["device"], "snapshot": oom["source"],
                    **o}
        if o.get("explained"):          # analysis/memory/oom.py: what was held, what fits
            title += f": {o['explained'].split('; it fits if')[0]}"
        remedy = ("; or ".join(o["fits_if"]) if o.get("fits_if") else
                  "free what the snapshot's live blocks show at the largest moment "
                  "(memory_snapshot_live), or activation recomputation, a ZeRO/FSDP stage that "
                  "shards more, a smaller microbatch; expandable_segments when reserved is "
                  "well above allocated")
        saving = None
        cites = [cite("summary", page="memory", field="memory.snapshots",
                      source=oom["source"])]
    return _finding("near-oom", "all", title, evidence, remedy, saving, peak,
                    f"the peak {NEAR_OOM_MARGIN:.0%} below the device's memory",
                    level="high", cites=cites)


def imbalance(main: pd.DataFrame, stage_of: dict[int, int]) -> Finding | None:
    if len(main) < 2:
        return None
    peaks = main.set_index("rank")["peak_allocated_bytes"].astype(float)
    staged = {r: stage_of[r] for r in peaks.index if r in stage_of}
    if len(set(staged.values())) > 1:
        by = peaks[list(staged)].groupby(pd.Series(staged)).max()
        unit, dim = "stage", "pp"
    else:
        by, unit, dim = peaks, "rank", "all"
    holders = main[main["rank"] == by.idxmax()] if unit == "rank" else \
        main[main["rank"].isin([r for r, s in staged.items() if s == by.idxmax()])]
    mean = float(by.mean())
    top = by.idxmax()
    ratio = float(by.max()) / mean if mean else 1.0
    if ratio <= IMBALANCE_RATIO or float(by.max()) - mean < MIN_BYTES:
        return None
    saving = float(by.max()) - mean
    largest_row = holders.sort_values("peak_allocated_bytes", ascending=False).iloc[0]
    per = {str(int(k)): float(v) for k, v in by.items()}
    title = (f"{unit.capitalize()} {int(top)} holds the most memory: its peak "
             f"{human_bytes(by.max())} is {ratio:.2f}× the mean of the {unit}s "
             f"({human_bytes(mean)})")
    if unit == "stage" and int(top) == min(by.index):
        remedy = (f"move layers off stage {int(top)} (--stage-layers), or recompute its "
                  f"activations: under 1F1B the first stage holds the most microbatches in "
                  f"flight (p against the last stage's one); an interleaved schedule "
                  f"spreads them")
    elif unit == "stage":
        remedy = (f"move layers off stage {int(top)} (--stage-layers), or recompute its "
                  f"activations; see what it holds at its peak (memory_live): the last stage "
                  f"also holds the logits and the loss")
    else:
        remedy = (f"see what rank {int(top)} holds that the others do not (memory_live): "
                  f"uneven data, a rank-0-only buffer, an unsharded state")
    return _finding("memory-imbalance", dim, title,
                    {"by": unit, f"peak_bytes_per_{unit}": per, "largest": int(top),
                     "max_over_mean": ratio, "mean_bytes": mean}, remedy, saving,
                    float(by.max()), f"the largest {unit}'s peak at the mean",
                    cites=[*_device(largest_row), cite("memory_devices")],
                    device_total=_num(largest_row.get("device_total_bytes")))


def growth(main: pd.DataFrame) -> Finding | None:
    found = []
    for _, row in main.iterrows():
        g = _num(row.get("growth_per_step_bytes"))
        steps = int(row.get("growth_steps") or 0)
        peak = float(row["peak_allocated_bytes"])
        if not (row.get("growth_monotone") and g and steps >= 2):
            continue
        if g < MIN_GROWTH_BYTES or g < GROWTH_SHARE * peak:
            continue
        found.append((g, row))
    if not found:
        return None
    g, row = max(found, key=lambda x: x[0])
    steps = int(row["growth_steps"])
    saving = g * steps
    peak = float(row["peak_allocated_bytes"])
    ranks = sorted(int(r["rank"]) for _, r in found)
    evidence = {"ranks": ranks, "rank": int(row["rank"]), "device": row["device"],
                "growth_per_step_bytes": g, "steps": steps + 1, "peak_bytes": peak}
    total = _num(row.get("device_total_bytes"))
    tail = ""
    if total:
        left = (total - _peak_of(row)) / g
        evidence["steps_until_full"] = left
        tail = f"; at this rate its {human_bytes(total)} are full in {left:,.0f} more steps"
    title = (f"Memory grows on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}: "
             f"rank {int(row['rank'])}'s {row['device']} ends each step "
             f"{human_bytes(g)} higher than the one before, over {steps + 1} profiled "
             f"steps{tail}")
    return _finding("memory-growth", "all", title, evidence,
                    "find what each step keeps (tensors appended to a list, a loss accumulated "
                    "without .item() or .detach() keeping its graph, a cache that never "
                    "evicts); the growing operator is in memory_live at the last peak",
                    saving, peak, "no growth across the profiled steps",
                    cites=[*_device(row), cite("memory_steps", rank=row["rank"],
                                               device=str(row["device"]))],
                    device_total=total)


def fragmentation(main: pd.DataFrame) -> Finding | None:
    best = None
    for _, row in main.iterrows():
        frag = _num(row.get("fragmentation_bytes"))
        res = _num(row.get("reserved_at_peak_bytes"))
        if not frag or not res:
            continue
        share = frag / res
        if share >= FRAGMENTATION_SHARE and frag >= MIN_FRAGMENTATION_BYTES and \
                (best is None or frag > best[0]):
            best = (frag, share, row)
    if best is None:
        return None
    frag, share, row = best
    title = (f"Rank {int(row['rank'])}'s allocator holds {human_bytes(frag)} free in its "
             f"segments at the peak ({share:.0%} of the {human_bytes(row['reserved_at_peak_bytes'])} "
             f"reserved): fragmentation")
    return _finding("memory-fragmentation", "all", title,
                    {"rank": int(row["rank"]), "device": row["device"],
                     "fragmentation_bytes": frag, "share": share,
                     "reserved_at_peak_bytes": float(row["reserved_at_peak_bytes"]),
                     "peak_allocated_bytes": float(row["peak_allocated_bytes"]),
                     "threshold_share": FRAGMENTATION_SHARE},
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place "
                    "instead of new ones being cut); or allocate the largest buffers first and "
                    "keep their sizes fixed", frag, float(row["reserved_at_peak_bytes"]),
                    "the allocator holds no free memory at the peak", cites=_device(row),
                    device_total=_num(row.get("device_total_bytes")))


def _text(v) -> str:
    """A cell as text: empty for None, NaN and pandas' missing values."""
    return "" if v is None or v is pd.NA or (isinstance(v, float) and v != v) else str(v)


def _what(row) -> str:
    if row["operator"] == BEFORE_TRACE:
        return "memory allocated before the trace began"
    parts = [str(row["operator"])]
    if _text(row.get("module")):
        parts.append(f"in {_text(row['module'])}")
    if _text(row.get("annotation")):
        parts.append(f"under {_text(row['annotation'])}")
    if _text(row.get("phase")):
        parts.append(f"({_text(row['phase'])})")
    return " ".join(parts)


#: The operators that, holding a large block in a transformer, hold the attention scores
#: unfused attention materialises ([batch × heads, seq, seq]): the batched matmuls around the
#: softmax, and the softmax itself (and its backward).
ATTENTION_SCORE_OPS = re.compile(r"^aten::(?:bmm|baddbmm|_?softmax|_softmax_backward_data|"
                                 r"_?masked_softmax)$")


@dataclasses.dataclass(frozen=True)
class Remedy:
    """What made a group of live memory, what an engineer changes about it, and the bytes
    that change saves under a stated model (None: no model — the trace does not say what the
    memory is)."""
    made_by: str
    text: str
    saving_bytes: float | None
    model: str


def _sharded(nbytes: float, replicas: int | None, what: str, stage: str) -> tuple[float, str]:
    """The saving of sharding ``nbytes`` over the data-parallel ranks, and its model."""
    n = replicas or 1
    return nbytes * (1 - 1 / n), (f"{stage} over the {n} data-parallel ranks keeps 1/{n} of "
                                  f"the {what} on each")


def remedy_of(row, replicas: int | None = None) -> Remedy:
    """The remedy of the memory a ``memory_live`` group holds, by what made it (module
    docstring); ``replicas`` is the number of data-parallel ranks it could be sharded over."""
    nbytes = float(row["bytes"])
    op = str(row["operator"])
    ph = _text(row.get("phase"))
    many = bool(replicas and replicas > 1)
    if op == BEFORE_TRACE:
        if many:
            saving, model = _sharded(nbytes, replicas, "model's state", "FSDP (ZeRO-3)")
        else:
            saving, model = nbytes / 2, "held in fp32, bf16 halves the state"
        return Remedy(
            "the model's state", "the model's state held from before the trace (its weights; "
            "in training also the optimizer state and gradients kept between steps): shard it "
            "— FSDP "
            "(ZeRO-3) over the data-parallel ranks, tensor or pipeline parallelism for the "
            "weights —, keep it in lower precision (bf16 weights, an 8-bit optimizer), or "
            f"offload the optimizer state to the CPU — saves {human_bytes(saving)} ({model})",
            saving, model)
    if ATTENTION_SCORE_OPS.match(op):
        return Remedy(
            "attention scores",
            f"attention scores, most likely (unfused attention materialises them, [batch × "
            f"heads, seq, seq], through {op}): fused attention — torch.nn.functional."
            f"scaled_dot_product_attention with the flash or memory-efficient kernel — never "
            f"keeps them, freeing these {human_bytes(nbytes)}", nbytes,
            "fused attention never materialises the scores")
    if ph == "optimizer":
        if many:
            saving, model = _sharded(nbytes, replicas, "optimizer state", "ZeRO-1")
            text = ("optimizer state: shard it over the data-parallel ranks (ZeRO-1, or "
                    "FSDP)")
        else:
            saving, model = nbytes, "offloaded to the CPU, none of it stays on the device"
            text = "optimizer state: offload it to the CPU, or use an 8-bit optimizer"
        return Remedy("optimizer state", f"{text} — saves {human_bytes(saving)} ({model})",
                      saving, model)
    if ph == "backward":
        if many:
            saving, model = _sharded(nbytes, replicas, "gradients", "ZeRO-2 or FSDP")
            text = "gradients: shard them over the data-parallel ranks (ZeRO-2, FSDP)"
        else:
            saving, model = nbytes, "each gradient freed once its parameter is updated"
            text = ("gradients: apply the optimizer in the backward (per-parameter "
                    "post-accumulate-grad hooks) so each gradient is freed once used")
        return Remedy("gradients", f"{text} — saves {human_bytes(saving)} ({model})",
                      saving, model)
    if ph == "forward":
        saving, model = nbytes / 2, "halving the microbatch halves the activations"
        return Remedy(
            "activations", "activations kept for the backward: activation recomputation "
            "(torch.utils.checkpoint; full recomputation keeps only each block's input), a "
            "smaller microbatch, or sequence/context parallelism to split the sequence — "
            f"halving the microbatch saves {human_bytes(saving)}", saving, model)
    return Remedy(
        "unknown", f"made by {op} in the step itself, outside the model's forward, backward "
        "and the optimizer (no module or range covers it): the batch, a buffer, a workspace or "
        "a cache. The trace does not say which: profile with with_stack=True (the Python line "
        "that made it) or take a memory snapshot (torch.cuda.memory._record_memory_history) "
        "whose frames name it; then make it once before the loop and reuse it, or free it "
        "after its last use", None, "none: what the memory is is not in the trace")


def _top_live(live: pd.DataFrame, rank: int, device: str):
    if live is None or live.empty:
        return None
    mine = live[(live["rank"] == rank) & (live["device"] == device)
                & (live["operator"] != "(other)")]
    if mine.empty:
        return None
    return mine.sort_values("bytes", ascending=False).iloc[0]


def largest(main: pd.DataFrame, live: pd.DataFrame, replicas: int | None = None
            ) -> Finding | None:
    if main.empty:
        return None
    row = main.sort_values("peak_allocated_bytes", ascending=False).iloc[0]
    top = _top_live(live, int(row["rank"]), str(row["device"]))
    peak = float(row["peak_allocated_bytes"])
    if top is None or not peak or float(top["bytes"]) < LARGEST_SHARE * peak or \
            float(top["bytes"]) < MIN_LARGEST_BYTES:
        return None
    share = float(top["bytes"]) / peak
    total = _num(row.get("device_total_bytes"))
    if top["operator"] == BEFORE_TRACE and total and total - peak > ROOMY_HEADROOM * total:
        return None     # the model's state, on a run that leaves most of its device free
    what = "Memory allocated before the trace began" if top["operator"] == BEFORE_TRACE \
        else _what(top)
    title = (f"{what} holds {human_bytes(top['bytes'])} ({share:.0%}) "
             f"of rank {int(row['rank'])}'s {human_bytes(peak)} peak on {row['device']}")
    fix = remedy_of(top, replicas)
    saving = fix.saving_bytes if fix.saving_bytes is not None else float(top["bytes"])
    return _finding("largest-allocator", "all", title,
                    {"rank": int(row["rank"]), "device": row["device"], "step": int(top["step"]),
                     "operator": top["operator"], "module": top.get("module"),
                     "annotation": top.get("annotation"), "phase": top.get("phase"),
                     "bytes": float(top["bytes"]), "blocks": _num(top.get("blocks")),
                     "share": share, "peak_bytes": peak, "made_by": fix.made_by,
                     "remedy_model": fix.model, "data_parallel_ranks": replicas},
                    fix.text, saving, peak,
                    "none of these blocks live at the peak" if fix.saving_bytes is None
                    else fix.model,
                    cites=[cite("memory_live", rank=row["rank"], step=top["step"],
                                device=str(row["device"]), operator=top["operator"]),
                           *_device(row)],
                    device_total=total)


def memory_findings(devices: pd.DataFrame, live: pd.DataFrame, snapshots: list[dict],
                    stage_of: dict[int, int], *, replicas: int | None = None) -> list[Finding]:
    """Every memory finding (module docstring), ``near-oom`` first, then by peak saving. A
    growing rank explains what its growth causes: an imbalance whose largest stage or rank
    holds it, and a largest allocator on it, are symptoms of ``memory-growth``, not findings
    of their own."""
    main = main_devices(devices)
    out = []
    if not main.empty or snapshots:
        f = near_oom(main, snapshots, live, replicas)
        if f:
            out.append(f)
    if main.empty:
        return out
    grow = growth(main)
    rest = [f for f in (fragmentation(main),) if f is not None]
    imb, big = imbalance(main, stage_of), largest(main, live, replicas)
    if grow is not None:
        rest.append(grow)
        growing = set(grow.evidence["ranks"])
        if imb is not None:
            holders = {imb.evidence["largest"]} if imb.evidence["by"] == "rank" else \
                {r for r, s in stage_of.items() if s == imb.evidence["largest"]}
            if holders & growing:
                grow.symptoms.append(imb.title)
                imb = None
        if big is not None and big.evidence["rank"] in growing:
            grow.symptoms.append(big.title)
            big = None
    rest += [f for f in (imb, big) if f is not None]
    rest.sort(key=lambda f: -(f.peak_saving_bytes or 0.0))
    return out + rest
