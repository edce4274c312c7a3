"""Pickles from strangers, read as plain data only: loading one never runs code, and costs time
and memory in proportion to the file's size.

PyTorch writes some of what meshscope reads as pickles: Flight Recorder dumps
(``collectors/flight_recorder.py``) and memory snapshots (``torch.cuda.memory._dump_snapshot``,
``analysis/memory/snapshot.py``). A pickle can name any importable function and call it while it
is loaded (``__reduce__`` → ``os.system``); Python's unpickler also builds whatever the file
describes before anyone can look at it — a dict of 40,000 int keys that all hash alike
(``i*(2**61-1)``) in quadratic time, 5,000,000 empty dicts from a 4.8 MB file in 1.1 GB. So
``loads`` does not use it: it interprets the opcodes itself, one pass over the bytes, and builds
only plain data — dict, list, tuple, str, bytes, int, float, bool, None:

1. only the opcodes of plain data (protocols 0–5) are read; one that names a class or a
   function (``GLOBAL``, ``STACK_GLOBAL``), calls or builds an object (``REDUCE``, ``BUILD``,
   ``NEWOBJ``…), or makes a set, a bytearray or an out-of-band buffer is refused when it is
   reached — nothing of it is ever looked up, let alone run;
2. a dict key must be a ``str``, checked before it is hashed (PyTorch's dumps and snapshots
   have no other keys; str hashes are randomised per process, so no file can make them
   collide — an int, a float or a tuple key could; with ``int_keys`` an int key is turned
   into its text before it is hashed); an integer must fit in 64 bits: one
   written in more than 255 bytes (``LONG4``) or ``MAX_TEXT_NUMBER`` digits is refused as it
   is read, a smaller one beyond int64 (``2**70``) when the load ends, naming where it is as
   the schemas name a field (``$.segments[0].blocks[0].size``);
3. the memo is filled in order (index 0, 1, 2 …, as every pickler writes it) and never
   overwritten, and a container cannot change once it has been placed in another (no pickler
   of plain data does that): so each container's count of places — itself and everything
   under it, counted once for every place it appears in — and its height are known as it is
   built, cycles cannot be made, and a container nested deeper than ``MAX_DEPTH`` levels, or
   standing for more than ``PLACES_PER_BYTE`` places per byte of the pickle (a memo lets a
   few hundred bytes stand for 2⁶⁰ objects), is refused the moment it would be;
4. the memory held is counted as it grows — each object made (``sys.getsizeof``), each
   container's growth, the stack and the memo — and the load is refused before the count
   passes ``BYTES_PER_BYTE`` times the pickle's size plus ``BYTES_ALLOWANCE``. The count
   never falls (what a pickle builds and drops is still counted), so the process' peak
   stays under 20× the file's size + 200 MB (the bytes themselves included).

Every opcode costs constant time, or time linear in the items it takes off the stack, each of
which an earlier opcode put there: the whole load is linear in the file's size.

Anything else is ``UnsafePickleError`` (a ``ValueError``) naming what was refused and at which
byte; callers add the file.
"""
from __future__ import annotations

import codecs
from array import array
import gc
import struct
import sys

PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))
MAX_DEPTH = 200

# A pickle may place one object in many places (its memo): a few hundred bytes can stand for a
# list of two references to a list of two references … 2**60 objects to whoever walks the
# result. Plain data written without sharing holds at most one object per byte; PyTorch's dumps
# hold fewer (23,727 in a 38,450-byte Flight Recorder dump of 300 entries). A container may
# stand for at most this many places per byte of the pickle, plus an allowance.
PLACES_PER_BYTE = 16
PLACES_ALLOWANCE = 1 << 16

# The memory a load may hold, counted as it grows (module docstring, 4.): plain data as Python
# holds it takes up to ~14 bytes per byte of its pickle (a list of small dicts of memoized keys).
BYTES_PER_BYTE = 16
BYTES_ALLOWANCE = 128 << 20

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_TEXT_NUMBER = 64            # characters of a protocol-0 number (``I``, ``L``, ``F``)
HIGHEST_PROTOCOL = 5

_ONLY = "only plain data (dict, list, tuple, str, bytes, int, float, bool, None)"


class UnsafePickleError(ValueError):
    """A pickle that is not plain data, or not within the bounds; the message names what was
    refused (and, from the callers, the file)."""


# What each refused opcode is, in words.
_CODE_OPS = {0x63: "GLOBAL", 0x93: "STACK_GLOBAL", 0x52: "REDUCE", 0x62: "BUILD", 0x69: "INST",
             0x6f: "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1", 0x83: "EXT2",
             0x84: "EXT4", 0x50: "PERSID", 0x51: "BINPERSID", 0x97: "NEXT_BUFFER",
             0x98: "READONLY_BUFFER"}
_OTHER_TYPES = {0x8f: "a set", 0x90: "a set", 0x91: "a frozenset", 0x96: "a bytearray"}

# Stack and memo slots: a reference in a list (8 bytes) and its bookkeeping (8; on the stack, a
# container's is an int object of its own: 32 more), counted with what the lists' growth leaves
# behind (a list of millions of items grows by copies: a stack of 3.5 million items was
# measured at 1.35 times its own size).
_SLOT = 64
_MEMO_SLOT = 24
_CHECK_EVERY = 1 << 16          # bytes of pickle between two looks at the stack's size
# Upper bounds on what one item taken off the stack adds to the container it goes into (a
# dict's table may be three quarters empty after it grows, and is copied as it grows).
_GROW_LIST = 16
_GROW_DICT = 80                 # per stack item: 160 per key and value
# Sizes as the allocator hands them out: getsizeof (the garbage collector's header included),
# rounded up to its 16 bytes (strings, tuples and bytes are counted so: getsizeof + 15).
_DICT0 = (sys.getsizeof({}) + 15) & ~15
_LIST0 = (sys.getsizeof([]) + 15) & ~15
_unpack_d = struct.Struct(">d").unpack_from
_unpack_i = struct.Struct("<i").unpack_from
_unpack_I = struct.Struct("<I").unpack_from
_unpack_H = struct.Struct("<H").unpack_from
_unpack_Q = struct.Struct("<Q").unpack_from

# A container's bookkeeping, one int: its places (from bit _SHIFT up), its height (bits 2-9),
# whether it has been placed in another container (_PLACED: then it may not change) and
# whether this is its memo record (_RECORD).
# On the stack (and in the memo) 0 stands for a scalar or an empty tuple (1 place, height 0),
# a positive number for a container's bookkeeping, and -(i+1) for the list or dict whose
# bookkeeping is memo record i (every copy of it on the stack shares that record).
_PLACED, _RECORD, _SHIFT = 2, 1, 10


class _Refused(ValueError):
    pass


def loads(raw: bytes, *, stats: dict | None = None, int_keys: bool = False):
    """The plain data a pickle holds (module docstring); ``UnsafePickleError`` otherwise.
    ``stats``, a dict, receives what the load counted: ``bytes_held`` (objects, stack and
    memo, as the budget counts them), ``budget`` and ``places`` (of the result).
    ``int_keys``: a dict key that is an ``int`` (not a bool) is taken as its decimal text —
    converted before it is hashed, so it cannot collide — and refused where that text is
    already a key of the same dict (older Flight Recorder dumps key ``pg_config`` by group
    id)."""
    raw = bytes(raw)
    enabled = gc.isenabled()
    gc.disable()        # the loader's containers hold no cycles: nothing for it to collect
    try:
        return _load(raw, BYTES_PER_BYTE * len(raw) + BYTES_ALLOWANCE,
                     PLACES_PER_BYTE * len(raw) + PLACES_ALLOWANCE, stats, int_keys)
    except UnsafePickleError:
        raise
    except (ValueError, OverflowError, MemoryError) as e:
        raise UnsafePickleError(f"not a plain-data pickle ({e})") from None
    finally:
        if enabled:
            gc.enable()


def _load(raw: bytes, budget: int, bound: int, stats: dict | None = None,
          int_keys: bool = False):
    n = len(raw)
    st: list = []           # the stack
    sm: list = []           # each stack item's bookkeeping (see _PLACED)
    marks: list = []
    memo: list = []
    mm = array("q")         # each memo entry's bookkeeping
    held = 0                # bytes of the objects made so far (never decreases)
    pos = check_at = start = 0
    big = None              # the byte of the first integer beyond int64
    getsizeof = sys.getsizeof
    view = memoryview(raw)
    push, mpush = st.append, sm.append
    empty = 1 << _SHIFT     # an empty list or dict (one object, pushed again and again)
    many = f"one object referred to from many places: more than {bound:,} objects in all, " \
           f"from a pickle of its size"

    def refuse(what: str):
        raise _Refused(f"{what} (byte {start})")

    def room(extra: int = 0):
        total = held + _SLOT * len(st) + _MEMO_SLOT * len(memo) + extra
        if total > budget:
            refuse(f"more than {budget:,} bytes of memory for a pickle of {n:,} bytes "
                   f"(objects, stack and memo counted so far: {total:,})")

    def take(k: int):
        """The next ``k`` bytes (a view of the file's when they are many: no copy)."""
        nonlocal pos
        end = pos + k
        if end > n:
            refuse(f"the pickle ends inside an opcode ({k:,} bytes declared, {n - pos:,} left)")
        b = raw[pos:end] if k <= 4096 else view[pos:end]
        pos = end
        return b

    def line() -> bytes:
        nonlocal pos
        end = raw.find(b"\n", pos)
        if end < 0:
            refuse("the pickle ends inside a line")
        b = raw[pos:end]
        pos = end + 1
        return b

    def text_int(text: bytes, base: int) -> int:
        nonlocal big
        if len(text) > MAX_TEXT_NUMBER:
            refuse(f"an integer of {len(text):,} digits (beyond int64)")
        try:
            v = int(text, base)
        except ValueError:
            refuse(f"not an integer: {text[:40]!r}")
        if big is None and not INT64_MIN <= v <= INT64_MAX:
            big = start
        return v

    def placed(at: int, places: int, height: int, target=None) -> tuple[int, int]:
        """``places`` and ``height`` of a container that takes the stack's items from ``at``
        (each marked placed): its children's places and one more level than the deepest;
        refused past the bound or ``MAX_DEPTH``, or when ``target`` would hold itself."""
        ms = sm[at:]
        for mi in ms if any(ms) else ():
            if mi:
                if mi < 0:
                    ci = -mi - 1
                    if target is not None and memo[ci] is target:
                        refuse(f"a {type(target).__name__} placed in itself")
                    mi = mm[ci]
                    mm[ci] = mi | _PLACED
                places += (mi >> _SHIFT) - 1
                h = ((mi >> 2) & 255) + 1
                if h > height:
                    height = h
        if places > bound:
            refuse(many)
        if height > MAX_DEPTH:
            refuse(f"nesting deeper than {MAX_DEPTH} levels")
        return places, height
    def fill(op: int, at: int):
        """SETITEMS / APPENDS (and SETITEM, APPEND, DICT, LIST, whose items have been put
        above their container): the items above stack index ``at`` go into the container at
        ``at - 1``, which must not have been placed anywhere yet; its places and height grow
        by theirs, and memoized items are marked placed."""
        nonlocal held
        k = len(st) - at
        if at < 1 or k < 0:
            refuse("no container below the items")
        target = st[at - 1]
        m = sm[at - 1]
        c = -1
        if m < 0:
            c = -m - 1
            m = mm[c]
            if m & _PLACED:
                refuse(f"a {type(target).__name__} changed after it was placed in another "
                       f"container (no pickler of plain data writes that)")
        places = (m >> _SHIFT) + k
        height = (m >> 2) & 255
        if k and height < 1:
            height = 1
        if op == 0x75:
            if type(target) is not dict:
                refuse(f"SETITEMS on a {type(target).__name__}: {_ONLY}")
            if k & 1:
                refuse("SETITEMS with a key and no value")
            keys = st[at::2]
            if int_keys and any(type(key) is int for key in keys):
                keys = [str(key) if type(key) is int else key for key in keys]
                if len(set(keys)) < len(keys) or any(
                        key in target for key, was in zip(keys, st[at::2])
                        if type(was) is int):
                    refuse("an integer dict key whose text is already a key of the dict")
            for key in keys:
                if type(key) is not str:
                    refuse(f"a dict key of type {type(key).__name__} ({_short(key)}): only "
                           f"str keys, as in the formats read")
        elif type(target) is not list:
            refuse(f"APPENDS to a {type(target).__name__}: {_ONLY}")
        if k > 64:
            room(k * (_GROW_DICT if op == 0x75 else _GROW_LIST))
        places, height = placed(at, places, height, target)
        before = getsizeof(target)
        if op == 0x75:
            target.update(zip(keys, st[at + 1::2]))
        else:
            target.extend(st[at:])
        held += getsizeof(target) - before
        del st[at:], sm[at:]
        m = (places << _SHIFT) | (height << 2) | (m & 3)
        if c < 0:
            sm[at - 1] = m
        else:
            mm[c] = m

    def new_tuple(at: int):
        nonlocal held
        if at < 0:
            refuse("more items taken than the stack holds")
        tup = tuple(st[at:])
        places, height = placed(at, len(tup) + 1, 1)
        held += getsizeof(tup) + 15
        del st[at:], sm[at:]
        push(tup)
        mpush((places << _SHIFT) | (height << 2) if tup else 0)

    def put(i: int):
        if i != len(memo):
            if i > n:
                refuse(f"memo index {i} is beyond the pickle's size")
            refuse(f"memo index {i} out of order (the next is {len(memo)}): the memo is "
                   f"filled in order and never overwritten")
        if not st:
            refuse("a memo entry with nothing on the stack")
        top = st[-1]
        m = sm[-1]
        memo.append(top)
        if m > 0 and (type(top) is list or type(top) is dict):
            mm.append(m | _RECORD)
            sm[-1] = -len(memo)
        else:
            mm.append(m)

    def get(i: int):
        if i >= len(memo):
            refuse(f"memo index {i} was never stored")
        push(memo[i])
        m = mm[i]
        if m > 0 and m & _RECORD:
            m = -(i + 1)
        mpush(m)

    def push_str(s):
        nonlocal held
        held += getsizeof(s) + 15
        push(s)
        mpush(0)

    def mark() -> int:
        if not marks:
            refuse("an opcode that takes its items from a MARK with no MARK before it")
        return marks.pop()

    try:
        while True:
            if pos >= check_at:
                room()
                check_at = pos + _CHECK_EVERY
            start = pos
            op = raw[pos]
            pos += 1
            if op == 0x68:                                      # BINGET
                i = raw[pos]
                pos += 1
                push(memo[i])               # an index never stored: IndexError, named below
                m = mm[i]
                if m > 0 and m & 1:         # _RECORD: the memo's own list or dict
                    m = -(i + 1)
                mpush(m)
            elif op == 0x94:                                    # MEMOIZE: the next index
                put(len(memo))
            elif op == 0x8c:                                    # SHORT_BINUNICODE
                end = pos + 1 + raw[pos]
                if end > n:
                    refuse("the pickle ends inside a string")
                v = raw[pos + 1:end].decode("utf-8", "surrogatepass")
                pos = end
                held += getsizeof(v) + 15
                push(v)
                mpush(0)
            elif op == 0x28:                                    # MARK
                marks.append(len(st))
            elif op == 0x75 or op == 0x65:                      # SETITEMS, APPENDS
                if not marks:
                    refuse("SETITEMS/APPENDS with no MARK before it")
                fill(op, marks.pop())
            elif op == 0x7d:                                    # EMPTY_DICT
                held += _DICT0
                push({})
                mpush(empty)
            elif op == 0x4b:                                    # BININT1
                push(raw[pos])
                mpush(0)
                pos += 1
            elif op == 0x4d:                                    # BININT2
                push(_unpack_H(raw, pos)[0])
                mpush(0)
                pos += 2
                held += 32
            elif op == 0x58:                                    # BINUNICODE
                k = _unpack_I(raw, pos)[0]
                pos += 4
                if k > 4096:
                    room(4 * k + 64)
                push_str(str(take(k), "utf-8", "surrogatepass"))
            elif op == 0x71:                                    # BINPUT
                put(raw[pos])
                pos += 1
            elif op == 0x6a:                                    # LONG_BINGET
                i = _unpack_I(raw, pos)[0]
                pos += 4
                push(memo[i])
                m = mm[i]
                if m > 0 and m & 1:
                    m = -(i + 1)
                mpush(m)
            elif op == 0x5d:                                    # EMPTY_LIST
                held += _LIST0
                push([])
                mpush(empty)
            elif op == 0x4a:                                    # BININT
                push(_unpack_i(raw, pos)[0])
                mpush(0)
                pos += 4
                held += 32
            elif op == 0x4e:                                    # NONE
                push(None)
                mpush(0)
            elif op == 0x88 or op == 0x89:                      # NEWTRUE, NEWFALSE
                push(op == 0x88)
                mpush(0)
            elif op == 0x8a or op == 0x8b:                      # LONG1, LONG4
                if op == 0x8a:
                    k = raw[pos]
                    pos += 1
                else:
                    k = _unpack_i(raw, pos)[0]
                    pos += 4
                if k > 255 or k < 0:
                    refuse(f"an integer of {k:,} bytes (beyond int64)")
                v = int.from_bytes(take(k), "little", signed=True)
                if k > 8 and big is None and not INT64_MIN <= v <= INT64_MAX:
                    big = start
                held += 36 + 2 * k
                push(v)
                mpush(0)
            elif op == 0x47:                                    # BINFLOAT
                push(_unpack_d(raw, pos)[0])
                mpush(0)
                pos += 8
                held += 32
            elif op == 0x86 or op == 0x85 or op == 0x87:        # TUPLE2, TUPLE1, TUPLE3
                new_tuple(len(st) - (op - 0x84))
            elif op == 0x74:                                    # TUPLE
                at = mark()
                room((len(st) - at) * 8 + 64)
                new_tuple(at)
            elif op == 0x29:                                    # EMPTY_TUPLE
                push(())
                mpush(0)
            elif op == 0x95:                                    # FRAME
                k = _unpack_Q(raw, pos)[0]
                pos += 8
                if k > n - pos:
                    refuse(f"a frame of {k} bytes, in a file of {n}")
            elif op == 0x80:                                    # PROTO
                v = raw[pos]
                pos += 1
                if v > HIGHEST_PROTOCOL:
                    refuse(f"pickle protocol {v} (at most {HIGHEST_PROTOCOL})")
            elif op == 0x2e:                                    # STOP
                if not st or marks and marks[-1] >= len(st):
                    refuse("STOP with nothing on the stack above its last MARK")
                if big is not None:
                    _refuse_beyond_int64(st[-1], big)
                if stats is not None:
                    m = sm[-1]
                    stats.update(bytes_held=held + _SLOT * len(st) + _MEMO_SLOT * len(memo),
                                 budget=budget, places=(mm[-m - 1] if m < 0 else m) >> _SHIFT
                                 if m else 1)
                return st[-1]
            elif op == 0x73 or op == 0x61:                      # SETITEM, APPEND
                fill(0x75 if op == 0x73 else 0x65, len(st) - (2 if op == 0x73 else 1))
            elif op == 0x72:                                    # LONG_BINPUT
                put(_unpack_I(raw, pos)[0])
                pos += 4
            elif op == 0x43 or op == 0x42 or op == 0x8e:        # SHORT_BINBYTES, BINBYTES(8)
                if op == 0x43:
                    k = raw[pos]
                    pos += 1
                elif op == 0x42:
                    k = _unpack_I(raw, pos)[0]
                    pos += 4
                else:
                    k = _unpack_Q(raw, pos)[0]
                    pos += 8
                if k > 4096:
                    room(k + 64)
                push_str(bytes(take(k)))
            elif op == 0x8d:                                    # BINUNICODE8
                k = _unpack_Q(raw, pos)[0]
                pos += 8
                if k > 4096:
                    room(4 * k + 64)
                push_str(str(take(k), "utf-8", "surrogatepass"))
            elif op == 0x55 or op == 0x54:                      # SHORT_BINSTRING, BINSTRING
                if op == 0x55:
                    k = raw[pos]
                    pos += 1
                else:
                    k = _unpack_i(raw, pos)[0]
                    pos += 4
                    if k < 0:
                        refuse("BINSTRING of a negative length")
                if k > 4096:
                    room(k + 64)
                push_str(str(take(k), "ascii"))
            elif op == 0x30:                                    # POP
                if marks and marks[-1] == len(st):
                    marks.pop()
                elif st:
                    st.pop()
                    sm.pop()
                else:
                    refuse("POP from an empty stack")
            elif op == 0x31:                                    # POP_MARK
                at = mark()
                del st[at:], sm[at:]
            elif op == 0x32:                                    # DUP
                if not st:
                    refuse("DUP of an empty stack")
                top = st[-1]
                if sm[-1] > 0 and (type(top) is list or type(top) is dict):
                    refuse(f"DUP of a {type(top).__name__} (no pickler of plain data "
                           f"writes that)")
                push(top)
                mpush(sm[-1])
            elif op == 0x64 or op == 0x6c:                      # DICT, LIST
                at = mark()
                room((len(st) - at) * (_GROW_DICT if op == 0x64 else _GROW_LIST) + 128)
                st.insert(at, {} if op == 0x64 else [])
                sm.insert(at, empty)
                held += _DICT0 if op == 0x64 else _LIST0
                fill(0x75 if op == 0x64 else 0x65, at + 1)
            elif op == 0x49 or op == 0x4c:                      # INT, LONG (text)
                text = line()
                if op == 0x49 and text in (b"00", b"01"):
                    push(text == b"01")
                else:
                    if op == 0x4c and text.endswith(b"L"):
                        text = text[:-1]
                    push(text_int(text, 0 if op == 0x49 else 10))    # as pickle reads them
                    held += 36
                mpush(0)
            elif op == 0x46:                                    # FLOAT (text)
                text = line()
                if len(text) > MAX_TEXT_NUMBER:
                    refuse(f"a float of {len(text):,} characters")
                try:
                    v = float(text)
                except ValueError:
                    refuse(f"not a float: {text[:40]!r}")
                held += 32
                push(v)
                mpush(0)
            elif op == 0x53:                                    # STRING (text, quoted)
                text = line()
                room(3 * len(text) + 64)
                if len(text) < 2 or text[0] != text[-1] or text[:1] not in (b"'", b'"'):
                    refuse("STRING without its quotes")
                push_str(codecs.escape_decode(text[1:-1])[0].decode("ascii"))
            elif op == 0x56:                                    # UNICODE (text)
                text = line()
                room(5 * len(text) + 64)
                push_str(text.decode("raw-unicode-escape"))
            elif op == 0x70 or op == 0x67:                      # PUT, GET (text)
                text = line()
                if not text.isdigit() or len(text) > 20:
                    refuse(f"not a memo index: {text[:40]!r}")
                (put if op == 0x70 else get)(int(text))
            elif op in _CODE_OPS:
                what = _CODE_OPS[op]
                if op == 0x63:                                  # GLOBAL: "module\nname\n"
                    module = line().decode("utf-8", "replace")
                    what = f"{module}.{line().decode('utf-8', 'replace')}"
                elif op == 0x93 and len(st) >= 2 and all(type(x) is str for x in st[-2:]):
                    what = ".".join(st[-2:])
                refuse(f"refused to load {_short_text(what)}: {_ONLY}")
            elif op in _OTHER_TYPES:
                refuse(f"refused to load {_OTHER_TYPES[op]}: {_ONLY}")
            else:
                refuse(f"not a pickle opcode: 0x{op:02x}")
    except _Refused:
        raise
    except (IndexError, struct.error):
        op = raw[start] if start < n else None
        if op == 0x68 and start + 1 < n or op == 0x6a and start + 5 <= n:
            i = raw[start + 1] if op == 0x68 else _unpack_I(raw, start + 1)[0]
            if i >= len(memo):
                raise _Refused(f"memo index {i} was never stored (byte {start})") from None
        if pos >= n or start >= n:
            raise _Refused(f"the pickle ends before its STOP (byte {n})") from None
        raise _Refused(f"an opcode with too few items on the stack, or cut short "
                       f"(byte {start})") from None
    except UnicodeDecodeError as e:
        raise _Refused(f"a string that is not valid text ({e.reason}, byte {start})") from None


def _refuse_beyond_int64(root, at: int):
    """Refuse a pickle holding an integer beyond int64, naming where it is in the result as a
    JSON path (``$.segments[0].blocks[0].size``), as the schemas name a field. The walk goes
    through every place of the result at most (bounded by ``PLACES_PER_BYTE``) and holds one
    iterator per level (at most ``MAX_DEPTH``)."""
    def bad(x) -> bool:
        return type(x) is int and not INT64_MIN <= x <= INT64_MAX

    def step(key) -> str:
        return f"[{key}]" if type(key) is int else \
            f".{key}" if key.isidentifier() else f"[{key!r}]"

    def items(x):
        return iter(x.items()) if type(x) is dict else enumerate(x)

    if bad(root):
        raise UnsafePickleError(f"$: the integer {root} is beyond int64")
    if type(root) in (dict, list, tuple):
        todo = [("$", items(root))]
        while todo:
            where, it = todo[-1]
            for key, value in it:
                if bad(value):
                    raise UnsafePickleError(f"{where}{step(key)}: the integer {value} is "
                                            f"beyond int64")
                if type(value) in (dict, list, tuple):
                    todo.append((where + step(key), items(value)))
                    break
            else:
                todo.pop()
    raise _Refused(f"an integer beyond int64 (byte {at})")


def _short_text(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _short(x) -> str:
    """A few characters of a refused key."""
    if type(x) in (str, bytes):
        text = repr(x[:40])
    elif type(x) is tuple:
        return f"a tuple of {len(x)} items"
    else:
        text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."
