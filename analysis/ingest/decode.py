"""The typed records a trace's events are decoded into, and the decoders.

msgspec decodes a batch's JSON text (a JSON array of events) straight into small typed
structs: ``Event`` (``ph``, ``name``, ``cat``, ``ts``, ``dur``, ``pid``, ``tid``, ``args``) and
``Args``, which names only the arguments ingest reads (device and stream, ``correlation``, the
collective metadata, the shapes of ``gloo:``/``nccl:`` ranges and of ``c10d::`` calls and
GEMMs, the allocator's ``[memory]`` fields). Every other argument is skipped unparsed, and the
shapes are kept as raw JSON text (``msgspec.Raw``) until something reads them: several times
faster than building a dict per event.

``decode`` is the one entry point (the streaming reader, ``json_stream.EventStream``, calls it
on each batch it cuts, and takes ``msgspec.DecodeError`` for a wrong cut). A batch of real
trace events is decoded typed in one go. A batch the typed decoder refuses falls back to
``_lenient`` (decoded generically; an element of ``traceEvents`` that is not an object is
dropped), and one holding a number beyond the decoder's range or an element nested deeper
than its limit (about 1,000 levels) to ``_one_by_one``, which drops just those elements. What
is dropped is counted (``Decoded.damage``, ``validate.Damage``).

Also here, what reads a raw argument's value: ``raw_value`` (None, counted, where it is not
decodable) and ``call_args_text``, the ``call_args`` column's JSON text of a ``c10d::`` call or
a GEMM (``{"dims": …, "types": …, "scalars": …}``; null where one of them holds an integer
beyond 64 bits or nests deeper than 8 levels), remembered by its text because the same shapes
repeat every step.
"""
from __future__ import annotations

from typing import Any

import msgspec

from meshscope.analysis.ingest import json_split
from meshscope.analysis.ingest import validate
from meshscope.analysis.ingest.validate import Damage


class Args(msgspec.Struct, gc=False):
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
    # PyTorch 1.8 spelled it with a small d (``dims``: whichever is there).
    input_dims_18: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")
    # The allocator's ``[memory]`` events (``memory_events.py``).
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    mem_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    mem_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    mem_addr: Any = msgspec.field(default=None, name="Addr")
    mem_device_type: Any = msgspec.field(default=None, name="Device Type")
    mem_device_id: Any = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: Args | None = None


_DECODE_EVENTS = msgspec.json.Decoder(list[Event])
# JSON key of each ``Args`` attribute.
ARG_KEYS = {f.name: f.encode_name for f in msgspec.structs.fields(Args)}
RAW_ARGS = ("input_dims", "input_dims_18", "input_type", "concrete")


def dims(a: Args) -> msgspec.Raw:
    """``Input Dims`` of an event's arguments, or PyTorch 1.8's ``Input dims``."""
    return a.input_dims or a.input_dims_18


def why(e: Exception) -> str:
    """msgspec's reason without the place it names (``Number out of range - at `$[0]```)."""
    return str(e).split(" - at ")[0] or type(e).__name__


def raw_value(raw: msgspec.Raw, key: str, damage: Damage):
    """The decoded value of an argument kept undecoded; None when absent or not decodable (a
    number beyond the decoder's range: counted)."""
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as e:
        damage.ignore(f"args.{key}", f"not decodable: {why(e)}")
        return None


def _in_range(value) -> bool:
    """Whether a decoded argument holds only integers within 64 bits, finite floats, strings,
    booleans and None, nested at most 8 levels (what the recorded shapes and scalars are)."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if type(v) is int:
            if not -validate.INT64_MAX <= v <= validate.INT64_MAX:
                return False
        elif isinstance(v, list):
            if d >= 8:
                return False
            stack.extend((x, d + 1) for x in v)
        elif isinstance(v, dict):
            if d >= 8:
                return False
            stack.extend((x, d + 1) for x in v.values())
    return True


_CALL_ARG_KEYS = (("input_dims", "Input Dims"), ("input_type", "Input type"),
                  ("concrete", "Concrete Inputs"))


def _call_args_json(a: Args | None, damage: Damage) -> str | None:
    """``{"dims": …, "types": …, "scalars": …}`` of a ``c10d::`` call: the raw JSON of its
    ``Input Dims``, ``Input type`` and ``Concrete Inputs`` (null for an absent one); null
    altogether when one of them is not decodable or holds a number beyond 64 bits (counted)."""
    if a is None:
        return None
    parts = []
    for attr, key in _CALL_ARG_KEYS:
        raw = dims(a) if attr == "input_dims" else getattr(a, attr)
        if not raw:
            parts.append(b"null")
            continue
        value = raw_value(raw, key, damage)
        if value is None and bytes(raw).strip() != b"null":
            return None
        if not _in_range(value):
            damage.ignore(f"args.{key}", "an integer beyond 64 bits or nesting deeper than "
                                         "8 levels")
            return None
        parts.append(bytes(raw))
    return (b'{"dims":' + parts[0] + b',"types":' + parts[1] + b',"scalars":' + parts[2]
            + b"}").decode("utf-8", "replace")


# ``_call_args_json`` of argument texts already met without damage: the same shapes repeat
# every step (a GEMM's, a bucket's), and checking each one's values costs more than decoding
# it. Emptied when it reaches ``_CALL_ARGS_CACHE`` entries.
_CALL_ARGS: dict[tuple, str | None] = {}
_CALL_ARGS_CACHE = 1 << 16


def call_args_text(a: Args | None, damage: Damage) -> str | None:
    """``_call_args_json(a, damage)``, remembered by the three texts it reads."""
    if a is None:
        return None
    key = (bytes(dims(a)), bytes(a.input_type), bytes(a.concrete))
    hit = _CALL_ARGS.get(key, _CALL_ARGS)
    if hit is not _CALL_ARGS:
        return hit
    own = Damage()
    text = _call_args_json(a, own)
    if own:
        damage.update(own)
    else:
        if len(_CALL_ARGS) >= _CALL_ARGS_CACHE:
            _CALL_ARGS.clear()
        _CALL_ARGS[key] = text
    return text


# -- decoding --------------------------------------------------------------------------------

class Decoded(list):
    """Events of a batch that could not be decoded in one go, with what had to be dropped
    (``damage``: elements that are not objects, hold a number beyond the decoder's range or
    are nested deeper than its limit)."""

    def __init__(self, events=(), damage: Damage | None = None):
        super().__init__(events)
        self.damage = damage if damage is not None else Damage()


_DECODE_EVENT = msgspec.json.Decoder(Event)


def _lenient(buf) -> Decoded:
    """Events of a batch that the typed decoder refused (an event that is not an object,
    ``args`` that are not an object): decoded generically, odd elements dropped and
    counted."""
    out = Decoded()
    for ev in msgspec.json.decode(buf):
        if not isinstance(ev, dict):
            out.damage.drop("traceEvents", "an element that is not an object")
            continue
        a = ev.get("args")
        args = None
        if isinstance(a, dict):
            args = Args(**{attr: msgspec.Raw(msgspec.json.encode(a[key]) if key in a else b"")
                           if attr in RAW_ARGS else a.get(key)
                           for attr, key in ARG_KEYS.items()})
        out.append(Event(ph=ev.get("ph"), name=ev.get("name"), cat=ev.get("cat"),
                         ts=ev.get("ts"), dur=ev.get("dur"), pid=ev.get("pid"),
                         tid=ev.get("tid"), args=args))
    return out


def _one_by_one(text) -> Decoded:
    """The events of a batch decoded one at a time (the batch holds an element nested deeper
    than the decoder's limit, or a number beyond its range): such elements are dropped and
    counted. ``msgspec.DecodeError`` when the text is not one JSON array."""
    text = bytes(text)
    out = Decoded()
    for a, b in json_split.split_top(text):
        piece = text[a:b]
        try:
            out.append(_DECODE_EVENT.decode(piece))
            continue
        except msgspec.ValidationError:
            pass
        except RecursionError:
            out.damage.drop("traceEvents", "nested deeper than the decoder's limit")
            continue
        try:
            got = _lenient(b"[" + piece + b"]")
        except RecursionError:
            out.damage.drop("traceEvents", "nested deeper than the decoder's limit")
            continue
        except msgspec.ValidationError as e:
            out.damage.drop("traceEvents", f"not decodable: {why(e)}")
            continue
        out.extend(got)
        out.damage.update(got.damage)
    return out


def decode(text) -> list[Event]:
    """The events of a JSON array text; ``msgspec.DecodeError`` when it is not valid JSON
    (how the streaming reader recognises a wrong cut). Typed in one go when it can be (all real
    traces), else generically, else one element at a time."""
    try:
        return _DECODE_EVENTS.decode(text)
    except msgspec.ValidationError:
        pass
    except RecursionError:
        return _one_by_one(text)
    try:
        return _lenient(text)
    except (msgspec.ValidationError, RecursionError):
        return _one_by_one(text)
