"""One batch of decoded events (``decode.Event``) as the event table's columns.

``batch(evs, reading)`` gives the columns of a batch's usable complete events — ``name``,
``cat``, ``ts_us``, ``dur_us``, ``lane``, ``device``, ``correlation``, ``call_args`` —, the
collective metadata of the rows that carry it (``comm_meta``; placed in its columns when the
batches are joined, ``accumulator._meta_columns``) and what was dropped or ignored. Each column is
built for the whole batch at once (Arrow compute) where its values allow, one value at a time
only where they do not (a mix of types, an integer beyond 64 bits); the slower checks below
run only on a batch that needs them.

- **Typed fields.** An event whose ``name`` is not a string, whose ``ts`` or ``dur`` is
  missing, not a number, not finite, or a negative duration is dropped (``_typed_keep``),
  counted once under its first unusable field; an argument that is not usable (an integer
  beyond 64 bits in ``correlation``, ``In msg nelems`` or ``Input Dims``, a ``Collective
  name`` that is not a string: here and in ``comm_meta``) is ignored on that event. An event
  with no known phase (``KNOWN_PHASES``) is dropped and counted; one with no ``pid``/``tid``
  is read on a lane of its own and counted.
- **PyTorch 1.8** (the first Kineto traces) named the categories ``Operator``, ``Kernel``,
  ``Runtime``, ``Memcpy``, ``Memset`` and ``Python``: they are renamed ``cpu_op``, ``kernel``,
  ``cuda_runtime``, ``gpu_memcpy``, ``gpu_memset`` and ``python_function``
  (``LEGACY_CATEGORIES``), except that an ``Operator`` named ``ProfilerStep#N``,
  ``enumerate(DataLoader)…`` or ``Optimizer.…`` is the profiler or ``record_function`` range
  that today's profiler calls a ``user_annotation`` (``LEGACY_ANNOTATIONS``). Their
  ``Input dims`` (small d) is read as ``Input Dims`` (``decode.dims``); kernels already carry
  ``device``, ``stream`` and ``correlation``. Only a batch that holds PyTorch 1.8 categories is
  renamed.
- **``B``/``E`` pairs** are matched per thread (``pid``, ``tid``) as a stack, across batches:
  an ``E`` closes the latest open ``B`` of its thread and the two become one complete event
  (``Reading``, what reading one trace carries from batch to batch). An unmatched ``B`` or
  ``E`` is damage, counted as any other. Only the events that are not ``X`` are looked at.
- **Lanes**: ``gpu:<device>:<stream>`` for device events (``classify.DEVICE_CATS``),
  ``cpu:<pid>:<tid>`` else.
- The allocator's ``[memory]`` events go to their own table (``memory_events.Collector``,
  carried in ``Reading``).
"""
from __future__ import annotations

import collections
import functools
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from meshscope.analysis.ingest import classify
from meshscope.analysis.ingest import comm_meta
from meshscope.analysis.ingest import decode
from meshscope.analysis.ingest import memory_events
from meshscope.analysis.ingest import validate
from meshscope.analysis.ingest.validate import Damage

# PyTorch 1.8's Kineto categories and today's name for each (``LEGACY_CATEGORIES``); the
# ``Operator`` events that are profiler or ``record_function`` ranges (today's
# ``user_annotation``) are told by their name (``LEGACY_ANNOTATIONS``).
LEGACY_CATEGORIES = {"Operator": "cpu_op", "Kernel": "kernel", "Runtime": "cuda_runtime",
                     "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Python": "python_function"}
LEGACY_ANNOTATIONS = ("ProfilerStep#", "enumerate(DataLoader)", "Optimizer.")


# -- typing the fields of a batch of events --------------------------------------------------

_NUMBER = {int, float}
_STR_OR_NONE = {str, type(None)}
_MISSING, _NOT_A_NUMBER = 1, 2


def _numbers(values: list) -> tuple[np.ndarray, np.ndarray | None]:
    """float64 array of ``values`` (NaN where unusable) and, when some are not numbers, a code
    per value (0 a number, ``_MISSING``, ``_NOT_A_NUMBER``); None when all are numbers."""
    if set(map(type, values)) <= _NUMBER:
        try:
            return np.array(values, dtype=np.float64), None
        except OverflowError:               # an integer beyond the float range
            pass
    out = np.full(len(values), np.nan)
    code = np.zeros(len(values), dtype=np.int8)
    for i, v in enumerate(values):
        if type(v) in _NUMBER:
            try:
                out[i] = v
            except OverflowError:           # read as not finite
                out[i] = np.inf
        else:
            code[i] = _MISSING if v is None else _NOT_A_NUMBER
    return out, code


def _typed_keep(names: list, cats: list, ts: np.ndarray, ts_code, dur: np.ndarray, dur_code,
                damage: Damage) -> np.ndarray:
    """Which events have a usable name, category, start and duration; each event dropped is
    counted once, under its first unusable field."""
    n = len(names)
    none = np.zeros(n, dtype=bool)
    name_missing = np.fromiter((v is None for v in names), bool, n)
    name_bad = np.fromiter((type(v) is not str for v in names), bool, n) & ~name_missing
    cat_bad = np.fromiter((type(v) not in _STR_OR_NONE for v in cats), bool, n)
    checks = [("name", "missing", name_missing), ("name", "not a string", name_bad)]
    for field, values, code in (("ts", ts, ts_code), ("dur", dur, dur_code)):
        checks += [(field, "missing", none if code is None else code == _MISSING),
                   (field, "not a number", none if code is None else code == _NOT_A_NUMBER),
                   (field, "not finite", ~np.isfinite(values) & (
                       True if code is None else code == 0))]
    with np.errstate(invalid="ignore"):
        checks += [("dur", "a negative duration", dur < 0), ("cat", "not a string", cat_bad)]
    keep = np.ones(n, dtype=bool)
    steps = any(type(v) is str and v.startswith(validate.STEP_PREFIX) for v in names)
    for field, why, bad in checks:
        damage.drop(field, why, int((bad & keep).sum()))
        if steps:
            damage.lose_steps(names, cats, bad & keep, f"{field}: {why}")
        keep &= ~bad
    return keep


def _correlations(args: list, damage: Damage) -> pa.Array:
    """``args.correlation`` of each event as int64; -1 where absent or unusable (counted)."""
    values = [a.correlation if a is not None else None for a in args]
    if set(map(type, values)) <= {int, type(None)}:
        try:
            return pa.array(values, pa.int64()).fill_null(-1)
        except OverflowError:
            pass
    out = []
    for v in values:
        ok = type(v) is int and -validate.INT64_MAX <= v <= validate.INT64_MAX
        if v is not None and not ok:
            damage.ignore("args.correlation", "not an integer within 64 bits")
        out.append(v if ok else -1)
    return pa.array(out, pa.int64())


def _str_array(values: list) -> pa.Array:
    """Arrow strings of values that are strings or None (read as \"\")."""
    arr = pa.array(values, pa.large_string())
    return arr.fill_null("") if arr.null_count else arr


_CPU, _COLON = pa.scalar("cpu", pa.large_string()), pa.scalar(":", pa.large_string())


def _cpu_lanes(pids: list, tids: list) -> pa.Array:
    """``cpu:<pid>:<tid>`` for each event."""
    try:
        p = pc.cast(pa.array(pids), pa.large_string())
        t = pc.cast(pa.array(tids), pa.large_string())
        if not (p.null_count or t.null_count):
            return pc.binary_join_element_wise(_CPU, p, t, _COLON)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        pass
    return pa.array([f"cpu:{p}:{t}" for p, t in zip(pids, tids)], pa.large_string())


_GPU = pa.scalar("gpu", pa.large_string())


def _gpu_lanes(devices: list, streams: list) -> pa.Array:
    """``gpu:<device>:<stream>`` for each device event: at C speed when both are integers
    (or both strings) throughout, as Python would write them; else one by one."""
    for kinds in ({int}, {str}):
        if set(map(type, devices)) <= kinds and set(map(type, streams)) <= kinds:
            try:
                d = pc.cast(pa.array(devices), pa.large_string())
                s = pc.cast(pa.array(streams), pa.large_string())
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                    OverflowError):
                break
            return pc.binary_join_element_wise(_GPU, d, s, _COLON)
    return pa.array([f"gpu:{d}:{s}" for d, s in zip(devices, streams)], pa.large_string())


_DEVICE_CATS = pa.array(sorted(classify.DEVICE_CATS), pa.large_string())
# Operators whose shapes are kept (``call_args``): the GEMMs whose FLOPs the kernel table needs.
_GEMM_OPS = pa.array(sorted(classify.GEMM_OPS), pa.large_string())
_LEGACY_CATS = pa.array(sorted(LEGACY_CATEGORIES), pa.large_string())


def _today_categories(names: list[str], cat: pa.Array, reading: "Reading") -> pa.Array:
    """``cat`` with PyTorch 1.8's categories renamed to today's (``LEGACY_CATEGORIES``; an
    ``Operator`` named as a profiler or ``record_function`` range is a ``user_annotation``),
    each one met counted in ``reading``."""
    out = []
    for n, c in zip(names, cat.to_pylist()):
        new = LEGACY_CATEGORIES.get(c)
        if new is None:
            out.append(c)
            continue
        reading.legacy[c] += 1
        out.append("user_annotation" if c == "Operator" and n.startswith(LEGACY_ANNOTATIONS)
                   else new)
    return pa.array(out, pa.large_string())


class Reading:
    """What reading one trace carries from batch to batch: the ``B`` events still open on each
    thread (``(pid, tid)``), as a stack, and what was met (PyTorch 1.8 categories, B/E pairs).

    ``pair`` turns each ``E`` and the latest open ``B`` of its thread into one complete event
    (``ph`` "X"): the name, category, start and thread of the ``B``, the duration from the
    ``B``'s start to the ``E``'s, the ``B``'s arguments with the ``E``'s merged over them (an
    ``E`` may carry a name, a category or arguments, or not). An ``E`` with no open ``B`` is
    dropped and counted; so is each ``B`` still open when the trace ends (``unclosed``).
    """

    def __init__(self):
        self.open: dict[tuple, list[decode.Event]] = {}
        self.legacy: collections.Counter = collections.Counter()
        self.pairs = 0
        self.be_events = 0              # B and E events met, paired or not
        self.memory = memory_events.Collector()
        self.memory_bytes = 0           # the memory table's bytes so far (the rank's budget)

    def pair(self, evs: list[decode.Event], damage: Damage) -> list[decode.Event]:
        self.be_events += len(evs)
        out = []
        for e in evs:
            key = (e.pid, e.tid)
            try:
                hash(key)
            except TypeError:               # a pid or tid that is a list or an object
                key = (repr(e.pid), repr(e.tid))
            if e.ph == "B":
                self.open.setdefault(key, []).append(e)
                continue
            stack = self.open.get(key)
            if not stack:
                damage.drop("ph", "an 'E' that closes no open 'B' on its thread (pid, tid)")
                continue
            out.append(_complete(stack.pop(), e))
            self.pairs += 1
        return out

    def unclosed(self, damage: Damage) -> None:
        damage.drop("ph", "a 'B' that no 'E' on its thread (pid, tid) closes",
                    sum(len(s) for s in self.open.values()))
        self.open.clear()

    def to_json(self) -> bytes:
        return json.dumps({"legacy": dict(self.legacy), "pairs": self.pairs}).encode()


def _complete(b: decode.Event, e: decode.Event) -> decode.Event:
    """The complete event of the pair ``b`` … ``e`` (``Reading``). A start that is not a
    number leaves the duration unknown; the event is then dropped as any other would be."""
    if type(b.ts) in _NUMBER and type(e.ts) in _NUMBER:
        dur = e.ts - b.ts
    else:
        dur = e.ts if type(b.ts) in _NUMBER else None
    args = b.args
    if e.args is not None:
        args = e.args if b.args is None else decode.Args(**{
            f: (new if (new is not None and (f not in decode.RAW_ARGS or new))
                else getattr(b.args, f))
            for f in decode.ARG_KEYS for new in (getattr(e.args, f),)})
    return decode.Event(ph="X", name=b.name if b.name is not None else e.name,
                        cat=b.cat if b.cat is not None else e.cat, ts=b.ts, dur=dur, pid=b.pid,
                        tid=b.tid, args=args)


# ``memory_events.is_memory``, inlined in ``batch`` (a call per event cost 0.13 s a million).
_INSTANT, _MEMORY = memory_events.INSTANT_PHASES, memory_events.NAME
# The GPU-side copies of host ranges: a ``gloo:``/``nccl:`` name there carries no metadata.
_HOST_META_CATS = pa.array(["gpu_user_annotation"], pa.large_string())
# The event phases of Chrome's trace event format: complete (X) and begin/end (B, E) events are
# read; the others (instants, counters, flows, async, objects, metadata, marks…) are other
# kinds of event, left out on purpose. An event with no phase, or another, is dropped and
# counted (``batch``).
KNOWN_PHASES = frozenset({"X", "B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P",
                          "N", "O", "D", "M", "V", "v", "R", "c", "(", ")"})


def batch(evs: list[decode.Event], reading: "Reading"
          ) -> tuple[dict[str, pa.Array] | None, list[tuple[int, dict]], Damage]:
    """Columns of one batch's usable complete events (None when there are none), (row,
    collective metadata) pairs, and what was dropped or ignored. ``reading``: what is carried
    from batch to batch (the open ``B`` events of each thread, the ``[memory]`` events'
    columns: ``memory_events.Collector``) and what was met."""
    damage = Damage(getattr(evs, "damage", None) or {})
    typed = _typed(_complete_events(evs, reading, damage), damage)
    if typed is None:
        return None, [], damage
    xs, ts, dur, names, cats = typed
    name = pa.array(names, pa.large_string())
    cat = _str_array(cats)
    if pc.any(pc.is_in(cat, value_set=_LEGACY_CATS)).as_py():
        cat = _today_categories(names, cat, reading)
    args = [e.args for e in xs]
    device = pc.is_in(cat, value_set=_DEVICE_CATS)
    lane = _lanes(xs, args, device, damage)     # damage is counted in the order it is met
    found = _collective_meta(names, name, cat, args, damage)
    cols = {
        "name": name, "cat": cat, "ts_us": pa.array(ts), "dur_us": pa.array(dur),
        "call_args": _call_args(name, args, damage), "lane": lane, "device": device,
        "correlation": _correlations(args, damage),
    }
    return cols, found, damage


def _complete_events(evs: list[decode.Event], reading: "Reading", damage: Damage
              ) -> list[decode.Event]:
    """The batch's complete events: its ``X`` events and the ``B``/``E`` pairs it closes
    (``reading.pair``); its ``[memory]`` instants go to ``reading.memory``; an event of no
    known phase is dropped and counted."""
    phases = [e.ph for e in evs]
    n_x = phases.count("X")
    if n_x == len(evs):
        return evs
    try:
        met = set(phases)                           # at C speed: the phases met
    except TypeError:                               # a phase that is a list or an object
        met = None
    if met is None:
        unknown = sum(1 for p in phases if not isinstance(p, str) or p not in KNOWN_PHASES)
    else:               # each phase that is not one of the format's, counted where it is
        unknown = sum(phases.count(p) for p in met
                      if not isinstance(p, str) or p not in KNOWN_PHASES)
    del phases
    xs = [e for e in evs if e.ph == "X"] if n_x else []
    if unknown:     # no kind at all, or none of the trace format's: not guessed
        damage.drop("ph", "missing, or not one of the trace format's event phases", unknown)
    if met is None or "B" in met or "E" in met:
        pairs = [e for e in evs if e.ph == "B" or e.ph == "E"]
        if pairs:
            xs += reading.pair(pairs, damage)
    if met is None or "i" in met or "I" in met:
        ms = [e for e in evs if (e.ph == "i" or e.ph == "I") and e.name == _MEMORY]
        if ms:
            cols = memory_events.columns(ms, _cpu_lanes([e.pid for e in ms],
                                                        [e.tid for e in ms]), damage)
            if cols is not None:
                reading.memory_bytes += reading.memory.add(cols)
    return xs


def _typed(xs: list[decode.Event], damage: Damage) -> tuple | None:
    """``(events, ts, dur, names, cats)`` of the events whose time, duration, name and
    category are usable (the others dropped and counted, ``_typed_keep``); None when none
    is."""
    if not xs:
        return None
    ts, ts_code = _numbers([e.ts for e in xs])
    dur, dur_code = _numbers([e.dur for e in xs])
    names, cats = [e.name for e in xs], [e.cat for e in xs]
    with np.errstate(invalid="ignore"):
        clean = ts_code is None and dur_code is None and bool(
            np.isfinite(ts).all() and np.isfinite(dur).all() and (dur >= 0).all())
    if not (clean and set(map(type, names)) == {str} and set(map(type, cats)) <= _STR_OR_NONE):
        keep = _typed_keep(names, cats, ts, ts_code, dur, dur_code, damage)
        if not keep.all():
            xs = [e for e, k in zip(xs, keep) if k]
            if not xs:
                return None
            ts, dur = ts[keep], dur[keep]
            names = [v for v, k in zip(names, keep) if k]
            cats = [v for v, k in zip(cats, keep) if k]
    return xs, ts, dur, names, cats


def _lanes(xs: list[decode.Event], args: list, device: pa.Array, damage: Damage) -> pa.Array:
    """Each event's lane: ``cpu:<pid>:<tid>``, a device event's ``gpu:<device>:<stream>``
    (its arguments' device and stream where it has them); a thread-less event is read on a
    lane of its own and counted."""
    pids, tids = [e.pid for e in xs], [e.tid for e in xs]
    lane = _cpu_lanes(pids, tids)
    threadless = sum(1 for p, t in zip(pids, tids) if p is None or t is None) if (
        pids.count(None) or tids.count(None)) else 0
    del pids, tids
    if threadless:      # read, on a lane of their own ("cpu:None:None"), and said so
        damage.ignore("pid/tid", "missing: the event's thread is unknown", threadless)
    if pc.any(device).as_py():
        on_device = np.flatnonzero(device.to_numpy(zero_copy_only=False)).tolist()
        lane = pc.replace_with_mask(lane, device, _gpu_lanes(
            [xs[i].pid if (a := args[i]) is None or a.device is None else a.device
             for i in on_device],
            [xs[i].tid if (a := args[i]) is None or a.stream is None else a.stream
             for i in on_device]))
    return lane


def _collective_meta(names: list, name: pa.Array, cat: pa.Array, args: list,
                     damage: Damage) -> list[tuple[int, dict]]:
    """(row, collective metadata) of the events that carry it: their record's arguments
    (``comm_meta.from_record``), else a ``gloo:``/``nccl:``-style host range's input
    dimensions and types (``comm_meta.from_host_range``)."""
    found = []
    colls = [a.coll_name if a is not None else None for a in args]
    for i in ([i for i, c in enumerate(colls) if c is not None]
              if colls.count(None) < len(colls) else ()):
        meta = comm_meta.from_record(args[i], damage)
        if meta is not None:
            found.append((i, meta))
    prefixed = functools.reduce(pc.or_, (pc.starts_with(name, p)
                                         for p in comm_meta.HOST_PREFIXES))
    host = pc.and_(prefixed, pc.invert(pc.is_in(cat, value_set=_HOST_META_CATS)))
    if pc.any(host).as_py():
        have = {i for i, _ in found}
        for i in np.flatnonzero(host.to_numpy(zero_copy_only=False)).tolist():
            if i in have:
                continue
            a = args[i]
            dims = decode.raw_value(decode.dims(a), "Input Dims", damage) if a else None
            types = decode.raw_value(a.input_type, "Input type", damage) if a else None
            found.append((i, comm_meta.from_host_range(names[i], dims, types, damage)))
    return found


def _call_args(name: pa.Array, args: list, damage: Damage) -> pa.Array:
    """The call-argument text of ``c10d::`` calls and GEMM operators (null elsewhere)."""
    calls = pc.or_(pc.starts_with(name, "c10d::"), pc.is_in(name, value_set=_GEMM_OPS))
    call_args = pa.nulls(len(args), pa.large_string())
    if pc.any(calls).as_py():
        idx = np.flatnonzero(calls.to_numpy(zero_copy_only=False)).tolist()
        texts = [decode.call_args_text(args[i], damage) for i in idx]
        call_args = pc.replace_with_mask(call_args, calls, pa.array(texts, pa.large_string()))
    return call_args
