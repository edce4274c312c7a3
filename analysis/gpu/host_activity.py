"""What the host threads of a GPU trace were doing, as interval sets per thread and kind.

A GPU idles because its host did not give it work in time. Which host activity was in the way is
read from the thread that launched the next device work (``launch_times``). Each of that
thread's ranges is one of:

============ ===========================================================================
kind         host ranges (by name; ``cat`` in parentheses)
============ ===========================================================================
dataloader   the data loader: ``enumerate(DataLoader)#…__next__``, ``enumerate(DataPipe)#…``
             (the names the former TensorBoard profiler plugin counts as DataLoader), and a
             loader iterator's ``__next__`` in Python stacks (``…dataloader.py…: __next__``)
sync         a blocking synchronisation: ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
             ``cudaEventSynchronize``, blocking ``cudaMemcpy`` / ``cuMemcpyDtoH``…,
             ``cudaFree`` (which synchronises the device), their HIP names, and
             ``aten::item`` / ``aten::_local_scalar_dense`` (a ``.item()`` copies a value to
             the host and waits for it); and ``cudaStreamWaitEvent`` (``EVENT_WAIT_NAMES``),
             which makes a stream wait for another's event: the host returns at once unless
             the driver blocks it, and the time it spends inside is a wait
copy         an asynchronous copy call (``cudaMemcpyAsync`` …): it blocks the host too when
             the host memory is pageable
comm         a host call of a collective (``c10d::…``, ``gloo:…``, ``nccl:…``,
             ``record_param_comms``): where the host blocks there, it waits for another rank
startup      a runtime or driver call that sets up rather than enqueues work
             (``STARTUP_RE``): initialising CUDA/HIP, creating contexts, streams and events,
             loading modules, allocating device or pinned memory, capturing and
             instantiating graphs — work that a steady-state step does not repeat
runtime      any other runtime or driver call (``cuda_runtime``, ``cuda_driver``):
             launching work
cpu          other host work: operators and Python (``cpu_op``, ``python_function``), not the
             step ranges themselves
============ ===========================================================================

``SYNC_NAMES``, ``EVENT_WAIT_NAMES``, ``STARTUP_RE`` and ``DATALOADER_RE`` are the lists;
``thread_sets`` builds the sets of one thread; ``sync_calls`` lists the synchronisations
(``blocking_copy_calls`` adds the copies that blocked) and ``with_sites`` names where they
were called from: the outermost operator around each (``aten::item`` for the
``cudaStreamSynchronize`` of a ``.item()``; the call itself when no operator encloses it) and
the innermost Python frame outside torch and site-packages, when the trace records Python
stacks (``with_stack=True``).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from meshscope.analysis.ingest import classify
from meshscope.analysis import intervals as iv

HOST_KINDS = ("dataloader", "sync", "copy", "comm", "startup", "runtime", "cpu")
DATALOADER_RE = re.compile(r"^enumerate\(Data(?:Loader|Pipe)\)#|dataloader\.py.*__next__|"
                           r"_(?:MultiProcessing|SingleProcess)DataLoaderIter.*__next__")
SYNC_NAMES = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpyHtoD", "cuMemcpyHtoD_v2",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
    "cudaFree", "cuMemFree", "cuMemFree_v2", "hipFree",
    "aten::item", "aten::_local_scalar_dense",
})
# A stream made to wait for an event recorded on another stream: no host wait for the device
# to drain (unlike SYNC_NAMES, nothing follows from it after it returns), but the host time
# inside it is a wait all the same, and it is listed with the synchronisations.
EVENT_WAIT_NAMES = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"})
# Such a call is listed with the synchronisations when the host stayed in it this long (µs):
# the thousands of a few µs each that a step makes are launches, not waits.
EVENT_WAIT_MIN_US = 100.0
# Synchronisations that wait for an event — recorded on another stream, or another device.
EVENT_SYNC_NAMES = frozenset({"cudaEventSynchronize", "cuEventSynchronize",
                              "hipEventSynchronize"}) | EVENT_WAIT_NAMES
# Runtime and driver calls that set things up rather than enqueue work on a stream (CUDA, the
# driver API, HIP): initialisation, contexts, streams, events, modules and libraries, device
# and pinned allocations, peer access, graph capture and instantiation.
STARTUP_RE = re.compile(
    r"^(?:cuda|cu|hip)(?:Init|DriverGetVersion|RuntimeGetVersion|GetDeviceCount|"
    r"DeviceGetCount|GetDeviceProperties\w*|SetDevice|DeviceReset|DevicePrimaryCtx\w*|"
    r"Ctx(?:Create|Destroy|SetCurrent|SetLimit)\w*|Stream(?:Create|Destroy)\w*|"
    r"Event(?:Create|Destroy)\w*|Module(?:Load|Unload|GetFunction|GetGlobal)\w*|"
    r"Library(?:Load|Unload|GetKernel|GetModule)\w*|Malloc\w*|HostAlloc|HostRegister|"
    r"HostMalloc|MemAlloc\w*|MemHostAlloc\w*|MemCreate|MemMap|MemAddressReserve|"
    r"MemPool\w*|DeviceEnablePeerAccess|DeviceCanAccessPeer|CtxEnablePeerAccess|"
    r"Ipc\w*|GetProcAddress\w*|GetExportTable|StreamBeginCapture\w*|StreamEndCapture|"
    r"GraphInstantiate\w*|GraphCreate|GraphDestroy|GraphExecDestroy|GraphUpload|"
    r"GraphAdd\w*|ThreadExchangeStreamCaptureMode|FuncGetAttributes|GetFuncBySymbol)"
    r"(?:_v\d+)?$")
# A launch call that holds the host this long is no ordinary launch (a few µs): a first launch
# that loads its kernel's module (lazy loading) or initialises a library — start-up work.
LONG_LAUNCH_US = 1_000.0
# Calls that mark a CUDA/HIP graph being captured, and the one that replays a graph.
CAPTURE_RE = re.compile(r"^(?:cuda|cu|hip)(?:StreamBeginCapture|StreamEndCapture|"
                        r"GraphInstantiate)\w*$")
CAPTURE_ANNOTATION_RE = re.compile(r"graph[ _]?capture|capture[ _]?(?:cuda[ _]?)?graph|"
                                   r"CUDAGraph::capture", re.I)
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch",
                                "hipGraphLaunch"})
# Asynchronous copies, which block the host all the same when host memory is pageable (the
# driver stages the data through a pinned buffer while the call waits).
COPY_NAMES = frozenset({
    "cudaMemcpyAsync", "cudaMemcpy2DAsync", "cuMemcpyAsync", "cuMemcpyHtoDAsync",
    "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", "hipMemcpyAsync",
    "hipMemcpyWithStream", "hipMemcpyHtoDAsync", "hipMemcpyDtoHAsync",
})
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
CPU_CATS = ("cpu_op", "python_function")
STEP_RANGE_RE = re.compile(r"^ProfilerStep#\d+$")


def runtime_calls(host: pd.DataFrame) -> pd.DataFrame:
    """The host's CUDA/HIP runtime and driver calls that launched device work (a correlation
    id): the rows that tie a kernel, copy or memset to the call that issued it."""
    return host[(host["correlation"] >= 0) & host["cat"].isin(RUNTIME_CATS)]


def host_kind(name: pd.Series, cat: pd.Series, kind: pd.Series,
              dur: pd.Series | None = None) -> np.ndarray:
    """The ``HOST_KINDS`` label of each host event ("" for annotations and other ranges).
    An event wait (``EVENT_WAIT_NAMES``) is ``sync`` when it held the host at least
    ``EVENT_WAIT_MIN_US`` (``dur``), else a launch like any other runtime call."""
    return _LABELS[_kind_codes(name, cat, kind, dur)]


# ``host_kind``'s labels by code: 0 none, then ``HOST_KINDS`` in order, then ``slow_launch``.
_LABELS = np.array(["", *HOST_KINDS, "slow_launch"], dtype=object)
_RUNTIME, _SLOW = 1 + HOST_KINDS.index("runtime"), len(HOST_KINDS) + 1


def _kind_codes(name: pd.Series, cat: pd.Series, kind: pd.Series,
                dur: pd.Series | None = None) -> np.ndarray:
    """``host_kind`` as small integer codes into ``_LABELS``."""
    codes, names = pd.factorize(name)
    dl = np.array([bool(DATALOADER_RE.search(n)) for n in names] + [False])[codes]
    waits = np.array([n in EVENT_WAIT_NAMES for n in names] + [False])[codes]
    if dur is not None:
        waits &= (dur >= EVENT_WAIT_MIN_US).to_numpy()
    sync = np.array([n in SYNC_NAMES for n in names] + [False])[codes] | waits
    copy = np.array([n in COPY_NAMES for n in names] + [False])[codes]
    step = np.array([bool(STEP_RANGE_RE.match(n)) for n in names] + [False])[codes]
    setup = np.array([bool(STARTUP_RE.match(n)) for n in names] + [False])[codes]
    comm = (kind == classify.COMMUNICATION).to_numpy()
    runtime = cat.isin(RUNTIME_CATS).to_numpy()
    cpu = cat.isin(CPU_CATS).to_numpy() & ~step
    return np.select([dl, sync, copy, comm, runtime & setup, runtime, cpu],
                     list(range(1, len(HOST_KINDS) + 1)), default=0).astype(np.int8)


def thread_sets(host: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """lane → kind → the union of that thread's ranges of that kind (module docstring); and,
    under ``slow_launch``, its launch calls (``runtime``) that held it at least
    ``LONG_LAUNCH_US``. (Grouped by codes — the rows of each (lane, kind) in order, the pairs
    in the order they first appear — not by a label string per row.)"""
    dur = host["end_us"] - host["ts_us"]
    codes = _kind_codes(host["name"], host["cat"], host["kind"], dur)
    codes[(codes == _RUNTIME) & (dur >= LONG_LAUNCH_US).to_numpy()] = _SLOW
    rows = np.flatnonzero(codes)
    out: dict[str, dict[str, np.ndarray]] = {}
    if len(rows) and host["lane"].notna().any():
        lane_codes, lanes = pd.factorize(host["lane"])
        rows = rows[lane_codes[rows] >= 0]      # a row without a lane is in no thread's set
        key = lane_codes[rows].astype(np.int64) * len(_LABELS) + codes[rows]
        order = np.argsort(key, kind="stable")
        bounds = np.flatnonzero(np.diff(key[order])) + 1
        groups = np.split(order, bounds)
        groups.sort(key=lambda g: g[0])          # the order each pair first appears in
        ts, end = host["ts_us"].to_numpy(), host["end_us"].to_numpy()
        for g in groups:
            at = rows[g]
            pair = key[g[0]]
            out.setdefault(str(lanes[pair // len(_LABELS)]), {})[
                str(_LABELS[pair % len(_LABELS)])] = iv.union(ts[at], end[at])
    for kinds in out.values():          # a slow launch is a launch too
        if "slow_launch" in kinds:
            kinds["runtime"] = iv.merge(kinds.get("runtime", iv.EMPTY), kinds["slow_launch"])
    return out


SITE_COLUMNS = ["name", "parent_op", "call_site", "lane", "ts_us", "end_us"]


def sync_calls(host: pd.DataFrame) -> pd.DataFrame:
    """Every synchronisation of the trace, in time order (columns ``SITE_COLUMNS``). The
    ``aten::`` ops that merely enclose a runtime synchronisation are left out — the runtime
    call is the synchronisation —, and an ``aten::item`` is one call with the
    ``aten::_local_scalar_dense`` inside it. A ``cudaStreamWaitEvent`` (``EVENT_WAIT_NAMES``)
    is listed when the host stayed in it at least ``EVENT_WAIT_MIN_US``. ``parent_op`` and
    ``call_site`` are null here: ``with_sites`` finds them for the calls that matter."""
    is_sync = (host["name"].isin(SYNC_NAMES)
               | (host["name"].isin(EVENT_WAIT_NAMES)
                  & (host["end_us"] - host["ts_us"] >= EVENT_WAIT_MIN_US))).to_numpy()
    if not is_sync.any():
        return pd.DataFrame(columns=SITE_COLUMNS)
    rows = []
    for lane, g in host[is_sync].groupby("lane", sort=False):
        runtime = g[g["cat"].isin(RUNTIME_CATS)]
        chosen = _outermost(g[~g["cat"].isin(RUNTIME_CATS)])
        if len(runtime):    # an aten::item with a runtime sync inside is that runtime call
            kept_outer = [not ((runtime["ts_us"] >= a) & (runtime["end_us"] <= b)).any()
                          for a, b in zip(chosen["ts_us"], chosen["end_us"])]
            chosen = pd.concat([runtime, chosen[np.array(kept_outer, dtype=bool)]])
        rows += [{"name": name, "parent_op": None, "call_site": None, "lane": lane,
                  "ts_us": float(ts), "end_us": float(end)}
                 for name, ts, end in zip(chosen["name"], chosen["ts_us"], chosen["end_us"])]
    return pd.DataFrame(rows, columns=SITE_COLUMNS).sort_values("ts_us", ignore_index=True)


def blocking_copy_calls(calls: pd.DataFrame, host: pd.DataFrame,
                        sync_idle: np.ndarray) -> pd.DataFrame:
    """``calls`` (``sync_calls``) with the copy calls (``COPY_NAMES``) inside which device idle
    was charged to ``sync`` (``analysis/gpu/idle.py``: a copy from pageable memory holds the
    host until the driver has staged the data), in time order: they are where the host
    blocked."""
    copies = host[host["name"].isin(COPY_NAMES)]
    if copies.empty or not len(sync_idle):
        return calls
    s = iv.of(np.asarray(sync_idle, dtype=np.float64).reshape(-1, 2))
    ts, end = copies["ts_us"].to_numpy(), copies["end_us"].to_numpy()
    i = np.searchsorted(s[:, 0], end, side="left") - 1   # last idle piece starting before end
    hit = (i >= 0) & (s[np.maximum(i, 0), 1] > ts)
    if not hit.any():
        return calls
    picked = copies[hit]
    rows = pd.DataFrame({"name": picked["name"].astype(object).to_numpy(), "parent_op": None,
                         "call_site": None, "lane": picked["lane"].astype(object).to_numpy(),
                         "ts_us": ts[hit].astype(float), "end_us": end[hit].astype(float)},
                        columns=SITE_COLUMNS)
    both = pd.concat([calls, rows], ignore_index=True) if len(calls) else rows
    return both.sort_values("ts_us", ignore_index=True, kind="stable")


def in_steps(calls: pd.DataFrame, steps: dict[int, tuple[float, float]]) -> pd.DataFrame:
    """``calls`` with ``step``: the profiled step whose host range holds each call's start (-1
    outside every step)."""
    keys = sorted(steps)
    starts = np.array([steps[k][0] for k in keys])
    ends = np.array([steps[k][1] for k in keys])
    ts = calls["ts_us"].to_numpy()
    i = np.searchsorted(starts, ts, side="right") - 1
    ok = (i >= 0) & (ts < ends[np.clip(i, 0, max(len(keys) - 1, 0))]) if len(keys) else \
        np.zeros(len(ts), dtype=bool)
    step = np.where(ok, np.array(keys)[np.clip(i, 0, max(len(keys) - 1, 0))]
                    if len(keys) else -1, -1)
    return calls.assign(step=step.astype(np.int64))


def _outermost(ops: pd.DataFrame) -> pd.DataFrame:
    """The ranges of one thread that no other of them encloses (``aten::item`` and not also the
    ``aten::_local_scalar_dense`` inside it)."""
    if len(ops) < 2:
        return ops
    g = ops.assign(_neg=-ops["end_us"]).sort_values(["ts_us", "_neg"], kind="stable")
    reach = np.maximum.accumulate(g["end_us"].to_numpy())
    inside = np.zeros(len(g), dtype=bool)
    inside[1:] = g["end_us"].to_numpy()[1:] <= reach[:-1]
    return g[~inside].drop(columns="_neg")


def with_sites(calls: pd.DataFrame, events: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    """``calls`` with ``parent_op`` and ``call_site`` filled where ``mask`` holds, found among
    ``events``' host operators and Python frames (read as arrays: the table is not copied)."""
    out = calls.copy()
    idx = np.flatnonzero(mask)
    if not len(idx):
        return out
    cat = events["cat"]
    is_op = (cat == "cpu_op").to_numpy()
    is_py = (cat == "python_function").to_numpy()
    codes, names = pd.factorize(events["name"])
    step = np.array([bool(STEP_RANGE_RE.match(n)) for n in names] + [False])[codes]
    lib = np.array([bool(_LIBRARY_FRAME.search(n)) for n in names] + [False])[codes]
    lane_codes, lanes = pd.factorize(events["lane"])
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    ts, end = events["ts_us"].to_numpy(), events["end_us"].to_numpy()
    candidates = (is_op | is_py) & ~step
    for i in idx:
        row = out.iloc[i]
        code = lane_of.get(row["lane"], -1)
        around = candidates & (lane_codes == code) & (ts <= row["ts_us"]) & \
            (end >= row["end_us"])
        ops = np.flatnonzero(around & is_op)
        parent = str(names[codes[ops[np.argmin(ts[ops])]]]) if len(ops) else str(row["name"])
        py = np.flatnonzero(around & is_py)
        user = py[~lib[py]] if (~lib[py]).any() else py
        site = str(names[codes[user[np.argmax(ts[user])]]]) if len(user) else None
        out.iat[i, out.columns.get_loc("parent_op")] = parent
        out.iat[i, out.columns.get_loc("call_site")] = site
    return out


_LIBRARY_FRAME = re.compile(r"torch/|<built-in|site-packages")
