"""Collective metadata of trace events: which collective, how many elements, which group.

PyTorch writes it in two places, and ingest (``analysis/ingest/batch_columns.py``) reads both:

- ``record_param_comms`` CPU ops, and on GPUs the NCCL kernels they launch, carry the arguments
  PyTorch's profiler names in ``torch/csrc/profiler/util.h``: ``Collective name``,
  ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Process Group Name``,
  ``Process Group Description``, ``Process Group Ranks`` (a string such as ``"[0, 1]"``),
  ``Group size`` and, in newer releases, ``Seq`` (the collective's sequence number in its group).
- ``gloo:*`` and ``nccl:*`` host ranges (``gloo:all_reduce`` on a gloo worker thread,
  ``nccl:all_reduce`` under ``c10d::allreduce_``) carry only the recorded shapes: ``Input Dims``
  (``[[115456]]``) and ``Input type`` (``["float"]``). There the collective's name is the part of
  the event name after the colon and its size is the first input tensor's.

``Sequence number`` (present on many ops) is autograd's sequence number, not the collective's,
and is never read as ``seq``. ``c10d::*`` calls are not given metadata: their ``Input Dims`` mix
outputs and inputs, and the ``record_param_comms`` or ``gloo:``/``nccl:`` event inside each
already describes the same call.

``msg_bytes`` is ``max(in_nelems, out_nelems) × element size``: the size S of nccl-tests'
bandwidth definitions, i.e. the whole gathered output for all_gather and the whole input for
reduce_scatter (``analysis/comm/bandwidth.py``). Where only ``Input Dims`` exist it is the input
tensor's bytes (for an all_gather that is one rank's share, not S).

Every value is typed where it is read: counts, group sizes and sequence numbers are integers
from 0 (group sizes from 1) to 2⁶³−1, ranks integers from 0, the collective's name a string.
A value that is not is left out of that event's metadata (null), and counted in the ``Damage``
the caller passes (``analysis/ingest/validate.py``): the rank's problems then say how many
events had it. Byte counts that would exceed 2⁶³−1 are unknown, not wrapped.
"""
from __future__ import annotations

import re

from meshscope.analysis.ingest.validate import INT64_MAX, Damage

# Element sizes by dtype, keyed by the lower-case name with any ``c10::``/``torch.`` prefix
# removed. The values are canonical torch names; trace spellings differ ("Float", "float",
# "c10::BFloat16", "BFloat16").
_DTYPES: dict[str, tuple[str, int]] = {}
for _canon, _size, _aliases in (
        ("float32", 4, ("float", "float32")),
        ("float64", 8, ("double", "float64")),
        ("float16", 2, ("half", "float16")),
        ("bfloat16", 2, ("bfloat16",)),
        ("int64", 8, ("long", "int64")),
        ("int32", 4, ("int", "int32")),
        ("int16", 2, ("short", "int16")),
        ("int8", 1, ("char", "int8")),
        ("uint8", 1, ("byte", "uint8")),
        ("uint16", 2, ("uint16",)),
        ("uint32", 4, ("uint32",)),
        ("uint64", 8, ("uint64",)),
        ("bool", 1, ("bool",)),
        ("complex32", 4, ("complexhalf", "complex32")),
        ("complex64", 8, ("complexfloat", "complex64")),
        ("complex128", 16, ("complexdouble", "complex128")),
        ("float8_e4m3fn", 1, ("float8_e4m3fn",)),
        ("float8_e4m3fnuz", 1, ("float8_e4m3fnuz",)),
        ("float8_e5m2", 1, ("float8_e5m2",)),
        ("float8_e5m2fnuz", 1, ("float8_e5m2fnuz",)),
        ("float8_e8m0fnu", 1, ("float8_e8m0fnu",))):
    for _a in _aliases:
        _DTYPES[_a] = (_canon, _size)

COLUMNS = ("coll_name", "in_nelems", "out_nelems", "dtype", "pg_name", "pg_desc", "pg_ranks",
           "group_size", "seq", "msg_bytes")
HOST_PREFIXES = ("gloo:", "nccl:")
_INT_RE = re.compile(r"-?\d+")


def dtype_info(name) -> tuple[str | None, int | None]:
    """(canonical torch dtype name, bytes per element) of a trace's dtype spelling; the name as
    given and ``None`` when unknown."""
    if not isinstance(name, str) or not name:
        return None, None
    key = name.strip().lower()
    for prefix in ("c10::", "torch.", "at::"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    canon = _DTYPES.get(key)
    return (canon[0], canon[1]) if canon else (name, None)


def _int(x, low: int = 0) -> int | None:
    """``x`` when it is an integer from ``low`` to 2⁶³−1 (not a bool), else None."""
    return x if type(x) is int and low <= x <= INT64_MAX else None


def _checked_int(value, field: str, damage: Damage, low: int = 0) -> int | None:
    """``_int(value, low)``, counting a value that is present but unusable."""
    v = _int(value, low)
    if v is None and value is not None:
        damage.ignore(f"args.{field}", f"not an integer from {low} to 2^63-1")
    return v


def _name(value, field: str, damage: Damage) -> str | None:
    """A process group's name or description: a string (a number is read as its text)."""
    if value is None or isinstance(value, str):
        return value
    if _int(value) is not None:
        return str(value)
    damage.ignore(f"args.{field}", "not a string")
    return None


def pg_ranks_str(value) -> str | None:
    """``"[0, 1]"`` or ``[0, 1]`` -> ``"0,1"``; None when absent or not a list of ranks."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [int(v) for v in _INT_RE.findall(value)]
    if isinstance(value, (list, tuple)) and all(_int(v) is not None for v in value):
        return ",".join(str(v) for v in value)
    return None


def _shapes(dims) -> list[list[int]] | None:
    """The tensor shapes of one recorded argument: a shape (``[2, 64, 64]``) or a tensor list
    (``[[115456], [3]]``); None when ``dims`` is neither (deeper nesting included)."""
    if not isinstance(dims, list):
        return None
    shapes = [dims] if all(type(d) is int for d in dims) else dims
    if all(isinstance(s, list) and all(type(d) is int for d in s) for s in shapes):
        return shapes
    return None


def _numel(dims) -> int | None:
    """Elements of one recorded argument (``_shapes``): the sum over its tensors; None when it
    is not a shape or a tensor list, has a negative dimension or more than 2⁶³−1 elements."""
    shapes = _shapes(dims)
    if shapes is None or any(d < 0 for s in shapes for d in s):
        return None
    total = 0
    for shape in shapes:
        if 0 in shape:
            continue
        n = 1
        for d in shape:          # stops as soon as the count is too large (no huge products)
            n *= d
            if n > INT64_MAX:
                return None
        total += n
    return total if total <= INT64_MAX else None


def _bytes(count: int | None, size: int | None) -> int | None:
    if count is None or size is None or count * size > INT64_MAX:
        return None
    return count * size


def tensor_bytes(dims, dtype) -> int | None:
    """Bytes of one recorded argument — a shape, or a tensor list whose tensors are summed
    (``_numel``) — of element type ``dtype`` (``dtype_info``); None when either is unknown or
    the count is impossible."""
    return _bytes(_numel(dims), dtype_info(dtype)[1])


def from_record(args, damage: Damage) -> dict | None:
    """Metadata from ``record_param_comms``-style arguments (``args`` has the attributes
    named in ``analysis.ingest.decode.Args``); None when the collective's name is not a
    string. Unusable values are counted in ``damage``."""
    if not isinstance(args.coll_name, str):
        damage.ignore("args.Collective name", "not a string")
        return None
    in_n = _checked_int(args.in_nelems, "In msg nelems", damage)
    out_n = _checked_int(args.out_nelems, "Out msg nelems", damage)
    dtype, size = dtype_info(args.dtype)
    ranks = pg_ranks_str(args.pg_ranks)
    if ranks is None and args.pg_ranks is not None:
        damage.ignore("args.Process Group Ranks", "not a list of ranks (integers from 0)")
    group = _checked_int(args.group_size, "Group size", damage, low=1)
    if group is None and ranks:
        group = ranks.count(",") + 1
    seq = _checked_int(args.seq, "Seq", damage)
    counts = [n for n in (in_n, out_n) if n is not None]
    return {
        "coll_name": args.coll_name,
        "in_nelems": in_n, "out_nelems": out_n, "dtype": dtype,
        "pg_name": _name(args.pg_name, "Process Group Name", damage),
        "pg_desc": _name(args.pg_desc, "Process Group Description", damage),
        "pg_ranks": ranks, "group_size": group,
        "seq": seq if seq is not None else -1,
        "msg_bytes": _bytes(max(counts), size) if counts else None,
    }


def from_host_range(name: str, dims, types, damage: Damage) -> dict:
    """Metadata of a ``gloo:*`` / ``nccl:*`` range from its decoded ``Input Dims`` and
    ``Input type`` (either may be None); a shape that is not one is counted in ``damage``."""
    first = dims[0] if isinstance(dims, list) and dims else None
    n = _numel(first)
    if n is None and _shapes(first) is not None:
        damage.ignore("args.Input Dims", "a negative dimension or more than 2^63-1 elements")
    tname = types[0] if isinstance(types, list) and types else None
    dtype, size = dtype_info(tname)
    return {
        "coll_name": name.split(":", 1)[1],
        "in_nelems": n, "out_nelems": None, "dtype": dtype,
        "pg_name": None, "pg_desc": None, "pg_ranks": None, "group_size": None, "seq": -1,
        "msg_bytes": _bytes(n, size),
    }
