"""The nesting budget, checked on JSON text as it is inflated, before any of it is decoded.

``Nesting(limit)`` is fed a document's text chunk by chunk (``feed``) and keeps how deep the
text so far is nested in brackets outside strings (``depth``, ``deepest``, ``in_string``); it
raises ``BudgetExceeded`` (``nesting``) as soon as a chunk goes past ``limit`` levels
(``--max-nesting``, 64 by default; a Kineto event is about 5 deep). ``checked(texts, limit)``
passes an iterator of chunks through one.

Every byte of a trace — the metadata before and after ``traceEvents`` and every event — passes
through a ``Nesting`` once: as the stream inflates it (``json_stream.EventStream``), as the
whole-file reader inflates it (``trace_file.decompress``), or part by part in the processes that
read a large trace in parts (``parts.py``). A deeply nested file is so refused at the first
level past the budget, whatever the decoder would have done with it.

Only six bytes matter to the depth: the quote and the backslash (where strings begin and end,
and which quotes are escaped) and the four brackets (``_NESTING_BYTES``). What a chunk leaves
open — the depth, whether it ends inside a string, a run of backslashes at its very end — is
carried to the next, so where the text is cut into chunks does not matter.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from meshscope.analysis.ingest.budgets import BudgetExceeded


# Bytes that matter for nesting: the quote and backslash (strings and their escapes) and the
# four brackets; ``_STEP`` is +1 for an opening bracket, -1 for a closing one.
_NESTING_BYTES = np.zeros(256, dtype=bool)
_NESTING_BYTES[list(b'"\\[]{}')] = True
_NOT_NESTING = bytes(b for b in range(256) if b not in b'"\\[]{}')
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[0x5B, 0x7B]], _STEP[[0x5D, 0x7D]] = 1, -1


class Nesting:
    """How deep the JSON text fed to it so far is nested, outside strings; ``BudgetExceeded``
    (``nesting``) as soon as a chunk goes past ``limit`` levels.

    Each chunk is looked at with numpy, not a byte at a time in Python: only the bytes that
    matter (``_NESTING_BYTES``) are kept with their positions; a quote ends or starts a string
    unless a run of an odd number of backslashes stands right before it; a bracket counts only
    outside strings, and the running sum of the brackets is the depth. What a chunk leaves open
    — the depth, whether it ends inside a string, a run of backslashes at its very end — is
    carried to the next, so where the text is cut into chunks does not matter. Linear in the
    text: about 0.45 s for 379 MB of JSON here, most of it the two C-speed passes
    (``translate``, ``replace``) that leave a real trace's chunk with its brackets alone
    (1.0 s when its quotes were counted too; 1.6 s before the escape-free chunks took the
    ``translate`` path)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.depth = 0               # brackets open outside strings
        self.deepest = 0
        self.in_string = False
        self.run = 0                 # backslashes ending the last chunk (inside a string)

    def feed(self, chunk) -> None:
        if chunk.isspace():
            # Only white space (a bomb of it, or padding): nothing to count; it ends any run
            # of backslashes. ``isspace`` runs at C speed (0.06 s per 100 MB), so gigabytes of
            # white space cost no numpy pass.
            self.run = 0
            return
        if not self.run and b"\\" not in chunk:
            # No escapes (nearly every chunk of a real trace): the bytes that matter are
            # picked out at C speed (``translate``), positions are not needed. Two quotes
            # side by side are then dropped (``replace``, C speed too): they are an empty
            # string, or the end of one string and the start of the next with no bracket
            # between them — either way the brackets outside strings, and whether the text
            # ends inside one, are what they were. In a real trace that leaves no quote at all
            # (its strings hold no brackets), and only the brackets are counted.
            kept = chunk.translate(None, _NOT_NESTING).replace(b'""', b"")
            if not kept:
                return
            c = np.frombuffer(kept, dtype=np.uint8)
            if b'"' not in kept:
                if not self.in_string:
                    self._depths(np.cumsum(_STEP[c], dtype=np.int64))
                return
            self._count(c, c == 0x22, 0)
            return
        a = np.frombuffer(chunk, dtype=np.uint8)
        at = np.flatnonzero(_NESTING_BYTES[a])
        if not at.size:
            self.run = 0 if a.size else self.run
            return
        c = a[at]
        backslash = c == 0x5C
        quote = c == 0x22
        last_run = 0
        if self.run or backslash.any():
            n, i = at.size, np.arange(at.size)
            adjacent = np.empty(n, dtype=bool)
            adjacent[0] = at[0] == 0 and self.run > 0
            adjacent[1:] = at[1:] == at[:-1] + 1
            after_backslash = np.empty(n, dtype=bool)
            after_backslash[0] = self.run > 0
            after_backslash[1:] = backslash[:-1]
            continues = backslash & adjacent & after_backslash
            start = np.maximum.accumulate(np.where(continues, -1, i))
            # Backslashes in the run ending at each token (the carried ones included).
            run = np.where(start >= 0, i - start + 1, i + 1 + self.run)
            before = np.zeros(n, dtype=np.int64)
            before[0] = self.run if at[0] == 0 else 0
            before[1:] = np.where(backslash[:-1] & adjacent[1:], run[:-1], 0)
            quote &= before % 2 == 0                           # an escaped quote: text
            if backslash[-1] and at[-1] == a.size - 1:
                last_run = int(run[-1])
        self._count(c, quote, last_run)

    def _count(self, c: np.ndarray, quote: np.ndarray, last_run: int) -> None:
        """The depth over the bytes that matter ``c`` of a chunk, ``quote`` marking the quotes
        that start or end a string; ``last_run``: the backslashes ending the chunk."""
        inside = (np.cumsum(quote) & 1).astype(bool)
        if self.in_string:
            inside = ~inside
        self.in_string, self.run = bool(inside[-1]), last_run
        self._depths(np.cumsum(np.where(inside, 0, _STEP[c]), dtype=np.int64))

    def _depths(self, steps: np.ndarray) -> None:
        """Carry the depth over a chunk whose running sum of bracket steps is ``steps``."""
        deepest = int(steps.max()) + self.depth
        self.depth += int(steps[-1])
        self.deepest = max(self.deepest, deepest)
        if deepest > self.limit:
            raise BudgetExceeded("nesting", f"nested more than {self.limit:,} levels deep",
                                 self.limit)


def checked(texts: Iterator[bytes], limit: int) -> Iterator[bytes]:
    """``texts`` passed through a ``Nesting`` of ``limit`` levels."""
    nesting = Nesting(limit)
    for text in texts:
        nesting.feed(text)
        yield text
