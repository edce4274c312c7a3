"""Which rank a trace is: from ``--rank-regex``, the trace's ``distributedInfo`` or its name.

``rank_of`` decides, in this order: with ``--rank-regex`` (``compile_rank_regex``: one group,
the rank, searched for in the file name) the file name's rank when it matches — the user's
explicit choice, which also settles two files whose ``distributedInfo`` claims one rank; else
``distributedInfo.rank``; else the file name's ``rank3``, ``rank-3``, ``rank_3`` or
``worker3`` (``RANK_FROM_NAME``, ``name_rank``). When nothing gives one it raises
``InputError`` with ``NO_RANK``, or, asked with ``missing_ok``, returns None: ``load_trace``
then reads the trace as rank 0 and says so, and ``report.inputs.resolve_identities`` refuses
such a trace when it is not the only one.
"""
from __future__ import annotations

import pathlib
import re

from meshscope.analysis.ingest import validate
from meshscope.analysis.errors import InputError

RANK_FROM_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
NO_RANK = ("no rank: the trace has no distributedInfo.rank and the file name has no rank<N> or "
           "worker<N>; pass --rank-regex with one group that captures the rank from the file "
           "name (e.g. 'gpu(\\d+)')")


def compile_rank_regex(pattern: str | re.Pattern | None) -> re.Pattern | None:
    """A ``--rank-regex``: applied with ``re.search`` to the file name; its one group is the
    rank. ValueError when it does not compile or has not exactly one group."""
    if pattern is None or isinstance(pattern, re.Pattern):
        rx = pattern
    else:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"--rank-regex {pattern!r} is not a regular expression ({e})") \
                from None
    if rx is not None and rx.groups != 1:
        raise ValueError(f"--rank-regex {rx.pattern!r} must have exactly one group (the rank), "
                         f"it has {rx.groups}")
    return rx


def name_rank(path: pathlib.Path, rank_regex: re.Pattern | None = None) -> int | None:
    """The rank a file name gives: with ``--rank-regex`` its group, otherwise ``rank3``,
    ``rank-3``, ``rank_3`` or ``worker3``; None when it gives none."""
    m = (rank_regex or RANK_FROM_NAME).search(pathlib.Path(path).name)
    if m and m.group(1) is not None and m.group(1).isdigit():
        return int(m.group(1))
    return None


def rank_of(path: pathlib.Path, doc: dict, rank_regex: re.Pattern | str | None = None, *,
            missing_ok: bool = False) -> int | None:
    """The rank of a trace: with ``--rank-regex`` the file name's, when it matches (the user's
    explicit choice: it also settles two files whose ``distributedInfo`` claims one rank);
    else ``distributedInfo.rank`` (``doc`` checked by ``validate.trace_meta``); else the file
    name's ``rank3``, ``rank-3``, ``rank_3`` or ``worker3``. When nothing gives one:
    InputError (``NO_RANK``), or None with ``missing_ok`` and no ``--rank-regex``."""
    rx = compile_rank_regex(rank_regex)
    if rx is not None and name_rank(path, rx) is not None:
        return name_rank(path, rx)
    info = validate.info_rank(doc)
    if info is not None:
        return info
    if rx is not None:
        raise InputError(path, f"no rank: the trace has no distributedInfo.rank and the file "
                               f"name does not match --rank-regex {rx.pattern!r} with a number")
    from_name = name_rank(path)
    if from_name is not None:
        return from_name
    if missing_ok:
        return None
    raise InputError(path, NO_RANK)
