"""Read a Kineto trace's events in batches while decompressing, never holding the whole text.

A trace is one JSON object whose ``traceEvents`` array holds nearly all of its bytes (54 MB of
text in a 2.9 MB ``.json.gz`` of 216k events; gigabytes for long GPU runs).
``EventStream(raw, decode)`` inflates the file half a MB at a time and yields the array's
elements in batches of complete events (about ``batch_bytes`` of text each, decoded by
``decode``); afterwards ``.meta`` holds every other top-level key. Memory stays at a few
batches, whatever the size of the trace (the compressed file itself is held whole).

How elements are cut out without a JSON parser of its own: a cut is tried after a ``}`` that
is followed by ``,`` or ``]`` (or by the end of the text read so far), and it is accepted only
when ``[`` + the text up to it + ``]`` decodes: that text is then a sequence of complete JSON
values, so the cut cannot lie inside a string or a nested object. The ``traceEvents`` key
is accepted the same way: only if the text before it, closed as ``"traceEvents":[]}``, is a
valid object, i.e. it is a key of the top-level object. Anything unexpected (no such key, an
element that never ends, a truncated or corrupt file) raises ``Fallback``: the caller then reads
the file the plain way, which also gives the canonical error message.

White space costs no memory wherever JSON allows it, so that padding a trace with it (a
gigabyte of it: issue 46, case 9) is streamed, never held: between events it is skipped as the
batches are cut (``_fill``); before the document, it is dropped; elsewhere in the text before
``traceEvents`` and after it (the metadata), a piece of text that is only white space and
does not lie inside a string (``_Spaces``) is kept as one space.

A file whose text starts with ``[`` is Chrome's *JSON Array Format*: the array of events itself,
without metadata (``layout`` is then ``"array"``, ``meta`` empty); as that format allows, the
closing ``]`` may be missing (a trace written by a process that was stopped), and a trailing
comma is accepted.

The nesting budget is checked on the text as it is inflated, before any of it is decoded
(``json_nesting.py``): all of it by ``batches``; by ``parts`` the text before ``traceEvents``,
each part's own text left to its reader.

``EventStream.parts`` cuts the text of ``traceEvents`` into large parts at event boundaries
without decoding them, for reading in other processes (``analysis/ingest/parts.py``), where
``batches_in`` decodes a part batch by batch in place.
"""
from __future__ import annotations

import re
import zlib
from typing import Callable, Iterator

import msgspec

from meshscope.analysis.ingest import json_nesting
from meshscope.analysis.ingest.budgets import BudgetExceeded, Budgets, current as _budgets
from meshscope.analysis.ingest.json_split import WHITE_SPACE

try:  # ISA-L's inflate: the same gzip, about twice as fast as zlib's
    from isal import isal_zlib as inflate
except ImportError:  # pragma: no cover - isal is a dependency, but optional in principle
    inflate = zlib

GZIP_MAGIC = b"\x1f\x8b"
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SPACE = re.compile(rb"[ \t\r\n]*")
HEAD_LIMIT = 64 << 20          # the traceEvents key must appear within this much text
KEY_TRIES = 16                 # "traceEvents" keys tried (inside strings they are not the key)
CUT_TRIES = 16                 # "}" tried per cut (inside strings they do not end an event)


class Fallback(Exception):
    """The stream cannot be read this way; read the whole file instead."""


def chunks(raw, size: int = 1 << 19, limit: int | None = None) -> Iterator[bytes]:
    """The text of ``raw`` (gzip, possibly multi-member, or plain), ``size`` bytes at most at a
    time; ``BudgetExceeded`` as soon as it has inflated beyond ``limit`` bytes (default: the
    ``trace_bytes`` budget), never after."""
    limit = _budgets().trace_bytes if limit is None else limit
    view = memoryview(raw)
    if len(view) > limit:
        raise BudgetExceeded("trace_bytes", f"a file of more than {limit:,} bytes", limit)
    if bytes(view[:2]) != GZIP_MAGIC:
        for start in range(0, len(view), size):
            yield bytes(view[start:start + size])
        return
    member, total = 0, 0
    try:
        while True:
            d, offset = inflate.decompressobj(16 + zlib.MAX_WBITS), member
            while offset < len(view) and not d.eof:
                piece = view[offset:offset + max(size // 8, 1 << 12)]
                offset += len(piece)
                while piece and not d.eof:
                    out = d.decompress(piece, size)
                    if out:
                        total += len(out)
                        if total > limit:
                            raise BudgetExceeded("trace_bytes", "inflates to more than "
                                                 f"{limit:,} bytes", limit)
                        yield out
                    piece = d.unconsumed_tail
            if not d.eof:
                raise Fallback("truncated gzip")
            member = offset - len(d.unused_data)
            if bytes(view[member:member + 2]) != GZIP_MAGIC:
                return
    except (zlib.error, inflate.error, EOFError, OSError) as e:
        raise Fallback(f"corrupt gzip ({e})") from None


def _metadata(prefix: bytes, tail: bytes) -> dict:
    """The trace's top-level keys but ``traceEvents``: the text before the events
    (``prefix``, up to the key) and after them (``tail``) decoded as one object."""
    try:
        meta = msgspec.json.decode(prefix + b'"traceEvents":[]' + tail)
    except (msgspec.DecodeError, RecursionError):
        raise Fallback("the metadata is not valid JSON, or nested too deeply") from None
    meta.pop("traceEvents", None)
    return meta


def _is_object(text: bytes) -> bool:
    try:
        return isinstance(msgspec.json.decode(text), dict)
    except (msgspec.DecodeError, RecursionError):
        return False


class EventStream:
    """``EventStream(raw, decode).batches()`` yields ``decode(b"[...]")`` for consecutive
    batches of events; ``decode`` must raise ``msgspec.DecodeError`` for a text that is not
    one complete JSON array (that is how a wrong cut is recognised). ``meta`` is set once the
    batches are exhausted."""

    def __init__(self, raw, decode: Callable[[bytes], list] | None, *,
                 batch_bytes: int = 1 << 19, budgets: Budgets | None = None):
        self.budgets = budgets or _budgets()
        self._raw = raw
        self._chunks = json_nesting.checked(chunks(raw, batch_bytes, self.budgets.trace_bytes),
                                            self.budgets.nesting)
        self._decode = decode
        self._batch_bytes = batch_bytes
        self.meta: dict | None = None
        self._padding: bool | None = None   # a run of white space being read: outside strings?
        self.layout: str | None = None      # "object" (Kineto) or "array" (JSON Array Format)
        # How deep the events lie (``parts``): 2 in a Kineto object, 1 in a bare array.
        self.events_depth: int | None = None

    def _head(self) -> tuple[bytes | None, bytearray]:
        """(text before the ``"traceEvents"`` key, text after its ``[``); (None, text after the
        ``[``) for a bare array. The text is searched each time it has doubled, each key
        candidate tried once (at most ``KEY_TRIES``): linear in the text, whatever it holds."""
        head, tried, want, done = bytearray(), set(), 0, False
        spaces = _Spaces()
        while not done:
            chunk = next(self._chunks, None)
            if chunk is None:
                done = True
            else:
                if not head:        # white space before the document: dropped
                    chunk = chunk[_SPACE.match(chunk).end():]
                    if not chunk:
                        continue
                head += spaces.kept(chunk, head)
                if len(head) < want and len(head) <= HEAD_LIMIT:
                    continue
            want = 2 * len(head)
            if self.layout is None:
                first = bytes(head[:1])
                if first == b"[":
                    self.layout = "array"
                    return None, head[head.index(b"[") + 1:]
                self.layout = "object"
            for m in _KEY.finditer(head):
                if m.start() in tried:
                    continue
                tried.add(m.start())
                if _is_object(bytes(head[:m.start()]) + b'"traceEvents":[]}'):
                    return bytes(head[:m.start()]), head[m.end():]
                if len(tried) >= KEY_TRIES:
                    raise Fallback("no top-level traceEvents array found")
            if len(head) > HEAD_LIMIT:
                break
        raise Fallback("no top-level traceEvents array found")

    def batches(self, keep_tail: bool = False) -> Iterator[list]:
        """The decoded batches; with ``keep_tail`` (a bare array that is the last part of a file,
        ``parts``) the text after the array's ``]`` is kept in ``tail`` rather than refused
        (None when the array does not end)."""
        self.tail = None
        prefix, rest = self._head()
        limit = self.budgets.event_bytes
        # One spare byte in front, so that every batch has a byte before it to hold its "[".
        buf = bytearray(b" ") + rest
        done, first = False, True
        while True:
            buf, done, first, start = self._fill(buf, self._batch_bytes, done, first)
            if start < len(buf) and buf[start] == 0x5D:           # "]": the array ends
                break
            got = _cut_before(buf, start, len(buf), len(buf), _BETWEEN_OR_AFTER_EVENTS,
                              self._decode)
            if got is None:
                if done and prefix is None and not bytes(buf[start:]).strip(WHITE_SPACE + b","):
                    self.meta = {}                  # a bare array without its closing "]"
                    return
                if done:
                    raise Fallback("the trace ends inside traceEvents")
                done = self._read_more(buf, start, limit)     # no complete event yet
                continue
            events, end = got
            # A new buffer for what follows: decoded events may still point into this one.
            buf = bytearray(buf[end:])
            yield events
            first = False
        tail = bytearray(buf[start + 1:])
        meta_limit = max(HEAD_LIMIT, limit)
        spaces = _Spaces(tail)
        for chunk in self._chunks:
            tail += spaces.kept(chunk, tail)
            if len(tail) > meta_limit:
                raise BudgetExceeded("event_bytes", f"more than {meta_limit:,} bytes of "
                                     f"metadata after traceEvents", meta_limit)
        tail = bytes(tail)
        if prefix is None:                          # a bare array: nothing may follow it
            if keep_tail:
                self.tail = tail
            elif tail.strip(WHITE_SPACE):
                raise Fallback("text after the array of events")
            self.meta = {}
            return
        self.meta = _metadata(prefix, tail)

    def parts(self, part_bytes: int) -> Iterator[tuple[bytes, bool]]:
        """The text of ``traceEvents`` in consecutive parts of about ``part_bytes`` —
        ``(text, last)`` —, for reading in other processes (``analysis/ingest/parts.py``).
        Each part but the last is a run of whole events separated by commas; it ends at the
        first ``}`` past three quarters of its size that is followed by a comma and the ``{``
        of the next event: a cut not checked by decoding here (that is the work the other
        processes are there for); a cut inside a string or an event leaves parts that do not
        decode, which their readers find. The last part is the rest of the file: the last
        events, the end of the array and the metadata after it (``batches(keep_tail=True)``
        reads it); ``meta`` is set by ``set_tail`` with that text.

        The nesting budget is checked here on the text before ``traceEvents``; each part's
        own nesting (the last one's metadata included) is for its reader to check, from
        ``events_depth``, the depth at which the events lie. Memory: a part and the text read
        ahead of it."""
        self._chunks = chunks(self._raw, self._batch_bytes, self.budgets.trace_bytes)
        self._padding = None
        prefix, rest = self._head()
        self._prefix = prefix
        nesting = json_nesting.Nesting(self.budgets.nesting)
        nesting.feed(b"[" if prefix is None else prefix + b'"traceEvents":[')
        if nesting.in_string or nesting.depth != (1 if prefix is None else 2):
            raise Fallback("the text before traceEvents does not end at the top level")
        self.events_depth = nesting.depth
        limit = self.budgets.event_bytes
        buf = bytearray(b" ") + rest
        done, first = False, True
        while True:
            buf, done, first, start = self._fill(buf, part_bytes, done, first)
            if done:
                with memoryview(buf) as view:
                    text = bytes(view[start:])
                del buf
                yield text, True
                return
            m = _NEXT_EVENT.search(buf, start + part_bytes * 3 // 4)
            if m is None:
                done = self._read_more(buf, start, limit)     # no cut in reach yet
                continue
            with memoryview(buf) as view:
                text = bytes(view[start:m.start() + 1])
            del buf[:m.start() + 1]
            yield text, False
            del text
            first = False

    def set_tail(self, tail: bytes | None) -> None:
        """``meta`` from the text after the events (``parts``' last part's reader has it:
        ``tail``; None for a bare array whose closing ``]`` is missing)."""
        prefix = self._prefix
        if prefix is None:
            if tail is not None and tail.strip(WHITE_SPACE):
                raise Fallback("text after the array of events")
            self.meta = {}
            return
        if tail is None:
            raise Fallback("the trace ends inside traceEvents")
        self.meta = _metadata(prefix, tail)

    def _fill(self, buf: bytearray, size: int, done: bool, first: bool
              ) -> tuple[bytearray, bool, bool, int]:
        """``(buf, done, first, start)``: ``buf`` (text of ``traceEvents``, one spare byte in
        front) read on until it holds ``size`` bytes or the file has ended (``done``), and
        ``start``, where its next event starts: past white space and, unless ``first`` (no comma
        due: no event read yet, or its comma already dropped), the comma before the event. The
        shared head of the loops of ``batches`` and ``parts``."""
        while True:
            if not done and len(buf) < size:
                done = not self._read(buf)
                continue
            start = _skip(buf, 0, first)
            if start == len(buf) and not done:
                # Only white space (and the separating comma) so far: dropped, never held.
                if not first and 0x2C in buf:
                    first = True
                buf = bytearray(b" ")
                continue
            return buf, done, first, start

    def _read(self, buf: bytearray) -> bool:
        """Read the next piece of text onto ``buf`` (the text of ``traceEvents`` from an event's
        start); False when the file has ended. A piece that is only white space, outside a
        string, is kept as one space: a run of padding between events never fills the buffer
        (``parts`` looks for a cut past the run's end, ``batches`` drops it)."""
        chunk = next(self._chunks, None)
        if chunk is None:
            return False
        if chunk and _SPACE.fullmatch(chunk) is not None:
            if self._padding is None:           # whether it lies outside strings: once a run
                at = json_nesting.Nesting(1 << 62)
                at.feed(buf)
                self._padding = not at.in_string
            if self._padding:
                if not (buf and buf[-1] in WHITE_SPACE):
                    buf += b" "
                return True
        else:
            self._padding = None
        buf += chunk
        return True

    def _read_more(self, buf: bytearray, start: int, limit: int) -> bool:
        """Read on until the text has doubled — so that the cuts tried again cost, all
        together, a constant times the text (linear) — or ``limit`` bytes lie past ``start``;
        True when the file ended first. An event already longer than ``limit`` is refused."""
        if len(buf) - start > limit:
            raise BudgetExceeded("event_bytes", f"an event longer than {limit:,} bytes of "
                                 f"text (a string of that size)", limit)
        want = 2 * len(buf)
        while len(buf) < want and len(buf) - start <= limit:
            if not self._read(buf):
                return True
        return False


class _Spaces:
    """Where the text read so far stands — inside a string or not (a ``json_nesting.Nesting``
    without a budget: the budget is checked as the text is inflated) —, so that a piece of it
    that is only white space outside strings is kept as one space (``kept``): the same JSON,
    without the padding."""

    def __init__(self, text: bytes | bytearray = b""):
        self._at = json_nesting.Nesting(1 << 62)
        if text:
            self._at.feed(bytes(text))

    def kept(self, chunk: bytes, before: bytes | bytearray) -> bytes:
        """``chunk``, the text that follows ``before``, as it is to be kept."""
        if chunk and not self._at.in_string and _SPACE.fullmatch(chunk) is not None:
            self._at.run = 0
            return b"" if before and before[-1] in WHITE_SPACE else b" "
        self._at.feed(chunk)
        return chunk


def batches_in(buf: bytearray, decode: Callable[[bytes], list], batch_bytes: int
               ) -> Iterator[list]:
    """The events of ``buf[1:-1]`` — whole events separated by commas, as ``EventStream.parts``
    cuts them; ``buf``'s first and last bytes spare — decoded in batches of about
    ``batch_bytes``, in place (``_decode_in_place``: no batch is copied). A batch ends after
    the last ``}`` before its size that a comma follows and whose text decodes
    (``_cut_before``, as ``EventStream.batches`` cuts); ``Fallback`` when a batch cannot be
    cut so (an event longer than a batch, or text that is not a run of events), so that the
    caller reads the file another way."""
    end = len(buf) - 1
    pos = _skip(buf, 1, True)
    while pos < end:
        if end - pos <= batch_bytes:
            try:
                events = _decode_in_place(decode, buf, pos - 1, end)
            except msgspec.DecodeError:
                raise Fallback("a part that is not a run of events") from None
            yield events
            return
        got = _cut_before(buf, pos, pos + batch_bytes, end, _BETWEEN_EVENTS, decode)
        if got is None:
            raise Fallback("an event longer than a batch")
        events, cut = got
        yield events
        pos = _skip(buf, cut, False)


# What may follow an event's closing "}" where a cut is tried: within a part, only the comma
# before the next event; in the text read so far, also the "]" that ends the array, or the end
# of that text (None).
_BETWEEN_EVENTS = (0x2C,)                                    # ","
_BETWEEN_OR_AFTER_EVENTS = (0x2C, 0x5D, None)                # ",", "]", the end


def _cut_before(buf: bytearray, start: int, stop: int, end: int,
                followers: tuple[int | None, ...], decode: Callable[[bytes], list]
                ) -> tuple[list, int] | None:
    """(the events from ``start`` up to a cut, decoded; the cut): the cut after the last ``}``
    before ``stop`` that one of ``followers`` follows — the next byte that is not white space,
    None for ``end``, the end of the text — and whose text, ``[`` + ``buf[start:cut]`` + ``]``,
    decodes (so the cut is not inside a string or an event). None when none of the last
    ``CUT_TRIES`` ``}`` gives one: no complete event before ``stop``, as far as was tried."""
    pos = stop
    for _ in range(CUT_TRIES):
        pos = buf.rfind(b"}", start, pos)
        if pos < 0:
            return None
        after = _skip(buf, pos + 1, True)
        if (buf[after] if after < end else None) not in followers:
            continue
        try:
            return _decode_in_place(decode, buf, start - 1, pos + 1), pos + 1
        except msgspec.DecodeError:
            continue
    return None


def _decode_in_place(decode, buf: bytearray, before: int, after: int):
    """``decode`` of ``[`` + ``buf[before + 1:after]`` + ``]`` without copying: the bytes at
    ``before`` and ``after`` (white space, a comma or the spare byte) are set to the brackets for
    the call and then put back. (Copied when the text runs to the end of ``buf``: growing a
    buffer that decoded events still point into is not allowed.)"""
    if before < 0 or after >= len(buf):
        return decode(b"[" + bytes(buf[before + 1:after]) + b"]")
    saved = buf[before], buf[after]
    buf[before], buf[after] = 0x5B, 0x5D                      # "[" and "]"
    try:
        with memoryview(buf) as view:
            return decode(view[before:after + 1])
    finally:
        buf[before], buf[after] = saved


def _skip(buf: bytearray, i: int, first: bool) -> int:
    """Index of the first byte from ``i`` that is not white space (nor, between elements, the
    one separating comma). A regular expression, so a long run of white space is skipped at
    C speed."""
    i = _SPACE.match(buf, i).end()
    if not first and i < len(buf) and buf[i] == 0x2C:
        i = _SPACE.match(buf, i + 1).end()
    return i


# Where a part of ``EventStream.parts`` may end: a "}" then a comma and the next "{".
_NEXT_EVENT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
