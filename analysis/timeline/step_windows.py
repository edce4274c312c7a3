"""Which host ranges of one rank are its steps, and each step's window on the device.

The first half of a rank's timeline (``rank_timeline.build`` is the second): every
``ProfilerStep#N`` range — repeated numbers (several profiler windows in one file) kept apart
window by window — or, for traces without them, the ranges a ``--step-annotation`` pattern
names (``step_ranges``, docs/metrics.md "Which ranges are steps"); clipped to the profiler's own
span (``profiler_span``, ``clipped_to``); steps that are start-up — CUDA initialisation, stream
creation, graph capture, first launches loading their modules (``startup_steps``) — left out
while a steady step with device work remains; a GPU trace without steps is one window over its
device span. On a GPU trace each step's window is on the device's timeline: from the first
device work its host range launched to the last (``device_step_windows``; which kernel belongs
to which step: ``device_step_of``), joined to its launch through the runtime call
(``launch_calls``). Each decision is a note, in words, for the report (``StepWindows.notes``).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd

from meshscope.collectors import annotations

from meshscope.analysis.gpu import host_activity
from meshscope.analysis import intervals as iv
from meshscope.analysis.ingest.event_table import names_where
from meshscope.analysis.ingest.events import RankTrace


# Host ranges that mark steps: ``ProfilerStep#N`` (Kineto writes them as ``user_annotation`` or,
# in older traces, ``cpu_op``); the GPU-side copy of the same range is ``gpu_user_annotation``.
_STEP_CATS = ("user_annotation", "cpu_op")
WINDOW_SOURCES = ("ProfilerStep", "annotation", "trace")


@dataclasses.dataclass
class HostSteps:
    """The steps' host ranges as the trace gives them (``step_ranges``)."""
    steps: dict[int, tuple[float, float]]
    source: str                           # WINDOW_SOURCES
    # step → the number its range carries (``ProfilerStep#N``: N), where the two differ
    # because the numbers repeat (several profiler windows in one file).
    numbers: dict[int, int] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)


def host_step_ranges(host: pd.DataFrame, step_annotation: re.Pattern | None = None
                     ) -> tuple[dict[int, tuple[float, float]], str]:
    """(step → host range, where the steps came from): ``step_ranges``' steps and source."""
    got = step_ranges(host, step_annotation)
    return got.steps, got.source


def step_ranges(host: pd.DataFrame, step_annotation: re.Pattern | None = None) -> HostSteps:
    """The steps' host ranges: the ``ProfilerStep#N`` ranges; with ``step_annotation``
    (``--step-annotation REGEX``), every host range whose name matches it, numbered by its
    first group when each has a number, else 0, 1, 2… in time order (``annotation``); with
    neither, no steps (the caller makes the whole trace one window: ``trace``).

    Every range is a step: where numbers repeat (one file holding several profiler windows,
    each counting from its first step), the ranges are kept apart window by window
    (``_numbered``); ranges of one number that overlap in time are one step."""
    if step_annotation is not None:
        ann = host[host["cat"].isin(_STEP_CATS) & host["name"].map(
            lambda n: step_annotation.search(n) is not None)].sort_values("ts_us")
        rows = []
        for name, ts, end in zip(ann["name"], ann["ts_us"], ann["end_us"]):
            m = step_annotation.search(name)
            num = m.group(1) if m is not None and m.groups() else None
            rows.append((float(ts), float(end),
                         int(num) if num is not None and num.isdigit() else None))
        if any(n is None for _, _, n in rows):
            rows = [(a, b, i) for i, (a, b, _) in enumerate(rows)]
        return _numbered(rows, "annotation", "the ranges matching --step-annotation")
    steps = host[host["cat"].isin(_STEP_CATS) & host["name"].str.startswith("ProfilerStep#")]
    rows = []
    for name, ts, end in zip(steps["name"], steps["ts_us"], steps["end_us"]):
        m = annotations.STEP_RE.match(name)
        if m:
            rows.append((float(ts), float(end), int(m["step"])))
    return _numbered(sorted(rows), "ProfilerStep", "ProfilerStep")


def _numbered(rows: list[tuple[float, float, int]], source: str, what: str) -> HostSteps:
    """Steps from (start, end, number) ranges in time order. A profiler window runs while
    the numbers grow; a number no larger than the one before starts the next window. One
    window: each step is its number. Several: the first window keeps its numbers, and each
    later one is moved to follow the previous window's last step (its numbers + an offset),
    so every range is a step of its own and the steps stay in time order."""
    merged: list[list] = []
    for ts, end, num in sorted(rows):
        if merged and merged[-1][2] == num and ts < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)      # the same step, twice
            continue
        merged.append([ts, end, num])
    windows: list[list[list]] = []
    for r in merged:
        if not windows or r[2] <= windows[-1][-1][2]:
            windows.append([r])
        else:
            windows[-1].append(r)
    steps: dict[int, tuple[float, float]] = {}
    numbers: dict[int, int] = {}
    notes = []
    last = None
    for w in windows:
        offset = 0 if last is None else max(0, last + 1 - w[0][2])
        for ts, end, num in w:
            steps[num + offset] = (ts, end)
            if offset:
                numbers[num + offset] = num
        last = w[-1][2] + offset
    if len(windows) > 1:
        label = "ProfilerStep#" if source == "ProfilerStep" else "#"
        parts = ", ".join(f"{label}{w[0][2]}–{w[-1][2]}" if len(w) > 1 else f"{label}{w[0][2]}"
                          for w in windows[:6]) + (", …" if len(windows) > 6 else "")
        later = next((k for k, n in numbers.items()), None)
        notes.append(
            f"the {what} numbers repeat: the file holds {len(windows)} profiler windows "
            f"({parts}), kept apart — each window's steps are numbered after the previous "
            f"window's" + (f" ({label}{numbers[later]} of window 2 is step {later})"
                           if later is not None else "")
            + f"; all {len(steps)} steps are analysed")
    return HostSteps(steps=steps, source=source, numbers=numbers, notes=notes)


# Without the profiler's own range, a step may end after the last event it holds (Python the
# profiler does not record) or start before the first — by at most this share of the trace.
SPAN_SLACK = 0.1


def profiler_span(events: pd.DataFrame) -> tuple[float, float]:
    """The time the profiler recorded: its own range (``PyTorch Profiler (N)``, category
    ``Trace``) and every event other than the step ranges themselves (``ProfilerStep#N`` on the
    host or the device, whose end a profiler stopped mid-step may put anywhere). A trace
    without the profiler's range: its events' extent, widened by ``SPAN_SLACK`` of its length
    on each side. (Read as arrays: the event table is not copied.)"""
    codes, names = pd.factorize(events["name"])
    step = np.array([n.startswith("ProfilerStep#") for n in names] + [False])[codes]
    rest = ~step if (~step).any() else np.ones(len(step), dtype=bool)
    lo = float(events["ts_us"].to_numpy()[rest].min())
    hi = float(events["end_us"].to_numpy()[rest].max())
    if not (events["cat"] == "Trace").any():
        pad = SPAN_SLACK * (hi - lo)
        lo, hi = lo - pad, hi + pad
    return lo, hi


def clipped_to(steps: dict[int, tuple[float, float]], span: tuple[float, float],
               numbers: dict[int, int] | None = None, source: str = "ProfilerStep"
               ) -> tuple[dict, list[str]]:
    """``steps`` clipped to the profiler's own ``span`` (``profiler_span``), and one note per
    step that ran past it (a step range longer than the trace is not a step)."""
    lo, hi = span
    out, notes = {}, []
    for k, (a, b) in steps.items():
        ca, cb = max(a, lo), min(b, hi)
        label = _label(source, (numbers or {}).get(k, k))
        if cb <= ca:
            notes.append(f"{label} lies outside the profiler's own span "
                         f"({(hi - lo) / 1e3:,.1f} ms): left out")
            continue
        past = max(lo - a, 0.0) + max(b - hi, 0.0)
        if past > 1.0:
            notes.append(f"{label} runs {past / 1e3:,.1f} ms past the profiler's own span (its "
                         f"range lasts {(b - a) / 1e3:,.1f} ms, the profiler recorded "
                         f"{(hi - lo) / 1e3:,.1f} ms): clipped to it")
        out[k] = (ca, cb)
    return out, notes


LONG_LAUNCH_US = host_activity.LONG_LAUNCH_US
# A step is start-up when start-up work covers at least this share of its host range.
STARTUP_SHARE = 0.5


def startup_work(host: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """(The host's start-up work as an interval set, its calls: name, ts_us, end_us).
    Start-up work: the runtime and driver calls that set up rather than launch
    (``host_activity.STARTUP_RE``), launch calls longer than ``LONG_LAUNCH_US``, and graph
    capture — each thread's ``…BeginCapture`` to its next ``…EndCapture``, and ranges named
    as a capture (``host_activity.CAPTURE_ANNOTATION_RE``)."""
    ts, end = host["ts_us"].to_numpy(), host["end_us"].to_numpy()
    runtime = host["cat"].isin(host_activity.RUNTIME_CATS).to_numpy()
    setup = runtime & names_where(host["name"], host_activity.STARTUP_RE.match)
    blocking = names_where(host["name"], lambda n: n in host_activity.SYNC_NAMES
                           or n in host_activity.COPY_NAMES)
    slow = runtime & ~setup & ~blocking & (end - ts >= LONG_LAUNCH_US)
    named = host["cat"].isin(("user_annotation", "cpu_op", "python_function")).to_numpy() & \
        names_where(host["name"], host_activity.CAPTURE_ANNOTATION_RE.search)
    picked = np.flatnonzero(setup | slow | named)
    parts = [np.column_stack([ts[picked], end[picked]])]
    begin = np.flatnonzero(runtime & names_where(host["name"], lambda n: "BeginCapture" in n))
    if len(begin):
        ends = np.flatnonzero(runtime & names_where(host["name"], lambda n: "EndCapture" in n))
        lane = host["lane"].to_numpy()
        for ln in pd.unique(lane[begin]):
            e = np.sort(end[ends[lane[ends] == ln]])
            starts = ts[begin[lane[begin] == ln]]
            j = np.searchsorted(e, starts, side="left")
            ok = j < len(e)
            parts.append(np.column_stack([starts[ok], e[j[ok]]]))
    allp = np.concatenate(parts)
    calls = pd.DataFrame({"name": host["name"].to_numpy()[picked].astype(object),
                          "ts_us": ts[picked], "end_us": end[picked]})
    return iv.union(allp[:, 0], allp[:, 1]), calls


def _label(source: str, number: int) -> str:
    """How the report names a step: ``ProfilerStep#N``, or ``step N`` of annotated ranges."""
    return f"ProfilerStep#{number}" if source == "ProfilerStep" else f"step {number}"


def _startup_note(label: str, window: tuple[float, float], work: np.ndarray,
                  calls: pd.DataFrame) -> str:
    """What a start-up step held: its share of start-up work and the calls that took most."""
    a, b = window
    inside = calls[(calls["ts_us"] < b) & (calls["end_us"] > a)]
    g = inside.assign(d=inside["end_us"] - inside["ts_us"]).groupby("name")["d"].agg(
        ["size", "sum"]).sort_values("sum", ascending=False).head(3)
    what = ", ".join(f"{n} ×{int(c)} ({sm / 1e3:,.1f} ms)" for n, (c, sm) in
                     zip(g.index, g.to_numpy()))
    return (f"{label} is start-up, not steady state: "
            f"{iv.length(iv.clip(work, a, b)) / 1e3:,.1f} ms of its {(b - a) / 1e3:,.1f} ms in "
            f"set-up, graph capture and first launches ({what}); left out of the step figures")


def startup_steps(steps: dict[int, tuple[float, float]], work: np.ndarray) -> list[int]:
    """The steps whose host range start-up work covers at least ``STARTUP_SHARE`` of."""
    out = []
    for k, (a, b) in sorted(steps.items()):
        if b > a and iv.length(iv.clip(work, a, b)) >= STARTUP_SHARE * (b - a):
            out.append(k)
    return out


def graph_use(host: pd.DataFrame) -> tuple[int, int]:
    """(graph captures, graph replays) in the trace: captures are ``…BeginCapture`` calls (or,
    without them, graph instantiations) and ranges named as a capture; replays are graph
    launches (``cudaGraphLaunch``, ``hipGraphLaunch``)."""
    begins = int(names_where(host["name"], lambda n: "BeginCapture" in n).sum())
    inst = int(names_where(host["name"], lambda n: "GraphInstantiate" in n).sum())
    named = int((host["cat"].isin(("user_annotation", "cpu_op", "python_function")).to_numpy()
                 & names_where(host["name"], host_activity.CAPTURE_ANNOTATION_RE.search)).sum())
    replays = int(host["name"].isin(host_activity.GRAPH_LAUNCH_NAMES).sum())
    return (begins or inst) + named, replays


def launch_times(host: pd.DataFrame, device: pd.DataFrame) -> np.ndarray:
    """For each device event, the start of the runtime call that launched it (joined by
    ``correlation``: ``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaGraphLaunch`` — the
    kernels of a CUDA graph carry their ``cudaGraphLaunch``'s id —…); −inf for an id whose
    launch happened before the trace began; NaN where the event or the trace has none."""
    return launches(host, device)[0]


def launches(host: pd.DataFrame, device: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(``launch_times``, the lane of each launching call — None where unknown)."""
    t, _, lane = launch_calls(host, device)
    return t, lane


def launch_calls(host: pd.DataFrame, device: pd.DataFrame
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(``launch_times``, the end of each launching call, its lane — None where unknown)."""
    calls = host_activity.runtime_calls(host)
    if calls.empty or device.empty:
        nan = np.full(len(device), np.nan)
        return nan, nan.copy(), np.full(len(device), None, dtype=object)
    calls = calls.drop_duplicates("correlation").set_index("correlation")
    corr = device["correlation"]
    t = corr.map(calls["ts_us"]).to_numpy(dtype=np.float64, na_value=np.nan)
    end = corr.map(calls["end_us"]).to_numpy(dtype=np.float64, na_value=np.nan)
    lane = corr.map(calls["lane"]).to_numpy(dtype=object, na_value=None)
    # A correlation id with no launch in the trace: launched before the profiler recorded the
    # host (the device still runs the previous, unprofiled step's work).
    before = np.isnan(t) & (corr.to_numpy() >= 0)
    t = np.where(before, -np.inf, t)
    end = np.where(before, -np.inf, end)
    return t, end, lane


def _covers(ts: float, end: float, first: float | None, last: float | None) -> bool:
    """Whether a GPU-side step range describes the step's device work: it covers at least half
    of the span its launches give (ROCm traces carry 16 µs marks at unrelated times), or the
    step has no launched work to check it against."""
    if first is None or last is None or last <= first:
        return end > ts
    return min(end, last) - max(ts, first) >= 0.5 * (last - first)


def device_step_windows(host_steps: dict[int, tuple[float, float]], host: pd.DataFrame,
                        device: pd.DataFrame, numbers: dict[int, int] | None = None,
                        launch_ts: np.ndarray | None = None) -> dict[int, tuple[float, float]]:
    """The steps on the device's timeline (docs/metrics.md, "Step window").

    A device event belongs to the step whose host range holds the runtime call that launched
    it (``launch_times``; an event without one, to the step whose range holds its start). A
    step's device work ends with its last device activity — or with the GPU-side
    ``ProfilerStep#N`` range (``gpu_user_annotation``) where the trace has one. Its window runs
    from the end of the previous step's window (the first step: the end of whatever the device
    ran before it, at the earliest its host range's start) to the later of its last device
    activity and its host range's end: when the GPU runs behind the host, each step is timed
    where its kernels ran; when the host is behind, the device waiting for it is that step's
    idle time. The windows tile the profiled time without overlap.

    ``numbers`` (``HostSteps.numbers``): where step numbers repeat, the number each step's
    range carries; a GPU-side ``ProfilerStep#N`` then belongs to the step of number N whose
    host range began last before it. ``launch_ts``: ``launch_times(host, device)`` when the
    caller has it already.
    """
    keys = sorted(host_steps)
    if not keys:
        return {}
    dev_end: dict[int, float] = {}
    dev_first: dict[int, float] = {}
    before = -np.inf
    if not device.empty:
        step, early = _launching_step(host_steps, host, device, launch_ts)
        ts, end = device["ts_us"].to_numpy(), device["end_us"].to_numpy()
        for k in keys:
            mine = step == k
            if mine.any():
                dev_end[k] = float(end[mine].max())
                dev_first[k] = float(ts[mine].min())
        if early.any():
            before = float(end[early].max())
    gpu_steps = host[(host["cat"] == "gpu_user_annotation")
                     & host["name"].str.startswith("ProfilerStep#")]
    by_number: dict[int, list[int]] = {}
    for k in keys:
        by_number.setdefault((numbers or {}).get(k, k), []).append(k)
    for name, ts_, end_ in zip(gpu_steps["name"], gpu_steps["ts_us"], gpu_steps["end_us"]):
        m = annotations.STEP_RE.match(name)
        k = _step_of_number(by_number, host_steps, int(m["step"]), float(ts_)) if m else None
        if k is None or k not in host_steps or not _covers(float(ts_), float(end_),
                                                          dev_first.get(k), dev_end.get(k)):
            continue
        dev_end[k] = max(float(end_), dev_end.get(k, -np.inf))
        dev_first[k] = min(float(ts_), dev_first.get(k, np.inf))
    out: dict[int, tuple[float, float]] = {}
    prev_end = None
    for k in keys:
        hs, he = host_steps[k]
        start = max(hs, before) if prev_end is None else max(hs, prev_end)
        if k in dev_first and prev_end is None:
            start = min(start, dev_first[k])
        end_k = max(he, dev_end.get(k, he))
        end_k = max(end_k, start)
        out[k] = (start, end_k)
        prev_end = end_k
    return out


def _step_of_number(by_number: dict[int, list[int]], host_steps: dict, num: int,
                    ts: float) -> int | None:
    """The step whose range carries number ``num`` and began last before ``ts`` (else the
    first of them); None when no step carries it."""
    keys = by_number.get(num)
    if not keys:
        return None
    before = [k for k in keys if host_steps[k][0] <= ts]
    return max(before, key=lambda k: host_steps[k][0]) if before else keys[0]


NO_STEP = -1


def device_step_of(host_steps: dict[int, tuple[float, float]], host: pd.DataFrame,
                   device: pd.DataFrame, launch_ts: np.ndarray | None = None) -> np.ndarray:
    """For each device event, the step it belongs to — the step whose host range holds the
    runtime call that launched it (an event without one: the step whose range holds its
    start), as ``device_step_windows`` assigns them — or ``NO_STEP`` (-1) for an event that no
    profiled step launched. ``launch_ts``: ``launch_times(host, device)`` when the caller has
    it already."""
    if not host_steps or device.empty:
        return np.full(len(device), NO_STEP, dtype=np.int64)
    return _launching_step(host_steps, host, device, launch_ts)[0]


def _launching_step(host_steps: dict[int, tuple[float, float]], host: pd.DataFrame,
                    device: pd.DataFrame, launch_ts: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(``device_step_of``, whether each event was launched before the first step began)."""
    keys = sorted(host_steps)
    starts = np.array([host_steps[k][0] for k in keys])
    ends = np.array([host_steps[k][1] for k in keys])
    t = launch_times(host, device) if launch_ts is None else launch_ts
    t = np.where(np.isnan(t), device["ts_us"].to_numpy(), t)   # no launch record: its start
    i = np.searchsorted(starts, t, side="right") - 1
    inside = (i >= 0) & (t < ends[np.clip(i, 0, None)])
    step = np.where(inside, np.asarray(keys, dtype=np.int64)[np.clip(i, 0, None)], NO_STEP)
    return step, t < starts[0]



EVENT_COLUMNS = ["name", "cat", "ts_us", "dur_us", "end_us", "lane", "device", "kind", "correlation"]

@dataclasses.dataclass
class StepWindows:
    """The first half of a timeline (``step_windows``): the steps' host ranges, their device
    windows, the steps left out as start-up and what was decided about them in words. What
    the rest of the rank's work needs to know of its steps (``analysis/report/rank_work.py``
    runs part of it beside the rest of ``build``)."""
    span: tuple[float, float]
    host_steps: dict[int, tuple[float, float]]
    steps: dict[int, tuple[float, float]]
    startup: dict[int, tuple[float, float]]
    profiled: dict[int, tuple[float, float]]  # every step, start-up included (HTA reads all)
    source: str
    notes: list[str]
    on_gpu: bool
    # ``launch_calls`` of the trace's device events (in table order), made once here for
    # everything after that joins a device event to its launch (``rank_timeline.build``, the
    # GPU tables); None on a trace without device events.
    launch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def step_windows(trace: RankTrace, step_annotation: re.Pattern | None = None) -> StepWindows:
    """The steps of one rank (``build``'s docstring): its host ranges clipped to the
    profiler's span, their device windows, the start-up steps left out."""
    ev = trace.events[EVENT_COLUMNS]             # no copy (copy-on-write)
    device = ev["device"].to_numpy()
    dev = ev[device]
    host = ev[~device]
    span = (float(ev["ts_us"].min()), float(ev["end_us"].max()))
    got = step_ranges(host, step_annotation)
    notes = list(got.notes)
    host_steps, source = got.steps, got.source
    if host_steps:
        host_steps, clip_notes = clipped_to(host_steps, profiler_span(ev), got.numbers,
                                            source)
        notes += clip_notes
    launch = launch_calls(host, dev) if not dev.empty else None
    first: list[int] = []
    if host_steps:
        work, calls = startup_work(host)
        first = startup_steps(host_steps, work) if len(work) else []
    if not host_steps:
        host_steps, source = {0: span}, "trace"
    if dev.empty:
        steps = dict(host_steps)
    elif source == "trace":
        first_dev, last_dev = float(dev["ts_us"].min()), float(dev["end_us"].max())
        steps = {0: (first_dev, last_dev)}
        if (first_dev - span[0]) + (span[1] - last_dev) > 0.01 * (span[1] - span[0]):
            notes.append(
                f"its one window runs from the first device activity to the last "
                f"({(last_dev - first_dev) / 1e3:,.1f} ms): the {(first_dev - span[0]) / 1e3:,.1f}"
                f" ms of the trace before it and {(span[1] - last_dev) / 1e3:,.1f} ms after it "
                f"are not counted (start-up, or device work begun before the profiler)")
    else:
        steps = device_step_windows(host_steps, host, dev, got.numbers, launch[0])
    profiled = host_steps                 # HTA's whole-trace selection reads every step
    startup: dict[int, tuple[float, float]] = {}
    if first:
        busy = iv.union(dev["ts_us"].to_numpy(), dev["end_us"].to_numpy()) if not dev.empty \
            else None
        steady = [k for k in steps if k not in first and (busy is None or iv.length(
            iv.clip(busy, *steps[k])) > 0)]
        if steady:
            startup = {k: host_steps[k] for k in first}
            notes += [_startup_note(_label(source, got.numbers.get(k, k)), host_steps[k],
                                    work, calls) for k in first]
        else:
            notes.append(
                f"{', '.join(_label(source, got.numbers.get(k, k)) for k in first)} "
                f"{'is' if len(first) == 1 else 'are'} start-up (set-up, graph capture and "
                f"first launches cover at least {STARTUP_SHARE:.0%} of "
                f"{'it' if len(first) == 1 else 'each'}) and no other step holds device work: "
                f"analysed all the same, but not steady state — profile later steps")
    if startup:
        steps = {k: w for k, w in steps.items() if k not in startup}
        host_steps = {k: w for k, w in host_steps.items() if k not in startup}
    return StepWindows(span=span, host_steps=host_steps, steps=steps, startup=startup,
                       profiled=profiled, source=source, notes=notes, on_gpu=not dev.empty,
                       launch=launch)


def complete_steps(dev: pd.DataFrame, host: pd.DataFrame,
                    steps: dict[int, tuple[float, float]]) -> pd.DataFrame:
    """GPU events launched before the last profiled step began (``steps``: the host ranges).

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


def window_set(steps: dict[int, tuple[float, float]], span: tuple[float, float]) -> np.ndarray:
    """The steps' windows as one interval set (sorted, disjoint); with no steps, the span."""
    if steps:
        return iv.union([a for a, _ in steps.values()], [b for _, b in steps.values()])
    return np.array([span], dtype=np.float64)
