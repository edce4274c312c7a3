"""Import the result tables of NVIDIA's nccl-tests (``all_reduce_perf`` and friends).

``read(path)`` / ``parse(text)`` return one row per message size and placement (nccl-tests
prints an out-of-place and an in-place measurement on each line):

============ ======= =========================================================
column       dtype   meaning
============ ======= =========================================================
op           str     canonical op (``analysis.bandwidth.OPS``)
size_bytes   int     S, the ``size`` column: bytes as nccl-tests counts them
                     (the whole gathered buffer for all_gather, see bandwidth.py)
count        int     elements (``count`` column; per rank for all_gather etc.)
dtype        str     element type as printed (``float``, ``half``...)
redop        str     reduction (``sum``; ``none`` or null where it has none)
root         Int64   root rank (broadcast, reduce); null where not printed / -1
in_place     bool    False: out-of-place columns; True: in-place columns
time_us      float   average time per operation, µs
algbw_gbps   float   algorithm bandwidth, GB/s (1e9 B/s)
busbw_gbps   float   bus bandwidth, GB/s
n_wrong      Int64   the ``#wrong`` / ``error`` column; null where ``N/A``
n_ranks      Int64   ranks in the test (see below); null when the log does not say
============ ======= =========================================================

What is understood of the log: lines may carry a launcher's prefix (``srun -l`` writes
`` 3: ``); NCCL INFO and other lines between the rows are skipped; the column header line
(``#  size  count  type  redop  root  time  algbw  busbw  #wrong ...``) tells which of
``redop`` / ``root`` the rows print. ``n_ranks`` is the number of distinct ``Rank N`` lines
of nccl-tests' ``# Using devices`` block, else the largest ``nranks N`` of NCCL's init lines.
The op comes from the ``op`` argument, else from the file name (``nccl_allreduce.log``,
``alltoall_perf.out``), else from a ``*_perf`` command in the text; logs that name none of
these (a bare ``slurm-104.out``) need ``op=``.

``read_baseline(path)``: a bandwidth baseline for ``--baseline`` — ``meshscope bench-comm``'s
own table (``baseline.parquet`` / ``.csv``), one nccl-tests log, or a folder of ``*.log``.
"""
from __future__ import annotations

import pathlib
import re

import pandas as pd

from meshscope.analysis.comm import bandwidth

_PREFIX = re.compile(r"^\s*\d+:\s")
_RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid")
_NRANKS = re.compile(r"\bnranks\s+(\d+)")
_PERF = re.compile(r"\b(\w+?)_perf\b")
_HEADER = re.compile(r"^#\s+size\s+count\s+type\b")
_NUMBER = re.compile(r"^-?\d+$")

COLUMNS = ("op", "size_bytes", "count", "dtype", "redop", "root", "in_place", "time_us",
           "algbw_gbps", "busbw_gbps", "n_wrong", "n_ranks")


class NcclTestsError(ValueError):
    """A log that holds no nccl-tests table, or whose op cannot be told."""


def _op_from(name: str, text: str) -> str | None:
    op = bandwidth.canonical_op(name)
    if op is None:
        m = _PERF.search(text)
        op = bandwidth.canonical_op(m.group(1)) if m else None
    return op


def _n_ranks(lines: list[str]) -> int | None:
    ranks = {int(m.group(1)) for line in lines if (m := _RANK_LINE.search(line))}
    if ranks:
        return len(ranks)
    counts = [int(m.group(1)) for line in lines if (m := _NRANKS.search(line))]
    return max(counts) if counts else None


def _float(token: str) -> float:
    try:
        return float(token)
    except ValueError:
        return float("nan")


def _int_or_none(token: str | None) -> int | None:
    return int(token) if token is not None and _NUMBER.match(token) else None


def parse(text: str, *, op: str | None = None, n_ranks: int | None = None,
          source: str = "<text>") -> pd.DataFrame:
    """The table of one nccl-tests log (module docstring). ``op``/``n_ranks`` override what
    the log says; NcclTestsError when there is no table or no op."""
    lines = [_PREFIX.sub("", line, count=1) for line in text.splitlines()]
    canon = bandwidth.canonical_op(op) if op else _op_from(pathlib.Path(source).name, text)
    if canon is None:
        raise NcclTestsError(f"{source}: cannot tell which collective this nccl-tests log "
                             f"measured; pass op= (e.g. 'all_to_all')")
    ranks = n_ranks if n_ranks is not None else _n_ranks(lines)
    middle: list[str] | None = None
    groups = 0
    rows = []
    for line in lines:
        if _HEADER.match(line):
            names = line.lstrip("#").split()
            groups = names.count("time")
            middle = names[3:names.index("time")]
            continue
        if middle is None or line.lstrip().startswith("#"):
            continue
        tokens = line.split()
        if len(tokens) < 3 + 4 * groups or not (_NUMBER.match(tokens[0])
                                                and _NUMBER.match(tokens[1])):
            continue
        extra = tokens[3:len(tokens) - 4 * groups]
        fields = dict(zip(middle, extra)) if len(extra) == len(middle) else {
            ("root" if _NUMBER.match(t) else "redop"): t for t in extra}
        root = _int_or_none(fields.get("root"))
        for g in range(groups):
            t, alg, bus, wrong = tokens[len(tokens) - 4 * (groups - g):][:4]
            rows.append({
                "op": canon, "size_bytes": int(tokens[0]), "count": int(tokens[1]),
                "dtype": tokens[2], "redop": fields.get("redop"),
                "root": root if root is not None and root >= 0 else None,
                "in_place": g == 1, "time_us": _float(t), "algbw_gbps": _float(alg),
                "busbw_gbps": _float(bus), "n_wrong": _int_or_none(wrong), "n_ranks": ranks,
            })
    if not rows:
        raise NcclTestsError(f"{source}: no nccl-tests result table found")
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("root", "n_wrong", "n_ranks"):
        df[col] = df[col].astype("Int64")
    for col in ("op", "dtype", "redop"):
        df[col] = df[col].astype("str")
    return df


def read(path: pathlib.Path, *, op: str | None = None,
         n_ranks: int | None = None) -> pd.DataFrame:
    """``parse`` of a log file (read as UTF-8, undecodable bytes replaced)."""
    path = pathlib.Path(path)
    return parse(path.read_text(errors="replace"), op=op, n_ranks=n_ranks, source=str(path))


def read_baseline(path: pathlib.Path) -> pd.DataFrame | None:
    """A bandwidth baseline (module docstring); None for a folder without logs. ``OSError`` or
    ``ValueError`` when the file cannot be read as one."""
    path = pathlib.Path(path)
    if path.is_dir():
        frames = [read(f) for f in sorted(path.glob("*.log"))]
        return pd.concat(frames, ignore_index=True) if frames else None
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    return read(path)
