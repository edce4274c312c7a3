"""PyTorch memory snapshots: what the caching allocator held, block by block, and when.

``torch.cuda.memory._record_memory_history()`` makes the allocator keep a stack trace for every
block and a log of its recent actions; ``torch.cuda.memory._dump_snapshot(path)`` pickles
``torch.cuda.memory._snapshot()`` — the file that PyTorch's memory_viz draws. Its structure
(documented in ``_snapshot``'s docstring, torch 2.x):

```
{"segments": [                       # one per cudaMalloc the allocator holds (reserved)
   {"device": 0, "address": int, "total_size": int, "stream": int,
    "segment_type": "large" | "small", "allocated_size": int, "active_size": int,
    "blocks": [                      # the segment cut into blocks
       {"address": int, "size": int, "requested_size": int,
        "state": "active_allocated" | "active_awaiting_free" | "inactive",
        "frames": [{"filename": str, "line": int, "name": str}, ...]}]}],
                                     # torch 2.0: no "address", "frames" nor
                                     # "requested_size" on a block, but "history":
                                     # [{"addr": int, "real_size": int, "frames": [...]}]
 "device_traces": [                  # per device, the allocator's last actions, oldest first
   [{"action": "alloc" | "free_requested" | "free_completed" | "segment_alloc"
               | "segment_free" | "segment_map" | "segment_unmap" | "snapshot" | "oom",
     "addr": int, "size": int, "stream": int, "time_us": int, "frames": [...],
     "device_free": int}]],          # device_free: on "oom" only
 "allocator_settings": {...}}
```

``read(path)`` reads such a file — the pickle, or the same document as JSON — into a typed
``Snapshot``, and refuses anything else with ``SnapshotError`` naming the file and the field.
A snapshot is a stranger's pickle: it is read by the one plain-data unpickler
(``collectors/plain_pickle.py``), which interprets the plain-data opcodes itself and refuses
any that names or calls code — a ``__reduce__`` to ``os.system`` is refused when it is reached,
and nothing runs — as well as non-str dict keys, integers beyond int64 and data that would
take more time or memory than the file's size allows. A file larger than the trace budget
(``--max-trace-bytes``) is refused unread.

What is made of it (``analyse``), per device:

- ``segments`` — one row per segment (``SEGMENT_COLUMNS``): its size, the bytes of its blocks
  in use (allocated), and free but reserved (inactive blocks: memory the allocator holds but
  cannot hand out to a larger request — fragmentation), and its largest free block;
- the largest moment: the log replayed backwards from the snapshot's own state (the blocks in
  use at the end; an ``alloc`` undone, a ``free_completed`` redone), the moment after the
  action at which the most was allocated, and the blocks live then, grouped by their top stack
  frames (``LIVE_COLUMNS``: the frames of the ``alloc`` action that made each block, else its
  block's own);
- the out-of-memory record, when the log holds an ``oom`` action: the bytes asked for, what
  the device still had free, what the allocator had allocated and reserved then.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Annotated

import msgspec

from meshscope.analysis.errors import InputError
from meshscope.collectors.plain_pickle import UnsafePickleError, loads as plain_loads

# A byte count or an address: non-negative, and within int64, what the report's tables hold
# (a larger value is no real allocation: refused at read, never at the write).
Count = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
Int64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
SEGMENT_COLUMNS = ["rank", "device", "source", "address", "segment_type", "stream",
                   "total_bytes", "allocated_bytes", "active_bytes", "free_bytes",
                   "largest_free_bytes", "blocks"]
LIVE_COLUMNS = ["rank", "device", "source", "site", "frames", "bytes", "blocks", "share"]
LIVE_STATES = ("active_allocated", "active_awaiting_free")
FRAMES_SHOWN = 3
MiB = 1 << 20
TOP_LIVE = 30


class SnapshotError(InputError):
    """A file that is not a usable memory snapshot; the message names it and the problem."""


class Frame(msgspec.Struct, gc=False):
    filename: str = ""
    line: Int64 = 0
    name: str = ""


class History(msgspec.Struct, gc=False):
    """PyTorch 2.0's record of what a block holds (``history``: the allocation's address,
    its bytes and stack), where later formats give the block its ``address`` and
    ``frames``."""
    addr: Count | None = None
    real_size: Count | None = None
    frames: list[Frame] = []


class Block(msgspec.Struct, gc=False):
    size: Count
    state: str
    address: Count | None = None
    requested_size: Count | None = None
    frames: list[Frame] = []
    history: list[History] = []


DeviceIndex = Annotated[int, msgspec.Meta(ge=0, le=1 << 16)]


class Segment(msgspec.Struct, gc=False):
    address: Count
    total_size: Count
    device: DeviceIndex = 0
    stream: Int64 = 0
    segment_type: str = "large"
    allocated_size: Count | None = None
    active_size: Count | None = None
    blocks: list[Block] = []


class TraceEntry(msgspec.Struct, gc=False):
    action: str
    addr: Count | None = None
    size: Count = 0
    stream: Int64 = 0
    time_us: Int64 | None = None
    device_free: Count | None = None
    frames: list[Frame] = []


class Snapshot(msgspec.Struct):
    segments: list[Segment] = []
    device_traces: list[list[TraceEntry]] = []


def read(path: pathlib.Path, max_bytes: int | None = None) -> Snapshot:
    """The snapshot at ``path`` (a pickle, or its JSON form), typed; SnapshotError naming the
    file otherwise (module docstring)."""
    path = pathlib.Path(path)
    try:
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise SnapshotError(path, f"{size:,} bytes, more than the budget of "
                                f"{max_bytes:,} (raise it with --max-trace-bytes)")
        raw = path.read_bytes()
    except OSError as e:
        raise SnapshotError(path, f"cannot read ({e.strerror})") from None
    if not raw:
        raise SnapshotError(path, "empty file")
    if raw.lstrip()[:1] in (b"{", b"["):
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise SnapshotError(path, f"not valid JSON ({e})") from None
    else:
        try:
            doc = plain_loads(raw)
        except UnsafePickleError as e:
            raise SnapshotError(path, f"refused: {e}") from None
    if not isinstance(doc, dict) or "segments" not in doc:
        raise SnapshotError(path, "not a memory snapshot (no 'segments': "
                            "torch.cuda.memory._snapshot() writes one)")
    try:
        return msgspec.convert(doc, Snapshot)
    except msgspec.ValidationError as e:
        problem, _, where = str(e).partition(" - at `")
        raise SnapshotError(path, f"{where.rstrip('`') or '$'}: {problem} (not a usable "
                            f"memory snapshot)") from None


def _devices(snap: Snapshot) -> list[int]:
    return sorted({s.device for s in snap.segments} | set(range(len(snap.device_traces))))


def device_name(device: int) -> str:
    return f"cuda:{device}"


def segment_rows(rank: int, snap: Snapshot, source: str) -> list[dict]:
    rows = []
    for s in sorted(snap.segments, key=lambda s: (s.device, s.address)):
        used = sum(b.size for b in s.blocks if b.state == "active_allocated")
        active = sum(b.size for b in s.blocks if b.state in LIVE_STATES)
        free = [b.size for b in s.blocks if b.state == "inactive"]
        rows.append({"rank": rank, "device": device_name(s.device), "source": source,
                     "address": s.address, "segment_type": s.segment_type, "stream": s.stream,
                     "total_bytes": s.total_size,
                     "allocated_bytes": s.allocated_size if s.allocated_size is not None
                     else used,
                     "active_bytes": s.active_size if s.active_size is not None else active,
                     "free_bytes": sum(free) if s.blocks else s.total_size - used,
                     "largest_free_bytes": max(free) if free else 0, "blocks": len(s.blocks)})
    return rows


def _frames_text(frames: list[Frame]) -> str:
    return " ← ".join(f"{f.name} ({pathlib.PurePath(f.filename).name}:{f.line})"
                      for f in frames[:FRAMES_SHOWN]) or "(no stack recorded)"


def _site(frames: list[Frame]) -> str:
    """The innermost frame outside PyTorch's own files (the user's line that allocated)."""
    for f in frames:
        name = f.filename.replace("\\", "/")
        if "/torch/" not in name and not name.startswith("??") and name:
            return f"{f.name} ({pathlib.PurePath(name).name}:{f.line})"
    return _frames_text(frames[:1])


@dataclasses.dataclass(frozen=True)
class Moment:
    """The state after action ``index`` of a device's log (-1: before the first; ``len``:
    the snapshot's own moment)."""
    index: int
    allocated_bytes: int
    reserved_bytes: int
    time_us: int | None
    live: dict[int, tuple[int, list[Frame]]]      # address → (bytes, frames)


@dataclasses.dataclass(frozen=True)
class Oom:
    requested_bytes: int
    device_free_bytes: int | None
    allocated_bytes: int
    reserved_bytes: int
    time_us: int | None
    site: str


@dataclasses.dataclass(frozen=True)
class DeviceSummary:
    device: str
    reserved_bytes: int
    allocated_bytes: int
    free_in_segments_bytes: int
    largest: Moment
    entries: int
    oom: Oom | None
    caveat: str | None = None        # where the blocks and the segments' totals disagree
    active_bytes: int = 0            # allocated or awaiting free (the segments' active_size)
    requested_bytes: int = 0         # what the live blocks' callers asked for


def _replay(snap: Snapshot, device: int) -> tuple[list[TraceEntry], list[int], list[int],
                                                  dict[int, tuple[int, list[Frame]]]]:
    """The device's log and the allocated and reserved bytes after each of its actions,
    replayed backwards from the snapshot's state (module docstring); and the end state's live
    blocks."""
    segs = [s for s in snap.segments if s.device == device]
    live = {address: (b.size, frames) for s in segs for address, b, frames in _placed(s)
            if b.state in LIVE_STATES}
    allocated = _allocated(segs, live)[0]
    reserved = sum(s.total_size for s in segs)
    log = snap.device_traces[device] if device < len(snap.device_traces) else []
    after_alloc, after_res = [0] * len(log), [0] * len(log)
    for i in range(len(log) - 1, -1, -1):
        after_alloc[i], after_res[i] = allocated, reserved
        e = log[i]
        if e.action == "alloc":
            allocated -= e.size
        elif e.action == "free_completed":
            allocated += e.size
        elif e.action in ("segment_alloc", "segment_map"):
            reserved -= e.size
        elif e.action in ("segment_free", "segment_unmap"):
            reserved += e.size
    return log, after_alloc, after_res, live


def _placed(seg: Segment) -> list[tuple[int, Block, list[Frame]]]:
    """Each block of ``seg`` with its address and stack, in every snapshot format: the block's
    own (torch ≥ 2.1), else its ``history``'s first record (torch 2.0), else — a block's place
    in its segment — the segment's address plus the sizes of the blocks before it (a segment
    is cut into its blocks in order)."""
    out = []
    at = seg.address
    for b in seg.blocks:
        first = b.history[0] if b.history else None
        address = b.address if b.address is not None else \
            first.addr if first is not None and first.addr is not None else at
        out.append((address, b, b.frames or (first.frames if first is not None else [])))
        at += b.size
    return out


def _requested(b: Block) -> int:
    """What a live block's caller asked for: its ``requested_size`` (torch ≥ 2.1), else its
    history's ``real_size`` (torch 2.0), else its size."""
    if b.requested_size is not None:
        return b.requested_size
    sizes = [h.real_size for h in b.history if h.real_size is not None]
    return sum(sizes) if sizes else b.size


def _allocated(segs: list[Segment], live: dict) -> tuple[int, str | None]:
    """The bytes allocated at the snapshot: the allocator's own segment totals
    (``allocated_size``) where every segment has one, else the blocks in use; and, where the
    blocks in use add up to another number than the totals, a caveat saying so."""
    blocks = sum(v[0] for v in live.values())
    totals = [s.allocated_size for s in segs]
    if not segs or any(t is None for t in totals):
        return blocks, None
    total = sum(t for t in totals if t is not None)
    if total == blocks:
        return total, None
    return total, (f"the blocks in use add up to {blocks / MiB:,.2f} MiB but the segments' own "
                   f"totals (allocated_size) to {total / MiB:,.2f} MiB: the segment totals are "
                   f"reported, the live blocks by site are the blocks'")


def _live_after(log: list[TraceEntry], index: int, end_live: dict) -> dict:
    """The live blocks after action ``index``: the end state with the later actions undone,
    each block with the frames of the ``alloc`` that made it where the log has it."""
    live = dict(end_live)
    for e in reversed(log[index + 1:]):
        if e.addr is None:
            continue
        if e.action == "alloc":
            live.pop(e.addr, None)
        elif e.action == "free_completed":
            live[e.addr] = (e.size, [])
    made: dict[int, list[Frame]] = {}
    for e in log[:index + 1]:
        if e.action == "alloc" and e.addr is not None:
            made[e.addr] = e.frames
    return {a: (size, made.get(a) or frames) for a, (size, frames) in live.items()}


def summarise(snap: Snapshot, device: int) -> DeviceSummary:
    segs = [s for s in snap.segments if s.device == device]
    log, after_alloc, after_res, end_live = _replay(snap, device)
    end_alloc, caveat = _allocated(segs, end_live)
    end_res = sum(s.total_size for s in segs)
    best = max(range(len(log)), key=lambda i: (after_alloc[i], -i), default=None)
    if best is None or after_alloc[best] <= end_alloc:
        largest = Moment(len(log), end_alloc, end_res, None, end_live)
    else:
        largest = Moment(best, after_alloc[best], after_res[best], log[best].time_us,
                         _live_after(log, best, end_live))
    oom = None
    ooms = [i for i, e in enumerate(log) if e.action == "oom"]
    if ooms:
        i = ooms[-1]
        e = log[i]
        oom = Oom(requested_bytes=e.size, device_free_bytes=e.device_free,
                  allocated_bytes=after_alloc[i], reserved_bytes=after_res[i],
                  time_us=e.time_us, site=_site(e.frames))
    free = sum(b.size for s in segs for b in s.blocks if b.state == "inactive")
    active = sum(s.active_size for s in segs) if segs and all(
        s.active_size is not None for s in segs) else \
        sum(b.size for s in segs for b in s.blocks if b.state in LIVE_STATES)
    requested = sum(_requested(b) for s in segs for b in s.blocks if b.state in LIVE_STATES)
    return DeviceSummary(device=device_name(device), reserved_bytes=end_res,
                         allocated_bytes=end_alloc, free_in_segments_bytes=free,
                         active_bytes=active, requested_bytes=requested,
                         largest=largest, entries=len(log), oom=oom, caveat=caveat)


def live_rows(rank: int, summary: DeviceSummary, source: str) -> list[dict]:
    """The blocks live at the largest moment grouped by their top frames, largest first."""
    groups: dict[tuple[str, str], list[int]] = {}
    for size, frames in summary.largest.live.values():
        key = (_site(frames), _frames_text(frames))
        g = groups.setdefault(key, [0, 0])
        g[0] += size
        g[1] += 1
    total = summary.largest.allocated_bytes
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    rows = [{"rank": rank, "device": summary.device, "source": source, "site": site,
             "frames": frames, "bytes": b, "blocks": n, "share": b / total if total else None}
            for (site, frames), (b, n) in ranked[:TOP_LIVE]]
    rest = ranked[TOP_LIVE:]
    if rest:
        b = sum(v[0] for _, v in rest)
        rows.append({"rank": rank, "device": summary.device, "source": source,
                     "site": "(other)", "frames": "", "bytes": b,
                     "blocks": sum(v[1] for _, v in rest), "share": b / total if total else None})
    return rows


def analyse(rank: int, snap: Snapshot, source: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(segment rows, live-at-the-largest-moment rows, one summary dict per device) of a
    snapshot read for ``rank`` from the file named ``source``."""
    segments = segment_rows(rank, snap, source)
    live, summaries = [], []
    for d in _devices(snap):
        s = summarise(snap, d)
        live += live_rows(rank, s, source)
        summaries.append({
            "rank": rank, "device": s.device, "source": source,
            "reserved_bytes": s.reserved_bytes, "allocated_bytes": s.allocated_bytes,
            "free_in_segments_bytes": s.free_in_segments_bytes,
            "active_bytes": s.active_bytes, "requested_bytes": s.requested_bytes,
            "largest_allocated_bytes": s.largest.allocated_bytes,
            "largest_reserved_bytes": s.largest.reserved_bytes,
            "largest_at_us": s.largest.time_us, "trace_entries": s.entries,
            "oom": dataclasses.asdict(s.oom) if s.oom else None, "caveat": s.caveat})
    return segments, live, summaries
