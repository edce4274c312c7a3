"""Read one rank's Kineto trace (``.json`` or ``.json.gz``) into an event table.

``load_trace`` returns a ``RankTrace``: the rank, the trace's metadata (every top-level key but
``traceEvents``), and ``events``, a DataFrame with one row per complete event (``ph == "X"``),
in file order:

=========== ======= ============================================================
column      dtype   meaning
=========== ======= ============================================================
name        str     event name
cat         str     Kineto category (``cpu_op``, ``kernel``, ``user_annotation``…)
ts_us       float   start, µs on the trace's clock
dur_us      float   duration, µs (a negative duration is read as 0)
lane        str     ``gpu:<device>:<stream>`` for device events, ``cpu:<pid>:<tid>`` else
device      bool    True for GPU kernels / memcpy / memset
kind        str     one of ``classify.KINDS``
correlation int     launch correlation id linking a GPU event to its CPU runtime
                    call (``cuda_runtime`` / ``cuda_driver``); -1 where absent
end_us      float   ts_us + dur_us
coll_name   str     collective name as the trace spells it (``allreduce``,
                    ``_allgather_base``, ``all_reduce`` from ``gloo:all_reduce``);
                    null on events that carry no collective metadata
in_nelems   Int64   input elements (``In msg nelems``, or ``Input Dims`` of a
                    ``gloo:``/``nccl:`` range); null where unknown
out_nelems  Int64   output elements (``Out msg nelems``); null where unknown
dtype       str     element type, canonical torch name (``float32``, ``bfloat16``);
                    the trace's spelling when unknown
pg_name     str     process group name (``"0"``, ``"3"``)
pg_desc     str     process group description (``default_pg``, ``mesh_tp``…)
pg_ranks    str     global ranks of the group, comma-separated (``"0,1"``)
group_size  Int64   ranks in the group (``Group size``, else the count of pg_ranks)
seq         int     the collective's sequence number in its group (``Seq``); -1
                    where absent
msg_bytes   Int64   bytes S of the collective as nccl-tests defines them:
                    max(in_nelems, out_nelems) × element size; for ranges with only
                    ``Input Dims``, the input tensor's bytes
call_args   str     on ``c10d::`` calls only: their recorded arguments as JSON text,
                    ``{"dims": Input Dims, "types": Input type, "scalars": Concrete
                    Inputs}`` (the peer of a send/recv, the output and input buffers
                    of an all_to_all: ``analysis/comm/instances.py``); null elsewhere
=========== ======= ============================================================

Where the collective metadata comes from is spelled out in ``analysis/comm_meta.py``.

How it is read: the file is inflated and cut into batches of events on the fly
(``analysis/json_stream.py``), so the whole text of a trace is never in memory; each batch is
decoded with msgspec into small typed structs that keep only the fields above (other arguments
are skipped unparsed), its columns are built at once, and classification runs once per distinct
(name, category). A file that cannot be streamed (an unusual layout, or damage) is read whole
instead, which also names what is wrong with it. With ``cache_dir``, the table is stored as
parquet under ``<cache_dir>/<key>.parquet`` with the metadata as JSON in the file's key-value
metadata (``analysis/trace_cache.py``); the key is the BLAKE2b hash of the file's bytes plus the
ingest version and the ``comm_kernel_re`` pattern, so an edited trace or a different pattern is
never served from a stale entry. The rank is not cached: it is worked out on every load.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import pathlib
import re
import zlib
from typing import Any, Iterable

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from meshscope.analysis.ingest import classify
from meshscope.analysis.ingest import comm_meta
from meshscope.analysis.ingest import json_stream
from meshscope.analysis.ingest import cache as trace_cache
from meshscope.analysis.errors import InputError

RANK_FROM_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
# Bump when the table's columns or their meaning change: it is part of the cache key.
INGEST_VERSION = 3
BATCH_EVENTS = 8192             # events per batch when a trace is read whole
BATCH_BYTES = 1 << 19           # text per batch when it is streamed (fastest on a 54 MB trace)
# How many times a trace's JSON was parsed in this process (a cache hit does not parse).
PARSE_COUNT = 0

_NULLABLE_INT = ("in_nelems", "out_nelems", "group_size", "msg_bytes")
SCHEMA = pa.schema([
    ("name", pa.large_string()), ("cat", pa.large_string()), ("ts_us", pa.float64()),
    ("dur_us", pa.float64()), ("lane", pa.large_string()), ("device", pa.bool_()),
    ("kind", pa.large_string()), ("correlation", pa.int64()), ("end_us", pa.float64()),
    ("coll_name", pa.large_string()), ("in_nelems", pa.int64()), ("out_nelems", pa.int64()),
    ("dtype", pa.large_string()), ("pg_name", pa.large_string()),
    ("pg_desc", pa.large_string()), ("pg_ranks", pa.large_string()),
    ("group_size", pa.int64()), ("seq", pa.int64()), ("msg_bytes", pa.int64()),
    ("call_args", pa.large_string()),
])


@dataclasses.dataclass
class RankTrace:
    path: pathlib.Path
    rank: int
    events: pd.DataFrame
    meta: dict

    @property
    def on_gpu(self) -> bool:
        return bool(self.events["device"].any())


class _Args(msgspec.Struct, gc=False):
    """The event arguments ingest reads; every other argument is skipped unparsed."""
    device: Any = None
    stream: Any = None
    correlation: Any = None
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    group_size: Any = msgspec.field(default=None, name="Group size")
    seq: Any = msgspec.field(default=None, name="Seq")
    # Kept undecoded (empty when absent): only gloo:/nccl: ranges' shapes are ever read.
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: _Args | None = None


_DECODE_EVENTS = msgspec.json.Decoder(list[_Event])
# JSON key of each ``_Args`` attribute.
_ARG_KEYS = {f.name: f.encode_name for f in msgspec.structs.fields(_Args)}
_RAW_ARGS = ("input_dims", "input_type", "concrete")


def _read_bytes(path: pathlib.Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror})") from None
    if not raw:
        raise InputError(path, "empty file")
    return raw


def _decompress(path: pathlib.Path, raw: bytes) -> bytes:
    if raw[:2] == json_stream.GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise InputError(path, f"truncated or corrupt gzip ({e})") from None
    return raw


def _json_problem(e: Exception) -> str:
    text = str(e)
    if "truncated" in text.lower() or "unexpected end" in text.lower() or "EOF" in text:
        return "truncated JSON (the file ends early)"
    return f"not valid JSON ({text})"


def _split(path: pathlib.Path, data: bytes) -> tuple[dict, list[msgspec.Raw]]:
    """(metadata, one undecoded slice of ``data`` per event)."""
    try:
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError:
        raise InputError(path, "not a Kineto trace: no 'traceEvents' list") from None
    except msgspec.DecodeError as e:
        raise InputError(path, _json_problem(e)) from None
    events = top.pop("traceEvents", None)
    try:
        if events is None:
            raise msgspec.ValidationError
        raws = msgspec.json.decode(events, type=list[msgspec.Raw])
    except msgspec.ValidationError:
        raise InputError(path, "not a Kineto trace: no 'traceEvents' list") from None
    return {k: msgspec.json.decode(v) for k, v in top.items()}, raws


def compile_rank_regex(pattern: str | re.Pattern | None) -> re.Pattern | None:
    """A ``--rank-regex``: applied with ``re.search`` to the file name; its one group is the
    rank. ValueError when it does not compile or has not exactly one group."""
    if pattern is None or isinstance(pattern, re.Pattern):
        rx = pattern
    else:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"--rank-regex {pattern!r} is not a regular expression ({e})") \
                from None
    if rx is not None and rx.groups != 1:
        raise ValueError(f"--rank-regex {rx.pattern!r} must have exactly one group (the rank), "
                         f"it has {rx.groups}")
    return rx


def rank_of(path: pathlib.Path, doc: dict, rank_regex: re.Pattern | str | None = None) -> int:
    """The rank from ``distributedInfo``, else from the file name: with ``--rank-regex`` its
    group, otherwise ``rank3``, ``rank-3``, ``rank_3`` or ``worker3``."""
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    rx = compile_rank_regex(rank_regex)
    if rx is not None:
        m = rx.search(path.name)
        if m and m.group(1) is not None and m.group(1).isdigit():
            return int(m.group(1))
        raise InputError(path, f"no rank: the trace has no distributedInfo.rank and the file "
                               f"name does not match --rank-regex {rx.pattern!r} with a number")
    m = RANK_FROM_NAME.search(path.name)
    if m:
        return int(m.group(1))
    raise InputError(path, "no rank: the trace has no distributedInfo.rank and the file name "
                           "has no rank<N> or worker<N>; pass --rank-regex with one group that "
                           "captures the rank from the file name (e.g. 'gpu(\\d+)')")


def _floats(values: list, missing: float = np.nan) -> np.ndarray:
    """float64 array; ``missing`` for None, NaN for anything else that is not a number."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        out = np.empty(len(values), dtype=np.float64)
        for i, v in enumerate(values):
            try:
                out[i] = missing if v is None else float(v)
            except (TypeError, ValueError):
                out[i] = np.nan
        return out


def _str_array(values: list) -> pa.Array:
    """Arrow strings; a missing value is \"\" and anything else is written with ``str``."""
    try:
        arr = pa.array(values, pa.large_string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        arr = pa.array([v if isinstance(v, str) else str(v) for v in values], pa.large_string())
    return arr.fill_null("") if arr.null_count else arr


_CPU, _COLON = pa.scalar("cpu", pa.large_string()), pa.scalar(":", pa.large_string())


def _cpu_lanes(pids: list, tids: list) -> pa.Array:
    """``cpu:<pid>:<tid>`` for each event."""
    try:
        p = pc.cast(pa.array(pids), pa.large_string())
        t = pc.cast(pa.array(tids), pa.large_string())
        if not (p.null_count or t.null_count):
            return pc.binary_join_element_wise(_CPU, p, t, _COLON)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    return pa.array([f"cpu:{p}:{t}" for p, t in zip(pids, tids)], pa.large_string())


_DEVICE_CATS = pa.array(sorted(classify.DEVICE_CATS), pa.large_string())
_HOST_META_CATS = pa.array(["gpu_user_annotation"], pa.large_string())


def _batch(evs: list[_Event]) -> tuple[dict[str, pa.Array], list[tuple[int, dict]]] | None:
    """Columns of one batch's complete events, and (row, collective metadata) pairs."""
    xs = [e for e in evs if e.ph == "X"]
    if not xs:
        return None
    ts = _floats([e.ts for e in xs])
    dur = _floats([e.dur for e in xs], missing=0.0)
    keep = ~(np.isnan(ts) | np.isnan(dur))
    if not keep.all():
        xs = [e for e, k in zip(xs, keep) if k]
        ts, dur = ts[keep], dur[keep]
        if not xs:
            return None
    dur = np.maximum(dur, 0.0)
    name = _str_array([e.name for e in xs])
    cat = _str_array([e.cat for e in xs])
    args = [e.args for e in xs]
    device = pc.is_in(cat, value_set=_DEVICE_CATS)
    lane = _cpu_lanes([e.pid for e in xs], [e.tid for e in xs])
    if pc.any(device).as_py():
        gpu = []
        for i in np.flatnonzero(device.to_numpy(zero_copy_only=False)).tolist():
            a, e = args[i], xs[i]
            d = e.pid if a is None or a.device is None else a.device
            s = e.tid if a is None or a.stream is None else a.stream
            gpu.append(f"gpu:{d}:{s}")
        lane = pc.replace_with_mask(lane, device, pa.array(gpu, pa.large_string()))
    found = [(i, comm_meta.from_record(a)) for i, a in enumerate(args)
             if a is not None and a.coll_name is not None]
    prefixed = functools.reduce(pc.or_, (pc.starts_with(name, p)
                                         for p in comm_meta.HOST_PREFIXES))
    host = pc.and_(prefixed, pc.invert(pc.is_in(cat, value_set=_HOST_META_CATS)))
    if pc.any(host).as_py():
        have = {i for i, _ in found}
        for i in np.flatnonzero(host.to_numpy(zero_copy_only=False)).tolist():
            if i in have:
                continue
            a = args[i]
            dims = msgspec.json.decode(a.input_dims) if a and a.input_dims else None
            types = msgspec.json.decode(a.input_type) if a and a.input_type else None
            found.append((i, comm_meta.from_host_range(name[i].as_py(), dims, types)))
    calls = pc.starts_with(name, "c10d::")
    call_args = pa.nulls(len(xs), pa.large_string())
    if pc.any(calls).as_py():
        idx = np.flatnonzero(calls.to_numpy(zero_copy_only=False)).tolist()
        texts = [_call_args_json(args[i]) for i in idx]
        call_args = pc.replace_with_mask(call_args, calls, pa.array(texts, pa.large_string()))
    cols = {
        "name": name, "cat": cat, "ts_us": pa.array(ts), "dur_us": pa.array(dur),
        "call_args": call_args,
        "lane": lane, "device": device,
        "correlation": pa.array([a.correlation if a is not None
                                 and type(a.correlation) is int else -1 for a in args],
                                pa.int64()),
    }
    return cols, found


def _call_args_json(a: _Args | None) -> str | None:
    """``{"dims": …, "types": …, "scalars": …}`` of a ``c10d::`` call: the raw JSON of its
    ``Input Dims``, ``Input type`` and ``Concrete Inputs`` (null for an absent one)."""
    if a is None:
        return None
    parts = [bytes(raw) if raw else b"null" for raw in (a.input_dims, a.input_type, a.concrete)]
    return (b'{"dims":' + parts[0] + b',"types":' + parts[1] + b',"scalars":' + parts[2]
            + b"}").decode("utf-8", "replace")


def _kinds(name: pa.Array, cat: pa.Array, comm_kernel_re: re.Pattern | None) -> pa.Array:
    """``classify.classify`` once per distinct (name, category)."""
    n_enc, c_enc = name.dictionary_encode(), cat.dictionary_encode()
    n_idx = n_enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    c_idx = c_enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    pairs, inverse = np.unique(n_idx * len(c_enc.dictionary) + c_idx, return_inverse=True)
    names, cats = n_enc.dictionary.to_pylist(), c_enc.dictionary.to_pylist()
    ncat = len(cats)
    labels = [classify.classify(names[p // ncat], cats[p % ncat], comm_kernel_re=comm_kernel_re)
              for p in pairs.tolist()]
    return pa.array(labels, pa.large_string()).take(pa.array(inverse.reshape(-1)))


def _meta_columns(n: int, found: list[tuple[int, dict]]) -> dict[str, pa.Array]:
    """Collective metadata columns: null (``seq``: -1) except at the rows in ``found``."""
    found = sorted(found, key=lambda item: item[0])
    mask = np.zeros(n, dtype=bool)
    mask[[i for i, _ in found]] = True
    mask = pa.array(mask)
    out = {}
    for col in comm_meta.COLUMNS:
        kind = SCHEMA.field(col).type
        base = pa.array(np.full(n, -1, dtype=np.int64)) if col == "seq" else pa.nulls(n, kind)
        out[col] = pc.replace_with_mask(base, mask, pa.array([m[col] for _, m in found], kind)) \
            if found else base
    return out


def _lenient(buf: bytes) -> list[_Event]:
    """Events of a batch that the typed decoder refused (an event that is not an object,
    ``args`` that are not an object): decoded generically, odd events skipped."""
    out = []
    for ev in msgspec.json.decode(buf):
        if not isinstance(ev, dict):
            continue
        a = ev.get("args")
        args = None
        if isinstance(a, dict):
            args = _Args(**{attr: msgspec.Raw(msgspec.json.encode(a[key]) if key in a else b"")
                            if attr in _RAW_ARGS else a.get(key)
                            for attr, key in _ARG_KEYS.items()})
        out.append(_Event(ph=ev.get("ph"), name=ev.get("name"), cat=ev.get("cat"),
                          ts=ev.get("ts"), dur=ev.get("dur"), pid=ev.get("pid"),
                          tid=ev.get("tid"), args=args))
    return out


def _decode(text: bytes) -> list[_Event]:
    """The events of a JSON array text; ``msgspec.DecodeError`` when it is not valid JSON."""
    try:
        return _DECODE_EVENTS.decode(text)
    except msgspec.ValidationError:
        return _lenient(text)


def parse_events(batches: Iterable[list[_Event]], *,
                 comm_kernel_re: re.Pattern | None = None) -> pa.Table:
    """The event table (module docstring) of batches of decoded events, as an Arrow table.

    Arrow allocates through the C library's allocator meanwhile: the many short-lived
    per-batch arrays made pyarrow's default (mimalloc) pool hold ~40 MB more at the peak of a
    216k-event trace.
    """
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        return _parse_events(batches, comm_kernel_re)
    finally:
        pa.set_memory_pool(previous)


def _parse_events(batches: Iterable[list[_Event]], comm_kernel_re: re.Pattern | None) -> pa.Table:
    chunks: dict[str, list[pa.Array]] = {}
    found: list[tuple[int, dict]] = []
    n = 0
    for evs in batches:
        got = _batch(evs)
        if got is None:
            continue
        cols, meta = got
        for k, arr in cols.items():
            chunks.setdefault(k, []).append(arr)
        found += [(n + i, m) for i, m in meta]
        n += len(cols["name"])
    if n == 0:
        return SCHEMA.empty_table()
    arrays = {k: pa.concat_arrays(v) for k, v in chunks.items()}
    arrays["end_us"] = pc.add(arrays["ts_us"], arrays["dur_us"])
    arrays["kind"] = _kinds(arrays["name"], arrays["cat"], comm_kernel_re)
    arrays.update(_meta_columns(n, found))
    return pa.Table.from_arrays([arrays[f.name] for f in SCHEMA], schema=SCHEMA)


def _parse(path: pathlib.Path, raw: bytes,
           comm_kernel_re: re.Pattern | None) -> tuple[pa.Table, dict]:
    """(event table, metadata): streamed (``json_stream``), or, for a file that cannot be
    streamed, decompressed whole and split with msgspec (which also names what is wrong with
    a damaged file)."""
    stream = json_stream.EventStream(raw, _decode, batch_bytes=BATCH_BYTES)
    try:
        return parse_events(stream.batches(), comm_kernel_re=comm_kernel_re), stream.meta
    except json_stream.Fallback:
        pass
    return _parse_whole(path, raw, comm_kernel_re)


def _parse_whole(path: pathlib.Path, raw: bytes, comm_kernel_re: re.Pattern | None = None,
                 batch_events: int = BATCH_EVENTS) -> tuple[pa.Table, dict]:
    """The whole-file reader: decompress, split with msgspec, parse ``batch_events`` at a time."""
    data = _decompress(path, raw)
    meta, raws = _split(path, data)
    del data
    batches = (_decode(b"[" + b",".join(raws[i:i + batch_events]) + b"]")
               for i in range(0, len(raws), batch_events))
    return parse_events(batches, comm_kernel_re=comm_kernel_re), meta


def to_frame(table: pa.Table) -> pd.DataFrame:
    """The pandas events table of an Arrow one (str columns, nullable Int64 where documented)."""
    df = table.to_pandas()
    for col in _NULLABLE_INT:
        df[col] = table.column(col).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    return df


def _cache_key(raw: bytes, comm_kernel_re: re.Pattern | None) -> str:
    extra = f"v{INGEST_VERSION}" + (f"|{comm_kernel_re.pattern}" if comm_kernel_re else "")
    return trace_cache.key(raw, extra)


def load_trace(path: pathlib.Path, *, comm_kernel_re: re.Pattern | None = None,
               rank_regex: re.Pattern | str | None = None,
               cache_dir: pathlib.Path | None = None) -> RankTrace:
    """One rank's trace as a ``RankTrace``; ``InputError`` naming the file when unusable.

    ``rank_regex``: see ``rank_of``. ``cache_dir``: where parquet copies of event tables are
    kept (created on first use; a cache that cannot be read or written is ignored).
    """
    global PARSE_COUNT
    path = pathlib.Path(path)
    raw = _read_bytes(path)
    key = _cache_key(raw, comm_kernel_re) if cache_dir is not None else None
    hit = trace_cache.read(cache_dir, key) if key else None
    if hit is not None:
        table, meta = hit
    else:
        PARSE_COUNT += 1
        table, meta = _parse(path, raw, comm_kernel_re)
        del raw
        if table.num_rows == 0:
            raise InputError(path, "the trace has no complete ('X') events")
        if key:
            trace_cache.write(cache_dir, key, table, meta)
    return RankTrace(path=path, rank=rank_of(path, meta, rank_regex), events=to_frame(table),
                     meta=meta)
