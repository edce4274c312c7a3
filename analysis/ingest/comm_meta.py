"""Collective metadata of trace events: which collective, how many elements, which group.

PyTorch writes it in two places, and ingest (``analysis/ingest.py``) reads both:

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
reduce_scatter (``analysis/bandwidth.py``). Where only ``Input Dims`` exist it is the input
tensor's bytes (for an all_gather that is one rank's share, not S).
"""
from __future__ import annotations

import math
import re

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


def _int(x) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def pg_ranks_str(value) -> str | None:
    """``"[0, 1]"`` or ``[0, 1]`` -> ``"0,1"``; None when absent."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value if _int(v) is not None)
    if isinstance(value, str):
        return ",".join(_INT_RE.findall(value))
    return None


def _numel(dims) -> int | None:
    """Elements of one recorded tensor shape (``[2, 64, 64]``) or a tensor list
    (``[[115456], [3]]``): the sum over its tensors."""
    if not isinstance(dims, list):
        return None
    if all(_int(d) is not None for d in dims):
        return math.prod(dims)
    if all(isinstance(d, list) for d in dims):
        parts = [_numel(d) for d in dims]
        return sum(parts) if parts and None not in parts else None
    return None


def from_record(args) -> dict:
    """Metadata from ``record_param_comms``-style arguments (``args`` has the attributes
    named in ``analysis.ingest._Args``)."""
    in_n, out_n = _int(args.in_nelems), _int(args.out_nelems)
    dtype, size = dtype_info(args.dtype)
    ranks = pg_ranks_str(args.pg_ranks)
    group = _int(args.group_size)
    if group is None and ranks:
        group = ranks.count(",") + 1
    counts = [n for n in (in_n, out_n) if n is not None]
    return {
        "coll_name": str(args.coll_name),
        "in_nelems": in_n, "out_nelems": out_n, "dtype": dtype,
        "pg_name": None if args.pg_name is None else str(args.pg_name),
        "pg_desc": None if args.pg_desc is None else str(args.pg_desc),
        "pg_ranks": ranks, "group_size": group,
        "seq": _int(args.seq) if _int(args.seq) is not None else -1,
        "msg_bytes": max(counts) * size if counts and size is not None else None,
    }


def from_host_range(name: str, dims, types) -> dict:
    """Metadata of a ``gloo:*`` / ``nccl:*`` range from its decoded ``Input Dims`` and
    ``Input type`` (either may be None)."""
    n = _numel(dims[0]) if isinstance(dims, list) and dims else None
    tname = types[0] if isinstance(types, list) and types else None
    dtype, size = dtype_info(tname)
    return {
        "coll_name": name.split(":", 1)[1],
        "in_nelems": n, "out_nelems": None, "dtype": dtype,
        "pg_name": None, "pg_desc": None, "pg_ranks": None, "group_size": None, "seq": -1,
        "msg_bytes": n * size if n is not None and size is not None else None,
    }
