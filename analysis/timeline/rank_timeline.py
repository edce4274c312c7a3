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

Which host ranges are steps, and their windows on the device, is the first half
(``step_windows.py``: ``StepWindows``, whose notes become ``RankTimeline.notes``).

``comm_by_dim`` (dimension → the part of M that belongs to it) is filled from the rank's
collective-instance table (``analysis/comm/instances.py``, ``dims.interval_sets``), which is
where every communication operation's dimension is decided once. ``shifted(dt)`` is the same
timeline on a clock ``dt`` µs earlier (the clock alignment, ``analysis/crossrank/clocks.py``).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd

from meshscope.collectors import annotations

from meshscope.analysis.crossrank.clocks import to_aligned_us
from meshscope.analysis.gpu import host_activity
from meshscope.analysis.gpu import idle as gpu_idle
from meshscope.analysis.ingest import classify
from meshscope.analysis import intervals as iv
from meshscope.analysis.timeline import waits as wt
from meshscope.analysis.ingest.events import RankTrace
from meshscope.analysis.timeline.step_windows import EVENT_COLUMNS, StepWindows, complete_steps, \
    graph_use, launch_calls, step_windows, window_set


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
    # The whole-trace selection HTA's get_comm_comp_overlap uses (see ``step_windows.complete_steps``).
    trace_compute: np.ndarray
    trace_comm: np.ndarray
    # The rank's wait regions and, for each, the completion that ended it (waits.py).
    waits: np.ndarray = dataclasses.field(default_factory=lambda: iv.EMPTY.copy())
    wait_until: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    main_lane: str | None = None
    # The steps' host ranges (on GPU traces ``steps`` are on the device's timeline:
    # ``device_step_windows``) and where the steps came from (``WINDOW_SOURCES``).
    host_steps: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    window_source: str = "ProfilerStep"
    # GPU traces: cause → the device idle time charged to it (``analysis/gpu/idle.py``).
    idle_causes: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    # ``comm_by_dim`` split further by op: (dimension, op) → its part of M (``dims``).
    comm_by_dim_op: dict[tuple[str, str], np.ndarray] = dataclasses.field(default_factory=dict)
    # What building the windows changed or left out, in words (clipped steps, repeated step
    # numbers, start-up steps, the device span of a one-window trace), for the report's notes.
    notes: list[str] = dataclasses.field(default_factory=list)
    # Steps left out as start-up (``startup_steps``): step → its host range.
    startup: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    # CUDA/HIP graphs in the trace: captures (``cudaStreamBeginCapture``, graph
    # instantiation, capture annotations) and replays (``cudaGraphLaunch``).
    graph_captures: int = 0
    graph_replays: int = 0

    def shifted(self, dt_us: float) -> "RankTimeline":
        """This timeline on the reference rank's clock: ``dt_us`` (the offset the analysis
        applied to this rank) taken from every time by the one alignment function,
        ``clocks.to_aligned_us``."""
        if not dt_us:
            return self

        def at(x):
            return to_aligned_us(x, dt_us)
        mb = self.microbatches.copy()
        if len(mb):
            mb["ts_us"] = at(mb["ts_us"])
            mb["end_us"] = at(mb["end_us"])
        starts, ends, dims = self.scopes
        return dataclasses.replace(
            self, compute=at(self.compute), comm=at(self.comm),
            comm_by_dim={d: at(x) for d, x in self.comm_by_dim.items()},
            comm_by_dim_op={k: at(x) for k, x in self.comm_by_dim_op.items()},
            other=at(self.other),
            steps={k: (at(a), at(b)) for k, (a, b) in self.steps.items()},
            host_steps={k: (at(a), at(b)) for k, (a, b) in self.host_steps.items()},
            startup={k: (at(a), at(b)) for k, (a, b) in self.startup.items()},
            idle_causes={c: at(x) for c, x in self.idle_causes.items()},
            pipeline=at(self.pipeline), microbatches=mb,
            span=(at(self.span[0]), at(self.span[1])),
            scopes=(at(starts), at(ends), dims),
            trace_compute=at(self.trace_compute), trace_comm=at(self.trace_comm),
            waits=at(self.waits), wait_until=at(self.wait_until))


_RECEIVES = ("gloo:recv", "nccl:recv")
# The labels of a CPU thread's ranges for ``intervals.innermost`` (``build``), by code.
_LABELS = np.array(["", "ann", "op", "recv", "comm"], dtype=object)


def _is_work_annotation(name: str) -> bool:
    """Microbatch and optimizer ranges: on a CPU the host time inside them is the stage's
    work (operators and the Python that dispatches them), except where communication is
    innermost."""
    return name == annotations.OPTIMIZER or annotations.parse_microbatch(name) is not None


def _iv(df: pd.DataFrame) -> np.ndarray:
    return iv.union(df["ts_us"].to_numpy(), df["end_us"].to_numpy())


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


# Rows of the event table one block of ``sets_in_blocks`` reads.
BLOCK_ROWS = 1 << 17


def sets_in_blocks(build_sets, frame: pd.DataFrame, block_rows: int = BLOCK_ROWS) -> dict:
    """``build_sets(frame)`` — a dict of interval sets, or of dicts of them
    (``host_activity.thread_sets``, ``step_categories.role_sets``) — built over consecutive
    blocks of ``block_rows`` rows and merged key by key. The same sets, exactly: each is a union
    of intervals, and the union of the blocks' unions is the union of all (``iv.union``'s
    canonical form: sorted, disjoint, touching rows joined; nothing computed but maxima). What
    the builder holds meanwhile (labels, masks, sorted copies: on the 8× reference trace 140 MB
    above the frame, as much again as the host rows it read) is then one block's."""
    out: dict = {}
    for start in range(0, max(len(frame), 1), block_rows):
        _merge_sets(out, build_sets(frame.iloc[start:start + block_rows]))
    return out


def _merge_sets(out: dict, part: dict) -> None:
    for key, value in part.items():
        if isinstance(value, dict):
            _merge_sets(out.setdefault(key, {}), value)
        else:
            out[key] = iv.merge(out[key], value) if key in out else value


def build(trace: RankTrace, run=None, step_annotation: re.Pattern | None = None,
          steps_of: StepWindows | None = None) -> RankTimeline:
    """The timeline of one rank (module docstring). ``run`` is unused: since the collective-
    instance table, nothing here depends on the layout. ``step_annotation``: a pattern naming
    the host ranges that are steps, for traces without ``ProfilerStep`` (``step_ranges``);
    a trace with neither is one window: on a GPU trace from its first device activity to its
    last, else from its first event to its last.

    The steps' host ranges are clipped to the profiler's own span (``profiler_span``), and
    steps that are start-up (``startup_steps``: CUDA initialisation, stream creation, graph
    capture, first launches loading their modules) are left out, unless every step is."""
    ev = trace.events[EVENT_COLUMNS]             # no copy (copy-on-write): the rows below are
    device = ev["device"].to_numpy()
    dev = ev[device]
    host = ev[~device]
    w = steps_of if steps_of is not None else step_windows(trace, step_annotation)
    span, host_steps, steps, startup = w.span, w.host_steps, w.steps, w.startup
    profiled, source, notes = w.profiled, w.source, list(w.notes)
    captures, replays = graph_use(host)
    windows = window_set(steps, span)
    main = _main_lane(host)
    sets = _device_sets(dev, host, windows, main, w.launch) if not dev.empty else \
        _host_sets(host, windows, main)
    scopes = _scopes(host)
    pipe = host[host["name"] == annotations.PIPELINE]
    if not dev.empty:
        sel = complete_steps(dev, host, profiled)
        trace_compute = _iv(sel[sel["kind"] == classify.COMPUTE])
        trace_comm = _iv(sel[sel["kind"] == classify.COMMUNICATION])
    else:
        trace_compute, trace_comm = sets.compute, sets.comm
    return RankTimeline(
        rank=trace.rank, on_gpu=not dev.empty, compute=sets.compute, comm=sets.comm,
        comm_by_dim={}, other=sets.other, steps=steps, pipeline=_iv(pipe), microbatches=_microbatches(host),
        span=span, scopes=scopes, trace_compute=trace_compute, trace_comm=trace_comm,
        waits=sets.waits, wait_until=sets.until, main_lane=main, host_steps=host_steps,
        window_source=source, idle_causes=sets.idle_causes, notes=notes, startup=startup,
        graph_captures=captures, graph_replays=replays)


@dataclasses.dataclass(frozen=True)
class _Sets:
    """A rank's interval sets within its windows (``build``): compute, communication, other
    device work, the waits and when each ended, and the device's idle by cause (GPU only)."""
    compute: np.ndarray
    comm: np.ndarray
    other: np.ndarray
    waits: np.ndarray
    until: np.ndarray
    idle_causes: dict


def _device_sets(dev: pd.DataFrame, host: pd.DataFrame, windows: np.ndarray,
                 main, launch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                 ) -> _Sets:
    """A GPU rank's sets from its device events: kernels by kind, the waits of compute
    blocked behind receiving communication, and the idle between them by what the host did
    (``gpu/idle.py``). ``launch``: ``launch_calls(host, dev)`` (``StepWindows.launch``),
    made here when not given."""
    compute = _iv(dev[dev["kind"] == classify.COMPUTE])
    comm_ev = dev[dev["kind"] == classify.COMMUNICATION]
    other = _iv(dev[dev["kind"] == classify.MEMORY])
    comm = _iv(comm_ev)
    receiving = comm_ev[~comm_ev["name"].str.contains("Send(?!Recv)", regex=True)]
    waits, until = wt.wait_regions(iv.intersect(wt.gpu_blocked(compute, comm), windows),
                                   receiving["end_us"].to_numpy(),
                                   begun=receiving["ts_us"].to_numpy())
    launch_ts, launch_end, launch_lane = launch if launch is not None else \
        launch_calls(host, dev)
    sets = sets_in_blocks(host_activity.thread_sets, host)
    for lane, spans in gpu_idle.blocking_copies(dev, launch_ts, launch_end,
                                                launch_lane).items():
        sets.setdefault(lane, {})["blocking_copy"] = spans
    idle_causes = gpu_idle.causes(
        iv.subtract(windows, iv.merge(compute, comm, other)), dev["ts_us"].to_numpy(),
        launch_ts, launch_lane, sets, main,
        gpu_idle.sync_spans_by_lane(host_activity.sync_calls(host)), launch_end)
    return _Sets(compute, comm, other, waits, until, idle_causes)


def _host_sets(host: pd.DataFrame, windows: np.ndarray, main) -> _Sets:
    """A CPU rank's sets from its host ranges: each lane's innermost operators and work
    annotations are compute, the collectives' ranges and the waits inside them communication
    (``timeline/waits.py``)."""
    comm_ev = host[host["kind"] == classify.COMMUNICATION]
    per_lane = []
    # Names repeat: each distinct one is parsed once (a missing name, code −1, is not).
    codes, names = pd.factorize(host["name"])
    is_ann = np.array([_is_work_annotation(n) for n in names] + [False])[codes]
    is_recv = host["name"].isin(_RECEIVES).to_numpy()
    kind = host["kind"]
    # Each host range's label as a small code into _LABELS (0: none), and each lane's
    # labelled rows as positions: no copy of the host rows, no string per row.
    label = np.select([is_ann, (kind == classify.COMPUTE).to_numpy(), is_recv,
                       (kind == classify.COMMUNICATION).to_numpy()],
                      [1, 2, 3, 4], default=0).astype(np.int8)
    rows = np.flatnonzero(label)
    del codes, is_ann, is_recv
    lane_codes, lanes = pd.factorize(host["lane"])
    lane_codes = lane_codes[rows]
    order = np.argsort(lane_codes, kind="stable")
    splits = np.flatnonzero(np.diff(lane_codes[order])) + 1
    ts_all, end_all = host["ts_us"].to_numpy(), host["end_us"].to_numpy()
    main_owned: dict = {}
    for mine in np.split(order, splits) if len(order) else []:
        at = rows[mine]
        lane = lanes[lane_codes[mine[0]]]
        owned = iv.innermost(ts_all[at], end_all[at], _LABELS[label[at]])
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
    return _Sets(compute, comm, other, waits, until, {})
