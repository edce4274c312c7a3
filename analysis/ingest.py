"""Read one rank's Kineto trace (``.json`` or ``.json.gz``) into an event table.

``load_trace`` returns a ``RankTrace``: the rank, the trace's metadata, and ``events``, a
DataFrame with one row per complete event (``ph == "X"``):

========== ======= ============================================================
column     dtype   meaning
========== ======= ============================================================
name       str     event name
cat        str     Kineto category (``cpu_op``, ``kernel``, ``user_annotation``…)
ts_us      float   start, µs on the trace's clock
dur_us     float   duration, µs
end_us     float   ts_us + dur_us
lane       str     ``gpu:<device>:<stream>`` for device events, ``cpu:<pid>:<tid>`` else
device     bool    True for GPU kernels / memcpy / memset
kind       str     one of ``classify.KINDS``
correlation int    launch correlation id linking a GPU event to its CPU runtime
                   call (``cuda_runtime`` / ``cuda_driver``); -1 where absent
========== ======= ============================================================
"""
from __future__ import annotations

import dataclasses
import gzip
import pathlib
import re
import zlib

import orjson
import pandas as pd

from . import classify
from .errors import InputError

RANK_FROM_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


@dataclasses.dataclass
class RankTrace:
    path: pathlib.Path
    rank: int
    events: pd.DataFrame
    meta: dict

    @property
    def on_gpu(self) -> bool:
        return bool(self.events["device"].any())


def _read_bytes(path: pathlib.Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror})") from None
    if not raw:
        raise InputError(path, "empty file")
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise InputError(path, f"truncated or corrupt gzip ({e})") from None
    return raw


def read_trace_json(path: pathlib.Path) -> dict:
    data = _read_bytes(path)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        kind = "truncated JSON (the file ends early)" if "unexpected end" in str(e).lower() \
            or "EOF" in str(e) else f"not valid JSON ({e})"
        raise InputError(path, kind) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(path, "not a Kineto trace: no 'traceEvents' list")
    return doc


def rank_of(path: pathlib.Path, doc: dict) -> int:
    """The rank from ``distributedInfo``, else from the file name (rank3, rank-3, worker3)."""
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    m = RANK_FROM_NAME.search(path.name)
    if m:
        return int(m.group(1))
    raise InputError(path, "no rank: the trace has no distributedInfo.rank and the file name "
                           "has no rank<N> or worker<N>")


def _lane(ev: dict, device: bool) -> str:
    if device:
        args = ev.get("args") or {}
        return f"gpu:{args.get('device', ev.get('pid'))}:{args.get('stream', ev.get('tid'))}"
    return f"cpu:{ev.get('pid')}:{ev.get('tid')}"


def load_trace(path: pathlib.Path, *, comm_kernel_re: re.Pattern | None = None) -> RankTrace:
    path = pathlib.Path(path)
    doc = read_trace_json(path)
    rank = rank_of(path, doc)
    rows = {k: [] for k in ("name", "cat", "ts_us", "dur_us", "lane", "device", "kind",
                            "correlation")}
    for ev in doc["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        name, cat = str(ev.get("name", "")), str(ev.get("cat", ""))
        device = cat in classify.DEVICE_CATS
        rows["name"].append(name)
        rows["cat"].append(cat)
        rows["ts_us"].append(ts)
        rows["dur_us"].append(max(dur, 0.0))
        rows["lane"].append(_lane(ev, device))
        rows["device"].append(device)
        rows["kind"].append(classify.classify(name, cat, comm_kernel_re=comm_kernel_re))
        corr = (ev.get("args") or {}).get("correlation", -1)
        rows["correlation"].append(corr if isinstance(corr, int) else -1)
    if not rows["name"]:
        raise InputError(path, "the trace has no complete ('X') events")
    events = pd.DataFrame(rows)
    events["end_us"] = events["ts_us"] + events["dur_us"]
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    return RankTrace(path=path, rank=rank, events=events, meta=meta)
