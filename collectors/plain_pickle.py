"""Pickles from strangers, read as plain data only: loading one never runs code.

PyTorch writes some of what meshscope reads as pickles: Flight Recorder dumps
(``collectors/flight_recorder.py``) and memory snapshots (``torch.cuda.memory._dump_snapshot``,
``analysis/memory/snapshot.py``). A pickle can name any importable function and call it while it
is loaded (``__reduce__`` → ``os.system``), so ``loads`` never lets the unpickler get that far:

1. its opcodes are walked first (``pickletools.genops``, which only reads): a pickle that
   names a class or a function (``GLOBAL``, ``STACK_GLOBAL``), calls or builds an object
   (``REDUCE``, ``BUILD``, ``NEWOBJ``…), or declares a frame longer than the file or a memo
   index beyond its size (what would make the unpickler allocate without bound) is refused —
   nothing has been unpickled;
2. the unpickler itself refuses every class (``find_class``), in case an opcode slips by;
3. the result must consist of plain data only — dict, list, tuple, str, bytes, int, float,
   bool, None — nested at most ``MAX_DEPTH`` levels, and hold no more objects, each counted
   once for every place it appears in, than ``PLACES_PER_BYTE`` times the pickle's bytes (its
   memo lets a few hundred bytes stand for 2⁶⁰ objects).

Anything else is ``UnsafePickleError`` (a ``ValueError``) naming what was refused; callers add
the file.
"""
from __future__ import annotations

import io
import pickle
import pickletools
import struct

PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))
MAX_DEPTH = 200


class UnsafePickleError(ValueError):
    """A pickle that is not plain data; the message names what was refused (and, from the
    callers, the file)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain data "
                                     f"(dict, list, tuple, str, int, float, bool, None)")


# Opcodes that name, build or call objects: none occurs in a pickle of plain data.
_CODE_OPS = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX",
             "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "READONLY_BUFFER", "NEXT_BUFFER"}
_MEMO_OPS = {"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"}


def check_opcodes(raw: bytes) -> None:
    """ValueError naming the first opcode a plain-data pickle cannot hold (module docstring);
    nothing is unpickled."""
    strings: list[str] = []
    for op, arg, pos in pickletools.genops(raw):
        if isinstance(arg, str):
            strings = (strings + [arg])[-2:]
        if op.name in _CODE_OPS:
            what = arg.replace(" ", ".") if isinstance(arg, str) else \
                ".".join(strings) if op.name == "STACK_GLOBAL" and len(strings) == 2 else op.name
            raise ValueError(f"refused to load {what} (byte {pos}): only plain data "
                             f"(dict, list, tuple, str, int, float, bool, None)")
        if op.name in _MEMO_OPS and isinstance(arg, int) and arg > len(raw):
            raise ValueError(f"memo index {arg} at byte {pos} is beyond the pickle's size")
        if op.name == "FRAME" and arg > len(raw):
            raise ValueError(f"a frame of {arg} bytes at byte {pos}, in a file of {len(raw)}")


# A pickle may place one object in many places (its memo): a few hundred bytes can stand for a
# list of two references to a list of two references … 2**60 objects to whoever walks the
# result. Plain data written without sharing holds at most one object per byte; PyTorch's dumps
# hold fewer (23,727 in a 38,450-byte Flight Recorder dump of 300 entries). Counted as a reader
# walks them, a pickle's objects may be at most this many times its bytes, plus an allowance.
PLACES_PER_BYTE = 16
PLACES_ALLOWANCE = 1 << 16


def check_plain(obj, limit: int | None = None) -> None:
    """ValueError unless ``obj`` is plain data (``PLAIN``) nested at most ``MAX_DEPTH`` deep
    whose objects, each counted once for every place it appears in, number at most ``limit``
    (None: no bound). Each distinct container is walked once (its count and height
    remembered), so the check costs what the pickle holds, not what it stands for: a 429-byte
    pickle of shared references kept the plain walk busy for good."""
    seen: dict[int, tuple[int, int]] = {}       # id → (places under it, its height)
    bound = float("inf") if limit is None else limit

    def walk(x, depth: int) -> tuple[int, int]:
        if not isinstance(x, PLAIN):
            raise ValueError(f"object of type {type(x).__name__}")
        if not isinstance(x, (dict, list, tuple)):
            return 1, 0
        known = seen.get(id(x))
        if known is None:
            if depth > MAX_DEPTH:
                raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
            count, height = 1, 0
            for v in (y for kv in x.items() for y in kv) if isinstance(x, dict) else x:
                n, h = walk(v, depth + 1)
                count, height = count + n, max(height, h + 1)
                if count > bound:
                    raise ValueError(f"one object referred to from many places: more than "
                                     f"{int(bound):,} objects in all, from a pickle of its "
                                     f"size")
            known = seen[id(x)] = (count, height)
        if depth + known[1] > MAX_DEPTH:
            raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
        return known

    walk(obj, 0)


def loads(raw: bytes):
    """The plain data a pickle holds (module docstring); ``UnsafePickleError`` otherwise."""
    try:
        check_opcodes(raw)
        obj = _PlainUnpickler(io.BytesIO(raw)).load()
        check_plain(obj, PLACES_PER_BYTE * len(raw) + PLACES_ALLOWANCE)
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, AttributeError, KeyError,
            IndexError, struct.error, OverflowError, RecursionError, MemoryError) as e:
        raise UnsafePickleError(f"not a plain-data pickle ({e})") from None
    return obj
