"""What every finding rule shares: the inputs a rule reads (``FindingInputs``), how a cost
becomes a severity and beats the noise, the timed finding's record (``timed``), the remedies by
dimension. ``findings.py`` (the cross-rank rules) and ``device_findings.py`` (one rank's own
time) both build on it; neither imports the other's rules for them.

Every finding cites the rows of the report's tables its numbers come from (``cite``: a
``model.Citation``), so that a reader can check it and the dashboard can link to the page,
rank and step that show them (issue 45).
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from meshscope.analysis.report.model import Citation, Finding
from meshscope.analysis.report.tables import COLUMNS
from meshscope.vocabulary import CommDim

REMEDIES: dict[CommDim, str] = {
    "pp": "more microbatches, or an interleaved / zero-bubble schedule",
    "tp": "sequence parallelism or asynchronous tensor parallelism, or a smaller tp degree",
    "dp": "a larger DDP bucket or a different ZeRO stage, and more compute to overlap with",
    "cp": "larger chunks per rank, or overlap the K/V exchange with more attention work",
    "ep": "capacity/load balancing of the router, or fewer expert-parallel ranks",
    "unknown": "find which process group it belongs to (record_param_comms, run.json, or "
               "`meshscope analyze --layout`)",
}
#: The dashboard page that shows a table's rows (``dashboard/state.PAGES``): a citation's page
#: unless it names another.
TABLE_PAGES = {
    "rank_waits": "stragglers", "step_heatmap": "stragglers", "collectives": "stragglers",
    "breakdown": "overview", "exposed_comm": "communication", "bandwidth": "communication",
    "flight_recorder": "health", "hang_causes": "health", "bubbles": "pipeline", "stage_imbalance": "pipeline",
    "idle": "gpu", "sync_calls": "gpu", "kernels": "gpu", "gemms": "gpu",
    "kernel_categories": "gpu", "memory_devices": "memory", "memory_steps": "memory",
    "memory_live": "memory", "memory_segments": "memory", "memory_snapshot_live": "memory",
}
#: The table name of a citation of summary.json: ``keys["field"]`` is the field's dotted path
#: (``stage_imbalance_without_straggler``, ``memory.snapshots``); the other keys pick the
#: entries of a list there.
SUMMARY = "summary"


def _plain(v):
    """A numpy scalar as the Python value JSON writes."""
    return v.item() if hasattr(v, "item") else v


def cite(table: str, rank=None, step=None, page: str | None = None, **keys) -> Citation:
    """The rows of ``table`` whose ``rank``, ``step`` (where given) and ``keys`` columns equal
    the values given — a ``Citation`` whose page is ``page``, else the table's
    (``TABLE_PAGES``). A table the registry lacks, or a rank, step or key column the table
    does not have, is a ``ValueError``: a finding cannot cite rows no reader can find."""
    if table == SUMMARY:
        if "field" not in keys or rank is not None or step is not None:
            raise ValueError("a summary citation names its field (keys['field']) only")
    else:
        cols = COLUMNS.get(table)
        if cols is None:
            raise ValueError(f"no report table {table!r} to cite")
        lacking = [c for c, v in (("rank", rank), ("step", step)) if v is not None
                   and c not in cols] + [k for k in keys if k not in cols]
        if lacking:
            raise ValueError(f"table {table!r} has no column {', '.join(lacking)}")
    return Citation(table, None if rank is None else int(rank),
                    None if step is None else int(step),
                    {k: _plain(v) for k, v in keys.items()},
                    page if page is not None else TABLE_PAGES.get(table))


NOISE_FACTOR = 3.0
MIN_COST_PCT = 1.0


@dataclasses.dataclass
class FindingInputs:
    step_us: float                        # the report's headline step time (cost % of it)
    noise_us: float                       # what a measured cost must beat: the larger of the
                                          # step noise over √(profiled steps) and the what-if
                                          # floor (analysis/crossrank/whatif.py); NaN unknown
    breakdown: pd.DataFrame
    bubbles: pd.DataFrame
    schedule: str | None
    stages: int
    microbatches: int
    virtual_stages: int
    straggler: dict | None                # whatif.WhatIf.straggler
    savings: pd.DataFrame                 # whatif.WhatIf.savings
    imbalance: dict | None                # whatif stage balance: saving_us, stage_work_us
    dim_savings: dict[str, float]         # dimension → what-if saving of its transfers
    hangs: pd.DataFrame | None
    slow_steps: list[int]
    warmup_steps: list[int]
    step_times: pd.Series                 # step → T(s) from the step timers
    median_step_us: float
    on_gpu: bool = False
    # dimension → {"transfer_us", "after_last_us", "ops_per_step"}: medians over its matched
    # operations (analysis/comm/matching.py)
    dim_timing: dict[str, dict] = dataclasses.field(default_factory=dict)
    # The per-rank tables the findings of one rank's own time read (device_findings.py):
    # the idle breakdown, synchronisations, kernels, GEMMs, matched collectives.
    idle: pd.DataFrame | None = None
    sync_calls: pd.DataFrame | None = None
    kernels: pd.DataFrame | None = None
    gemms: pd.DataFrame | None = None
    collectives: pd.DataFrame | None = None
    # The dimensions the cross-rank what-if replay covered (their operations matched across
    # ranks); None: all of them. Any other exposed dimension costs its exposed time
    # (device_findings._exposed_single).
    whatif_dims: set[str] | None = None
    # The memory findings (analysis/report/memory_findings.py), ranked into the list: near-oom
    # after a hang or desync, the others after the time findings.
    memory: list[Finding] = dataclasses.field(default_factory=list)
    # GPU traces: device time per kernel category (the GEMM verdict's coverage), and the CUDA
    # graphs the ranks capture and replay (``RankTimeline.graph_captures`` / ``_replays``).
    kernel_categories: pd.DataFrame | None = None
    graph_captures: int = 0
    graph_replays: int = 0
    # Why ranks stopped (``records/hang_causes.py``): the hang and desync findings' cause and
    # remedy; None or empty: the verdicts alone.
    hang_causes: pd.DataFrame | None = None


def severity(pct: float, cost_us: float, noise_us: float) -> str:
    sev = "high" if pct >= 10 else "medium" if pct >= 3 else "low"
    if noise_us == noise_us and cost_us < NOISE_FACTOR * noise_us:
        sev = "low"
    return sev


def beats_noise(cost_us: float, step_us: float, noise_us: float) -> bool:
    if not (cost_us == cost_us) or step_us <= 0:
        return False
    return cost_us >= MIN_COST_PCT / 100 * step_us and \
        (noise_us != noise_us or cost_us >= noise_us)


def timed(fid, dimension, cost_us, inp: FindingInputs, title, evidence, remedy, assumption,
          symptoms=(), measured: bool = True, cites=()) -> Finding:
    """A timed finding; ``measured`` False for a cost that is not measured but follows from the
    schedule's closed form (no noise to beat); ``cites``: the rows it rests on (``cite``)."""
    pct = 100 * cost_us / inp.step_us if inp.step_us else 0.0
    noise = inp.noise_us if measured else float("nan")
    return Finding(fid, severity(pct, cost_us, noise), dimension, float(cost_us),
                   float(pct), title, evidence, remedy,
                   {"step_time_us": float(inp.step_us - cost_us), "assumption": assumption},
                   list(symptoms), cites=list(cites))


def ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"
