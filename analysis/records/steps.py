"""What the always-on step timers say (``steps/rank{R}.parquet``, every step of the run, not only
the profiled ones): the rank × step heatmap, the warm-up, the run's own step-to-step noise,
slow steps and throughput.

For step s let T(s) be its slowest rank's wall time (every rank waits for the slowest at the
step's collectives, so that is the step's time). ``slowest_rank_per_step(steps)`` is T, step →
µs: the one place it is computed — the heatmap's slow steps, throughput, the slow-step
finding's evidence and the planner's calibration (``meshscope/layouts/ranked.py``, which also
takes the largest optimizer phase per step through it) all read it.

- **Warm-up**: the first steps, until the step time settles — step k is warm-up while T(k) is
  more than ``WARMUP_FACTOR`` × the median of the steps after it (at most half the run; the
  first step pays the allocator, lazy initialisation and caches) — and any step the user names
  (``--warmup-steps N``: the first N). Warm-up steps are marked, never flagged slow, and left
  out of the noise, the medians and throughput.
- **Profiled steps** (run.json's ``profile_steps``) run under the profiler, which costs time of
  its own (most in the first of them): they are marked, and judged only among themselves.
- **Noise**: ``noise_us`` = 1.4826 × the median absolute deviation of T over the steps that are
  neither warm-up nor profiled (over all non-warm-up steps when fewer than three remain; NaN
  with fewer than three in all): the run's own step-to-step variation, which a finding's cost
  must beat to count.
- **Slow steps**: T(s) above median + ``SLOW_NOISE_FACTOR`` × noise and above
  ``SLOW_MIN_RATIO`` × the median of its kind of step (unprofiled steps against unprofiled,
  profiled against profiled; a step a few per cent slower is not worth a finding on a machine
  whose steps vary by that much).
- **Throughput** (one definition, also what ``meshscope run`` prints): per step,
  ``step_time_us`` = T(s), ``tokens_per_s`` = tokens per step (global batch × sequence length
  from run.json) / T(s), ``mfu_pct`` = FLOPs per token × tokens/s / (world size × the device's
  peak FLOP/s) × 100 (PaLM's model FLOPs utilisation; NaN where the peak is unknown, e.g. every
  CPU); ``loss`` the mean over the ranks that compute it; ``peak_memory_bytes`` the largest
  over ranks of the step timers' peak memory in the step (CUDA: peak allocated device memory;
  CPU: the process' peak resident set; null where the timers did not record it).

**Which steps a median of T is over.** T is reduced by a median in three places, over
different steps on purpose; each is named here once:

- ``StepRecords.median_step_us`` (``analyse``): the unprofiled non-warm-up steps (all the
  non-warm-up steps when there are none). It is the baseline slow steps are judged against
  (the slow-step finding's excess over it): the profiler's own cost must not move the
  baseline a slow step is measured from. (A finding's cost % is of the headline step time.)
- ``throughput_summary``'s ``step_time_us`` (summary.json's ``step_time_timer_us``, the
  headline's step timer) with tokens/s and MFU: every non-warm-up step, profiled ones
  included: the run's throughput as it ran (``throughput``, the per-step table it is the
  median of, is what ``meshscope run`` prints step by step); the median is robust to the few
  profiled steps' overhead, and a short run keeps enough steps.
- the planner's calibration (``layouts/ranked.measured``): the profiled steps only, because the
  compute and exposed communication it is calibrated with come from the breakdown, which only
  the profiled steps have: each figure from the same steps.

``step_heatmap`` columns: rank, step, wall_time_us, warmup, profiled, slow; ``heatmap_columns``
groups a long run's steps into at most ``MAX_HEATMAP_COLUMNS`` columns to show. ``StepRecords``
holds it with the warm-up and slow step lists, ``noise_us`` and ``median_step_us`` (the median
T of the unprofiled non-warm-up steps, or of all non-warm-up steps when there are none).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from meshscope.collectors.run_info import RunInfo

WARMUP_FACTOR = 1.25
SLOW_NOISE_FACTOR = 3.0
SLOW_MIN_RATIO = 1.10
HEATMAP_COLUMNS = ["rank", "step", "wall_time_us", "warmup", "profiled", "slow"]
THROUGHPUT_COLUMNS = ["step", "loss", "step_time_us", "tokens_per_s", "mfu_pct",
                      "peak_memory_bytes"]
HEATMAP_RUN_COLUMNS = ["rank", "column", "first_step", "last_step", "wall_time_us", "warmup",
                       "profiled", "slow"]
MAX_HEATMAP_COLUMNS = 200


@dataclasses.dataclass
class StepRecords:
    heatmap: pd.DataFrame
    warmup_steps: list[int]
    slow_steps: list[int]
    noise_us: float
    median_step_us: float


def slowest_rank_per_step(steps: pd.DataFrame, column: str = "wall_time_us") -> pd.Series:
    """T (module docstring): step → the largest ``column`` over the ranks in that step —
    for ``wall_time_us`` the slowest rank's wall time —, sorted by step; an empty float Series
    without step timers."""
    if steps.empty:
        return pd.Series(dtype=float, name=column)
    return steps.groupby("step")[column].max().sort_index()


def warmup_steps(step_time: pd.Series, named: int = 0) -> list[int]:
    """The leading steps until the step time settles (module docstring), and the first
    ``named``; ``step_time`` is T indexed by step."""
    steps = list(step_time.index)
    times = step_time.to_numpy(dtype=float)
    k = 0
    while k < len(steps) // 2 and k + 1 < len(steps):
        if times[k] > WARMUP_FACTOR * float(np.median(times[k + 1:])):
            k += 1
        else:
            break
    return sorted(set(steps[:k]) | set(steps[:max(named, 0)]))


#: The median absolute deviation times this is the standard deviation of normally spread
#: values (1/Φ⁻¹(3/4)): the robust noise of every figure meshscope gives one (step times, the
#: what-if's makespans, clock offsets, compare's quantities).
MAD_TO_SIGMA = 1.4826


def noise(times) -> float:
    """``MAD_TO_SIGMA`` × the median absolute deviation; NaN with fewer than three values."""
    t = np.asarray(list(times), dtype=float)
    t = t[np.isfinite(t)]
    if len(t) < 3:
        return math.nan
    return float(MAD_TO_SIGMA * np.median(np.abs(t - np.median(t))))


def _slow(times: pd.Series, sigma: float) -> list[int]:
    if len(times) < 3:
        return []
    med = float(times.median())
    limit = max(med + SLOW_NOISE_FACTOR * (sigma if sigma == sigma else 0.0),
                SLOW_MIN_RATIO * med)
    return sorted(int(s) for s in times[times > limit].index)


def analyse(steps: pd.DataFrame, named_warmup: int = 0,
            profiled: tuple[int, int] | None = None) -> StepRecords:
    """The records of the step timers ``steps`` (module docstring); ``profiled``: the run's
    profiled steps, inclusive (run.json's ``profile_steps``)."""
    if steps.empty:
        return StepRecords(pd.DataFrame(columns=HEATMAP_COLUMNS), [], [], math.nan, math.nan)
    worst = slowest_rank_per_step(steps)
    warm = warmup_steps(worst, named_warmup)
    rest = worst.drop(index=warm)
    in_window = rest.index.to_series().between(*profiled) if profiled else \
        pd.Series(False, index=rest.index)
    plain, traced = rest[~in_window.to_numpy()], rest[in_window.to_numpy()]
    basis = plain if len(plain) >= 3 else rest
    sigma = noise(basis)
    med = float(basis.median()) if len(basis) else math.nan
    slow = sorted(_slow(plain, sigma) + _slow(traced, sigma)) if len(plain) >= 3 else \
        _slow(rest, sigma)
    out = steps[["rank", "step", "wall_time_us"]].copy()
    out["warmup"] = out["step"].isin(warm)
    out["profiled"] = out["step"].between(*profiled) if profiled else False
    out["slow"] = out["step"].isin(slow)
    return StepRecords(out[HEATMAP_COLUMNS], [int(s) for s in warm], slow, sigma, med)


def _columns_of(special: list[bool], width: int) -> list[int]:
    """The column of each step (in order): a warm-up or profiled step alone, the others in runs
    of at most ``width`` consecutive steps."""
    out, column, run, prev_special = [], -1, 0, True
    for sp in special:
        if sp or prev_special or run == width:
            column, run = column + 1, 0
        out.append(column)
        run, prev_special = run + 1, sp
    return out


def heatmap_columns(heatmap: pd.DataFrame, max_columns: int = MAX_HEATMAP_COLUMNS
                    ) -> pd.DataFrame:
    """The step heatmap in at most ``max_columns`` columns of steps, for showing a run of
    thousands of steps: each warm-up and profiled step a column of its own, the steps between
    them in runs of equal length (the shortest that fit; more columns only when the warm-up
    and profiled steps alone are more); a run as short as ``max_columns`` keeps a column per
    step. One row per rank and column (``HEATMAP_RUN_COLUMNS``): column
    (0, 1, … in step order), first_step and last_step of its run (over every rank), wall_time_us
    — the rank's longest step of the run —, warmup, profiled, slow (some step of the run is)."""
    if heatmap.empty:
        return pd.DataFrame(columns=HEATMAP_RUN_COLUMNS)
    flags = heatmap.groupby("step")[["warmup", "profiled", "slow"]].any().sort_index()
    special = (flags["warmup"] | flags["profiled"]).tolist()
    ordinary = len(special) - sum(special)
    width = max(1, -(-ordinary // max(max_columns - sum(special), 1)))
    while True:
        column = _columns_of(special, width)
        if column[-1] < max_columns or width >= ordinary:
            break
        width += 1
    of_step = pd.Series(column, index=flags.index)
    bounds = of_step.index.to_series().groupby(of_step.to_numpy()).agg(["min", "max"])
    runs = heatmap.assign(column=heatmap["step"].map(of_step).to_numpy()).groupby(
        ["rank", "column"], sort=True).agg(
        wall_time_us=("wall_time_us", "max"), warmup=("warmup", "any"),
        profiled=("profiled", "any"), slow=("slow", "any")).reset_index()
    runs["first_step"] = runs["column"].map(bounds["min"]).astype(int)
    runs["last_step"] = runs["column"].map(bounds["max"]).astype(int)
    return runs[HEATMAP_RUN_COLUMNS]


def tokens_per_step(run: RunInfo | None) -> float | None:
    """Tokens the whole job processes per step, from run.json; None when it does not say."""
    if run is None:
        return None
    if run.global_batch and run.model.seq_len:
        return float(run.global_batch * run.model.seq_len)
    tokens = run.global_batch_tokens        # a Recorder's: positive, or None
    return float(tokens) if tokens else None


def throughput(steps: pd.DataFrame, run: RunInfo | None) -> pd.DataFrame:
    """Per step (module docstring); empty without step timers."""
    if steps.empty:
        return pd.DataFrame(columns=THROUGHPUT_COLUMNS)
    out = slowest_rank_per_step(steps).rename("step_time_us").reset_index()
    known = steps["loss"].notna().to_numpy()
    loss = steps["loss"][known].groupby(steps["step"][known]).mean()
    out["loss"] = out["step"].map(loss)
    tokens = tokens_per_step(run)
    out["tokens_per_s"] = tokens / (out["step_time_us"] / 1e6) if tokens else math.nan
    peak = run.device.peak_flops if run is not None else None
    flops = run.model.flops_per_token if run is not None else None
    out["mfu_pct"] = (flops * out["tokens_per_s"] / (run.world_size * peak) * 100
                      if peak and flops and tokens else math.nan)
    if "peak_memory_bytes" in steps and steps["peak_memory_bytes"].notna().any():
        out["peak_memory_bytes"] = out["step"].map(
            steps.groupby("step")["peak_memory_bytes"].max()).astype("Int64")
    else:
        out["peak_memory_bytes"] = pd.array([pd.NA] * len(out), dtype="Int64")
    return out[THROUGHPUT_COLUMNS]


def throughput_summary(table: pd.DataFrame, warm: list[int]) -> dict:
    """Medians over the non-warm-up steps: step_time_us, tokens_per_s, mfu_pct (None where
    unknown)."""
    rest = table[~table["step"].isin(warm)] if len(table) else table
    def med(col):
        v = rest[col].median() if len(rest) else math.nan
        return None if v != v else float(v)
    return {"step_time_us": med("step_time_us"), "tokens_per_s": med("tokens_per_s"),
            "mfu_pct": med("mfu_pct"), "steps": [int(s) for s in rest["step"]]
            if len(rest) else []}
