"""One rank's timeline as interval sets: compute C, communication M, other device work O, the
step windows, the pipeline windows and the microbatch spans.

On GPU traces the lanes are the device streams: C and M are the unions of compute and
communication kernels, O of memcpy/memset. On CPU-only traces the lanes are the threads, and
a thread's time belongs to the innermost range covering it (``intervals.innermost``): it
computes where that is a ``cpu_op`` and communicates where it is a communication range
(``gloo:*``, ``c10d::*``). So a backward op that encloses a blocking all-reduce does not count
the wait as compute, and an asynchronous ``gloo:send`` that stays open on the main thread while
the next forward runs does not hide that forward's compute. The runner's microbatch and
optimizer ranges (``meshscope/forward …``, ``meshscope/optimizer``) count as compute too, so the
Python that dispatches a stage's operators is the stage's work, not idle time or bubble. M is
the union of all communication ranges (in flight, whether or not the thread waits on them).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from meshscope.collectors import annotations

from meshscope.analysis.ingest import classify
from meshscope.analysis.timeline import intervals as iv
from meshscope.analysis.ingest.events import RankTrace


@dataclasses.dataclass
class RankTimeline:
    rank: int
    on_gpu: bool
    compute: np.ndarray
    comm: np.ndarray
    comm_by_dim: dict[str, np.ndarray]
    other: np.ndarray
    steps: dict[int, tuple[float, float]]
    pipeline: np.ndarray
    microbatches: pd.DataFrame
    span: tuple[float, float]
    # ``meshscope/comm dim=D`` ranges: starts, ends (sorted by start) and their dimensions.
    scopes: tuple[np.ndarray, np.ndarray, list[str]]
    # The whole-trace selection HTA's get_comm_comp_overlap uses (see ``_complete_steps``).
    trace_compute: np.ndarray
    trace_comm: np.ndarray


def _is_work_annotation(name: str) -> bool:
    """Microbatch and optimizer ranges: on a CPU the host time inside them is the stage's
    work (operators and the Python that dispatches them), except where communication is
    innermost."""
    return name == annotations.OPTIMIZER or annotations.parse_microbatch(name) is not None


def _iv(df: pd.DataFrame) -> np.ndarray:
    return iv.union(df["ts_us"].to_numpy(), df["end_us"].to_numpy())


def kernel_group_desc(dev_comm: pd.DataFrame, host: pd.DataFrame) -> pd.Series:
    """For each GPU communication kernel, the process-group description of the
    ``record_param_comms`` call that launched it (the call whose range on the launching thread
    holds the runtime launch with the kernel's correlation id); NaN where unknown."""
    out = pd.Series(np.nan, index=dev_comm.index, dtype=object)
    if dev_comm.empty:
        return out
    calls = host[(host["name"] == "record_param_comms") & host["pg_desc"].notna()]
    launches = host[(host["correlation"] >= 0)
                    & host["cat"].isin(["cuda_runtime", "cuda_driver"])]
    if calls.empty or launches.empty:
        return out
    launch = launches.drop_duplicates("correlation").set_index("correlation")
    by_lane = {lane: (g["ts_us"].to_numpy(), g["end_us"].to_numpy(), g["pg_desc"].to_numpy())
               for lane, g in calls.sort_values("ts_us").groupby("lane")}
    for idx, corr in zip(dev_comm.index, dev_comm["correlation"]):
        if corr not in launch.index:
            continue
        ts, lane = launch.at[corr, "ts_us"], launch.at[corr, "lane"]
        if lane not in by_lane:
            continue
        starts, ends, descs = by_lane[lane]
        i = int(np.searchsorted(starts, ts, side="right")) - 1
        if i >= 0 and ends[i] >= ts:
            out.at[idx] = descs[i]
    return out


def comm_dimension(name: str, run: dict | None, scope: str | None = None) -> str:
    """The parallel dimension of a communication event without a ``mesh_<dim>`` group
    description (GPU kernels get theirs from ``kernel_group_desc``).

    gloo ranges carry no process group. A ``meshscope/comm dim=D`` range around the event
    (``scope``) says D; otherwise the dimension follows from the operation and the run's
    layout: send/recv belong to pipeline parallelism; a collective belongs to the one other
    dimension of size > 1, when there is exactly one; otherwise it is ``unknown``.
    """
    if scope:
        return scope
    if run is None:
        return "unknown"
    sizes = run.get("layout", {})
    if classify.is_p2p(name):
        return "pp" if sizes.get("pp", 1) > 1 else "unknown"
    others = [d for d, n in sizes.items() if n > 1 and d != "pp"]
    return others[0] if len(others) == 1 else "unknown"


def _step_windows(host: pd.DataFrame, device: pd.DataFrame) -> dict[int, tuple[float, float]]:
    steps = host[host["cat"].isin(["user_annotation", "cpu_op"])
                 & host["name"].str.startswith("ProfilerStep#")]
    out: dict[int, tuple[float, float]] = {}
    for name, ts, end in zip(steps["name"], steps["ts_us"], steps["end_us"]):
        m = annotations.STEP_RE.match(name)
        if m:
            out[int(m["step"])] = (float(ts), float(end))
    if device.empty or not out:
        return out
    # On a GPU the kernels of a step run after their launch: a step's device window runs to
    # the next step's start, and the last one to the end of the last kernel.
    keys = sorted(out)
    last_dev_end = float(device["end_us"].max())
    for i, k in enumerate(keys):
        start, end = out[k]
        end = out[keys[i + 1]][0] if i + 1 < len(keys) else max(end, last_dev_end)
        out[k] = (start, end)
    return out


def _scopes(host: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list[str]]:
    ann = host[host["name"].str.startswith(annotations.PREFIX + "comm ")].sort_values("ts_us")
    dims = [annotations.COMM_SCOPE_RE.match(n) for n in ann["name"]]
    keep = np.array([m is not None for m in dims], dtype=bool)
    ann = ann[keep]
    return (ann["ts_us"].to_numpy(), ann["end_us"].to_numpy(),
            [m["dim"] for m in dims if m is not None])


def scope_at(scopes: tuple[np.ndarray, np.ndarray, list[str]], ts: float) -> str | None:
    """The dimension of the latest-started ``meshscope/comm`` range containing time ``ts``
    (ranges are short and rarely nested, so only the last few starting before ``ts`` are
    looked at)."""
    starts, ends, dims = scopes
    i = int(np.searchsorted(starts, ts, side="right")) - 1
    for j in range(i, max(i - 8, -1), -1):
        if ends[j] >= ts:
            return dims[j]
    return None


def _microbatches(host: pd.DataFrame) -> pd.DataFrame:
    ann = host[host["name"].str.startswith(annotations.PREFIX)]
    rows = []
    for name, ts, end in zip(ann["name"], ann["ts_us"], ann["end_us"]):
        parsed = annotations.parse_microbatch(name)
        if parsed:
            rows.append({**parsed, "ts_us": ts, "end_us": end})
    return pd.DataFrame(rows, columns=["phase", "stage", "chunk", "mb", "ts_us", "end_us"])


def _complete_steps(dev: pd.DataFrame, host: pd.DataFrame,
                    steps: dict[int, tuple[float, float]]) -> pd.DataFrame:
    """GPU events launched before the last profiled step began.

    The last step's kernels can be cut off when the profiler stops, so whole-trace figures
    leave it out, as HTA does (its ``include_last_profiler_step=False`` default): a kernel is
    kept when the runtime call that launched it (joined by ``correlation``) started before the
    last ``ProfilerStep#N`` did. With fewer than two steps, or no launch records, all are kept.
    """
    if len(steps) < 2:
        return dev
    last_start = max(s for s, _ in steps.values())
    launches = host[(host["correlation"] >= 0)
                    & host["cat"].isin(["cuda_runtime", "cuda_driver", "cpu_op"])]
    if launches.empty:
        return dev
    launch_ts = launches.drop_duplicates("correlation").set_index("correlation")["ts_us"]
    ts = dev["correlation"].map(launch_ts)
    return dev[ts.notna() & (ts < last_start)]


def build(trace: RankTrace, run: dict | None = None) -> RankTimeline:
    ev = trace.events
    dev = ev[ev["device"]]
    host = ev[~ev["device"]]
    if not dev.empty:
        compute = _iv(dev[dev["kind"] == classify.COMPUTE])
        comm_ev = dev[dev["kind"] == classify.COMMUNICATION]
        other = _iv(dev[dev["kind"] == classify.MEMORY])
    else:
        comm_ev = host[host["kind"] == classify.COMMUNICATION]
        per_lane = []
        kind = host["kind"].where(~host["name"].map(_is_work_annotation), classify.COMPUTE)
        work = host.assign(kind=kind)
        work = work[work["kind"].isin([classify.COMPUTE, classify.COMMUNICATION])]
        for _, g in work.groupby("lane", sort=False):
            owned = iv.innermost(g["ts_us"].to_numpy(), g["end_us"].to_numpy(), g["kind"])
            per_lane.append(owned.get(classify.COMPUTE, iv.EMPTY))
        compute = iv.merge(*per_lane) if per_lane else iv.EMPTY.copy()
        other = iv.EMPTY.copy()
    comm = _iv(comm_ev)
    scopes = _scopes(host)
    # A DeviceMesh names its groups mesh_<dim>: on GPU traces that description, found through
    # the kernel's launch, names the dimension directly.
    descs = kernel_group_desc(comm_ev, host) if not dev.empty else \
        pd.Series(np.nan, index=comm_ev.index, dtype=object)
    dims = pd.Series([d[len("mesh_"):] if isinstance(d, str) and d.startswith("mesh_")
                      else comm_dimension(n, run, scope_at(scopes, t))
                      for n, t, d in zip(comm_ev["name"], comm_ev["ts_us"], descs)],
                     index=comm_ev.index, dtype=object)
    comm_by_dim = {d: _iv(comm_ev[dims == d]) for d in sorted(set(dims))}
    pipe = host[host["name"] == annotations.PIPELINE]
    steps = _step_windows(host, dev)
    if not dev.empty:
        sel = _complete_steps(dev, host, steps)
        trace_compute = _iv(sel[sel["kind"] == classify.COMPUTE])
        trace_comm = _iv(sel[sel["kind"] == classify.COMMUNICATION])
    else:
        trace_compute, trace_comm = compute, comm
    return RankTimeline(
        rank=trace.rank, on_gpu=not dev.empty, compute=compute, comm=comm,
        comm_by_dim=comm_by_dim, other=other, steps=steps,
        pipeline=_iv(pipe), microbatches=_microbatches(host),
        span=(float(ev["ts_us"].min()), float(ev["end_us"].max())), scopes=scopes,
        trace_compute=trace_compute, trace_comm=trace_comm)
