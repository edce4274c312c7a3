"""One rank's timeline as interval sets: compute C, communication M, other device work O, the
step windows, the pipeline windows, the microbatch spans and the wait regions.

On GPU traces the lanes are the device streams: C and M are the unions of compute and
communication kernels, O of memcpy/memset. On CPU-only traces the lanes are the threads, and
a thread's time belongs to the innermost range covering it (``intervals.innermost``): it
computes where that is a ``cpu_op`` and communicates where it is a communication range
(``gloo:*``, ``c10d::*``). So a backward op that encloses a blocking all-reduce does not count
the wait as compute, and an asynchronous ``gloo:send`` that stays open on the main thread while
the next forward runs does not hide that forward's compute. The runner's microbatch and
optimizer ranges (``meshscope/forward …``, ``meshscope/optimizer``) count as compute too, so the
Python that dispatches a stage's operators is the stage's work, not idle time or bubble —
except where the issuing thread is waiting (``waits``, ``analysis/timeline/waits.py``): DDP
waits for its last all-reduce inside the last backward with no operator running, and that
time is communication, not compute. M is the union of all communication ranges (in flight,
whether or not the thread waits on them) and the waits.

``comm_by_dim`` (dimension → the part of M that belongs to it) is filled from the rank's
collective-instance table (``analysis/comm/instances.py``, ``dims.interval_sets``), which is
where every communication operation's dimension is decided once. ``shifted(dt)`` is the same
timeline on a clock ``dt`` µs earlier (the clock alignment, ``analysis/crossrank/clocks.py``).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from meshscope.collectors import annotations

from meshscope.analysis.ingest import classify
from meshscope.analysis.timeline import intervals as iv
from meshscope.analysis.timeline import waits as wt
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
    # The rank's wait regions and, for each, the completion that ended it (waits.py).
    waits: np.ndarray = dataclasses.field(default_factory=lambda: iv.EMPTY.copy())
    wait_until: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    main_lane: str | None = None

    def shifted(self, dt_us: float) -> "RankTimeline":
        """This timeline with ``dt_us`` subtracted from every time."""
        if not dt_us:
            return self
        mb = self.microbatches.copy()
        if len(mb):
            mb["ts_us"] -= dt_us
            mb["end_us"] -= dt_us
        starts, ends, dims = self.scopes
        return dataclasses.replace(
            self, compute=self.compute - dt_us, comm=self.comm - dt_us,
            comm_by_dim={d: x - dt_us for d, x in self.comm_by_dim.items()},
            other=self.other - dt_us,
            steps={k: (a - dt_us, b - dt_us) for k, (a, b) in self.steps.items()},
            pipeline=self.pipeline - dt_us, microbatches=mb,
            span=(self.span[0] - dt_us, self.span[1] - dt_us),
            scopes=(starts - dt_us, ends - dt_us, dims),
            trace_compute=self.trace_compute - dt_us, trace_comm=self.trace_comm - dt_us,
            waits=self.waits - dt_us, wait_until=self.wait_until - dt_us)


_RECEIVES = ("gloo:recv", "nccl:recv")


def _is_work_annotation(name: str) -> bool:
    """Microbatch and optimizer ranges: on a CPU the host time inside them is the stage's
    work (operators and the Python that dispatches them), except where communication is
    innermost."""
    return name == annotations.OPTIMIZER or annotations.parse_microbatch(name) is not None


def _iv(df: pd.DataFrame) -> np.ndarray:
    return iv.union(df["ts_us"].to_numpy(), df["end_us"].to_numpy())


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


def _main_lane(host: pd.DataFrame) -> str | None:
    """The thread that ran the profiled steps (the lane of the ``ProfilerStep`` ranges), else
    the one with the most operator time."""
    steps = host[host["name"].str.startswith("ProfilerStep#")]
    if len(steps):
        return str(steps["lane"].mode().iloc[0])
    ops = host[host["cat"] == "cpu_op"]
    if ops.empty:
        return None
    return str(ops.groupby("lane")["dur_us"].sum().idxmax())


def _windows(steps: dict[int, tuple[float, float]], span: tuple[float, float]) -> np.ndarray:
    if steps:
        return iv.union([a for a, _ in steps.values()], [b for _, b in steps.values()])
    return np.array([span], dtype=np.float64)


_COLUMNS = ["name", "cat", "ts_us", "dur_us", "end_us", "lane", "device", "kind", "correlation"]


def build(trace: RankTrace, run=None) -> RankTimeline:
    """The timeline of one rank (module docstring). ``run`` is unused: since the collective-
    instance table, nothing here depends on the layout."""
    ev = trace.events[_COLUMNS]
    dev = ev[ev["device"]]
    host = ev[~ev["device"]]
    steps = _step_windows(host, dev)
    span = (float(ev["ts_us"].min()), float(ev["end_us"].max()))
    windows = _windows(steps, span)
    main = _main_lane(host)
    if not dev.empty:
        compute = _iv(dev[dev["kind"] == classify.COMPUTE])
        comm_ev = dev[dev["kind"] == classify.COMMUNICATION]
        other = _iv(dev[dev["kind"] == classify.MEMORY])
        comm = _iv(comm_ev)
        receiving = comm_ev[~comm_ev["name"].str.contains("Send(?!Recv)", regex=True)]
        waits, until = wt.wait_regions(iv.intersect(wt.gpu_blocked(compute, comm), windows),
                                       receiving["end_us"].to_numpy(),
                                       begun=receiving["ts_us"].to_numpy())
    else:
        comm_ev = host[host["kind"] == classify.COMMUNICATION]
        per_lane = []
        # Names repeat: each distinct one is parsed once (a missing name, code −1, is not).
        codes, names = pd.factorize(host["name"])
        is_ann = np.array([_is_work_annotation(n) for n in names] + [False])[codes]
        is_recv = host["name"].isin(_RECEIVES)
        label = np.where(is_ann, "ann", np.where(
            host["kind"] == classify.COMPUTE, "op", np.where(
                is_recv, "recv", np.where(host["kind"] == classify.COMMUNICATION, "comm", ""))))
        work = host.assign(label=label)
        work = work[work["label"] != ""]
        main_owned: dict = {}
        for lane, g in work.groupby("lane", sort=False):
            owned = iv.innermost(g["ts_us"].to_numpy(), g["end_us"].to_numpy(), g["label"])
            per_lane.append(iv.merge(owned.get("op", iv.EMPTY), owned.get("ann", iv.EMPTY)))
            if lane == main:
                main_owned = owned
        compute = iv.merge(*per_lane) if per_lane else iv.EMPTY.copy()
        other = iv.EMPTY.copy()
        ranges = comm_ev[comm_ev["name"].str.startswith(("gloo:", "nccl:"))
                         & ~comm_ev["name"].isin(["gloo:send", "nccl:send"])]
        in_recv, elsewhere = wt.cpu_blocked(main_owned, windows)
        on_main = (ranges["lane"] == main).to_numpy()
        w1, u1 = wt.wait_regions(in_recv, ranges["end_us"].to_numpy()[on_main],
                                 late_us=wt.SAME_THREAD_US)
        w2, u2 = wt.wait_regions(elsewhere, ranges["end_us"].to_numpy()[~on_main],
                                 begun=ranges["ts_us"].to_numpy()[~on_main])
        order = np.argsort(np.concatenate([w1[:, 0], w2[:, 0]]), kind="stable")
        waits, until = np.concatenate([w1, w2])[order], np.concatenate([u1, u2])[order]
        compute = iv.subtract(compute, waits)
        comm = iv.merge(_iv(comm_ev), waits)
    scopes = _scopes(host)
    pipe = host[host["name"] == annotations.PIPELINE]
    if not dev.empty:
        sel = _complete_steps(dev, host, steps)
        trace_compute = _iv(sel[sel["kind"] == classify.COMPUTE])
        trace_comm = _iv(sel[sel["kind"] == classify.COMMUNICATION])
    else:
        trace_compute, trace_comm = compute, comm
    return RankTimeline(
        rank=trace.rank, on_gpu=not dev.empty, compute=compute, comm=comm, comm_by_dim={},
        other=other, steps=steps, pipeline=_iv(pipe), microbatches=_microbatches(host),
        span=span, scopes=scopes, trace_compute=trace_compute, trace_comm=trace_comm,
        waits=waits, wait_until=until, main_lane=main)
