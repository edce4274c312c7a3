"""A trace file's bytes, and the whole-file reader's document: its metadata and its events.

``read_bytes`` reads the file the way every reader of a trace starts: only a regular file
(opened without blocking, so a FIFO cannot hang the reader, and checked before a byte is read,
so a device is never read), no larger than the ``trace_bytes`` budget, not empty; else
``InputError`` naming the file. A ``.json.gz`` is held as it is stored; an uncompressed trace
is compressed as it is read, a MiB at a time (``Packed``: gzip, ISA-L's fastest level), and
is from then on read as a compressed one — streamed, never held as text. So the memory a
plain trace costs is that of its compressed form, as for a ``.json.gz``: about a tenth of its
text, a thousandth of white space (issue 46, case 9: 1 GiB of white space in a
``.pt.trace.json`` was held whole, 1.14 GB of RSS). The cache key (``ingest/cache.py``) of a
plain trace is then the hash of that compressed form: a function of the text, as before, only
another one (a plain trace cached by an earlier version is parsed once more).

Most traces are then streamed (``analysis/ingest/json_stream.py``). A file that cannot be
streamed (an unusual layout, or damage) is read whole instead, which also names what is wrong
with it: ``decompress`` inflates it, refusing one whose text would pass ``WHOLE_TEXT_LIMIT`` or
the rank's memory budget, and ``split`` cuts the text with msgspec into the metadata (every
top-level key but ``traceEvents``) and one undecoded slice per event. A bare JSON array of
events (Chrome's JSON Array Format, its closing ``]`` optional) is a trace without metadata
(None). A file that is not JSON, ends early, or holds no ``traceEvents`` list is refused
(``json_problem``, ``InputError``); a value nested deeper than the decoder's limit is split by
hand (``json_split.split_top``, ``split_members``), and a metadata key that cannot be decoded
is left out and counted (``validate.Damage``).
"""
from __future__ import annotations

import os
import pathlib

import msgspec

from meshscope.analysis.ingest import budgets as _budgets
from meshscope.analysis.ingest import decode
from meshscope.analysis.ingest import json_nesting
from meshscope.analysis.ingest import json_split
from meshscope.analysis.ingest import json_stream
from meshscope.analysis.ingest.budgets import BudgetExceeded
from meshscope.analysis.ingest.validate import Damage
from meshscope.analysis.errors import InputError
from meshscope.collectors.run_dir import not_regular

WHOLE_TEXT_LIMIT = 4 << 30      # a trace that cannot be streamed is read whole up to this size


class Packed(bytes):
    """An uncompressed trace as ``read_bytes`` holds it: its text gzip-compressed as it was
    read; ``text_bytes``, the size of that text (the file's size, as read)."""
    text_bytes: int


# An uncompressed trace is read and compressed this much at a time (``read_bytes``).
READ_BYTES = 1 << 20
# The compression level of ``Packed``: ISA-L's level 1 (about 10 times smaller for a trace's
# JSON, a thousand for white space, at the speed of a disk); zlib's 1 without ISA-L.
PACK_LEVEL = 1


def _compressor():
    try:
        from isal import isal_zlib
        return isal_zlib.compressobj(PACK_LEVEL, isal_zlib.DEFLATED, 16 + isal_zlib.MAX_WBITS)
    except ImportError:     # pragma: no cover - isal is a dependency, but optional in principle
        import zlib
        return zlib.compressobj(PACK_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)


def read_bytes(path: pathlib.Path) -> bytes:
    """The file's bytes: a gzip file's as they are stored, an uncompressed file's compressed
    as they are read (``Packed``: never held as text); only a regular file is read (opened
    without blocking, so a FIFO cannot hang the reader, and checked before a byte is read, so
    a device is never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        kind = not_regular(st.st_mode)
        if kind:
            raise InputError(path, f"skipped: {kind}, not a regular file")
        limit = _budgets.current().trace_bytes
        if st.st_size > limit:
            raise InputError(path, str(BudgetExceeded(
                "trace_bytes", f"a file of {st.st_size:,} bytes", limit)))
        with os.fdopen(os.dup(fd), "rb") as f:
            if f.read(2) == json_stream.GZIP_MAGIC:
                f.seek(0)
                raw = f.read()
            else:
                f.seek(0)
                raw = _pack(path, f, limit)
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror})") from None
    finally:
        os.close(fd)
    if not raw:
        raise InputError(path, "empty file")
    return raw


def _pack(path: pathlib.Path, f, limit: int) -> bytes:
    """The text of the open file ``f``, compressed ``READ_BYTES`` at a time (``Packed``); empty
    bytes for an empty file. What is held: one piece of text and the compressed text (twice,
    for a moment, at the end)."""
    buf = bytearray(READ_BYTES)
    out = bytearray()
    z, size = _compressor(), 0
    with memoryview(buf) as view:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            size += n
            if size > limit:        # the file grew past the budget while it was read
                raise InputError(path, str(BudgetExceeded(
                    "trace_bytes", f"a file of more than {limit:,} bytes", limit)))
            out += z.compress(view[:n])
    if not size:
        return b""
    out += z.flush()
    packed = Packed(out)
    del out
    packed.text_bytes = size
    return packed


def decompress(path: pathlib.Path, raw: bytes) -> bytes | bytearray:
    """The text of ``raw``, for the whole-file reader: at most ``WHOLE_TEXT_LIMIT`` bytes (a
    file that cannot be streamed and inflates beyond it is refused, never held)."""
    b = _budgets.current()
    limit = min(WHOLE_TEXT_LIMIT, b.rank_memory, b.trace_bytes)
    plain = raw[:2] != json_stream.GZIP_MAGIC
    # The text's size where it is known: a plain text's, or an uncompressed file's (``Packed``)
    size = len(raw) if plain else getattr(raw, "text_bytes", None)
    if size is not None and size > limit:
        raise InputError(path, str(BudgetExceeded(
            "rank_memory", f"cannot be streamed and is more than {limit:,} bytes", limit)))
    if plain:
        try:
            for _ in json_nesting.checked(json_stream.chunks(raw, 1 << 24, limit), b.nesting):
                pass
        except BudgetExceeded as e:
            raise InputError(path, str(e)) from None
        return raw
    text = bytearray()
    try:
        for piece in json_nesting.checked(json_stream.chunks(raw, 1 << 24, limit), b.nesting):
            text += piece
    except BudgetExceeded as e:
        if e.budget == "nesting":
            raise InputError(path, str(e)) from None
        raise InputError(path, str(BudgetExceeded(
            "rank_memory", f"cannot be streamed and inflates to more than {limit:,} bytes",
            limit))) from None
    except json_stream.Fallback as e:
        raise InputError(path, f"truncated or corrupt gzip ({e})") from None
    return text


def json_problem(e: Exception) -> str:
    text = str(e)
    if "truncated" in text.lower() or "unexpected end" in text.lower() or "EOF" in text \
            or "does not end" in text:
        return "truncated JSON (the file ends early)"
    return f"not valid JSON ({text})"


_NOT_KINETO = ("not a Kineto trace: no 'traceEvents' list (nor is it a JSON array of "
               "events)")


def _split_array(path: pathlib.Path, data) -> list:
    """One undecoded slice per event of a bare JSON array of events (Chrome's JSON Array
    Format), whose closing ``]`` may be missing."""
    original = text = bytes(data).rstrip()
    if not text.endswith(b"]"):
        text = text.rstrip(b",").rstrip() + b"]"
    try:
        return msgspec.json.decode(text, type=list[msgspec.Raw])
    except msgspec.ValidationError:
        raise InputError(path, _NOT_KINETO) from None
    except msgspec.DecodeError:
        pass
    except RecursionError:
        try:
            return [text[a:b] for a, b in json_split.split_top(text)]
        except msgspec.DecodeError:
            pass
    try:        # what is wrong with the file as it is: it ends early, or text follows
        msgspec.json.decode(original)
    except (msgspec.DecodeError, RecursionError) as e:
        raise InputError(path, json_problem(e)) from None
    raise InputError(path, _NOT_KINETO)


def split(path: pathlib.Path, data) -> tuple[dict | None, list, Damage]:
    """(metadata, one undecoded slice of ``data`` per event, metadata keys left out); the
    metadata is None for a bare array of events."""
    damage = Damage()
    if bytes(data[:4096]).lstrip()[:1] == b"[":
        return None, _split_array(path, data), damage
    try:
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError:
        raise InputError(path, _NOT_KINETO) from None
    except msgspec.DecodeError as e:
        raise InputError(path, json_problem(e)) from None
    except RecursionError:                  # nested deeper than the decoder goes: split by hand
        try:
            top = dict(json_split.split_members(data))
        except msgspec.DecodeError as e:
            raise InputError(path, json_problem(e)) from None
    events = top.pop("traceEvents", None)
    try:
        if events is None:
            raise msgspec.ValidationError
        raws = msgspec.json.decode(events, type=list[msgspec.Raw])
    except msgspec.ValidationError:
        raise InputError(path, _NOT_KINETO) from None
    except RecursionError:
        text = bytes(events)
        try:
            raws = [text[a:b] for a, b in json_split.split_top(text)]
        except msgspec.DecodeError as e:
            raise InputError(path, json_problem(e)) from None
    meta = {}
    for key, value in top.items():
        try:
            meta[key] = msgspec.json.decode(value)
        except RecursionError:
            damage.note(key, "nested deeper than the decoder's limit")
        except msgspec.DecodeError as e:    # a number beyond the decoder's range
            damage.note(key, f"not decodable: {decode.why(e)}")
    return meta, raws, damage
