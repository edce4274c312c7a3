"""Where the elements of a JSON array or object begin and end, found without a recursive parser.

``split_top(text)`` gives the ``(start, end)`` byte ranges of the elements of the JSON array or
object ``text`` (for an object, of each ``"key": value`` member); ``split_members(text)`` gives
the ``(key, value text)`` of each member of an object. Both count brackets outside strings, a
token at a time (``_TOKEN``: a string, a run of brackets, a comma), without recursion, so they
work at any depth. That is how a value nested deeper than the decoder's limit (about 1,000
levels; reached only when the nesting budget, ``json_nesting.py``, was raised that far) is
still read element by element: a batch holding one (``decode.py``, which drops the deep element
and counts it), and the metadata and events of a file read whole (``trace_file.py``). Whether
each element is valid JSON is left to whoever decodes it.
"""
from __future__ import annotations

import re

import msgspec

WHITE_SPACE = b" \t\r\n"           # the four bytes JSON counts as white space

# A JSON string (escapes included), a lone quote (a string that never ends), a run of opening or
# of closing brackets, or a comma outside strings: all that is needed to find where a
# container's elements begin and end (a run of 10^5 brackets is one token).
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|"|[\[{]+|[\]}]+|,')
_STRING = re.compile(rb'\s*("[^"\\]*(?:\\.[^"\\]*)*")\s*:', re.DOTALL)


def split_top(text) -> list[tuple[int, int]]:
    """The ``(start, end)`` byte ranges of the elements of the JSON array or object ``text``
    (for an object, each ``"key": value`` member), found by counting brackets outside strings:
    no recursion, so it works at any nesting depth (the decoder's own limit is about 1,000
    levels). ``msgspec.DecodeError`` when ``text`` is not one complete, balanced container;
    whether each element is valid JSON is left to whoever decodes it."""
    text = bytes(text)
    depth, start, spans, closed = 0, -1, [], False
    for m in _TOKEN.finditer(text):
        a, b = m.span()
        c = text[a]
        if c == 0x22:                                   # '"'
            if b - a == 1:
                raise msgspec.DecodeError("a string never ends")
            if depth == 0:
                raise msgspec.DecodeError("text outside the container")
            continue
        if closed:
            raise msgspec.DecodeError("text after the container")
        if c in (0x5B, 0x7B):                           # a run of "[" / "{"
            if depth == 0:
                if text[:a].strip(WHITE_SPACE):
                    raise msgspec.DecodeError("text before the container")
                start = a + 1
            depth += b - a
        elif c in (0x5D, 0x7D):                         # a run of "]" / "}"
            if depth - (b - a) < 0:
                raise msgspec.DecodeError("unbalanced brackets")
            if depth - (b - a) == 0:
                spans.append((start, b - 1))
                closed = True
            depth -= b - a
        elif depth == 1:                                # "," between elements
            spans.append((start, a))
            start = b
    if not closed:
        raise msgspec.DecodeError("the container does not end")
    if text[spans[-1][1] + 1:].strip(WHITE_SPACE):
        raise msgspec.DecodeError("text after the container")
    out = []
    for a, b in spans:
        while a < b and text[a] in WHITE_SPACE:
            a += 1
        while b > a and text[b - 1] in WHITE_SPACE:
            b -= 1
        out.append((a, b))
    if len(out) == 1 and out[0][0] == out[0][1]:
        return []                                       # "[]" or "{}"
    if any(a == b for a, b in out):
        raise msgspec.DecodeError("an empty element")
    return out


def split_members(text) -> list[tuple[str, bytes]]:
    """``(key, value text)`` of each member of the JSON object ``text`` (``split_top``);
    ``msgspec.DecodeError`` when it is not an object of string keys."""
    text = bytes(text)
    out = []
    for a, b in split_top(text):
        m = _STRING.match(text, a, b)
        if m is None:
            raise msgspec.DecodeError("an object member without a string key")
        out.append((msgspec.json.decode(m.group(1)), text[m.end():b]))
    return out
