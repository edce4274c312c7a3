"""Text from input files made safe to print on a terminal.

A trace's file name, run.json's ``schedule`` or a trace's run id may hold control characters:
an ANSI/OSC escape sequence printed raw changes the terminal's title or colours, moves the
cursor, or forges a line of the report (``Straggler: rank 0 …``). ``printable`` shows every
control character (C0, DEL, C1, and the Unicode bidirectional overrides that reorder what is
shown) escaped as Python writes it (``\\x1b``, ``\\n``, ``\\u202e``); ``printable_tree`` does so
for every string of a summary. Standard library only.
"""
from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                      "\u2066-\u2069]")
_CONTROL_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028"
                                 "\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    c = m.group()
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(
        c, f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text, *, lines: bool = False) -> str:
    """``text`` with its control characters escaped; ``lines``: newlines and tabs kept (for a
    text whose lines are meshscope's own)."""
    return (_CONTROL_KEEP_LINES if lines else _CONTROL).sub(_escape, str(text))


def printable_tree(value):
    """A copy of a JSON-like value whose strings (keys too) are ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k) if isinstance(k, str) else k: printable_tree(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(v) for v in value]
    return value
