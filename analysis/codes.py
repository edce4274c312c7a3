"""Integer codes of a column of shared strings — match ids, groups' rank lists — made a chunk
of rows at a time (issue 51): where every rank's row of an operation shares its id, a job has
far fewer distinct values than rows, and pandas' ``factorize`` sizes its hash table to the rows
it is given."""
from __future__ import annotations

import numpy as np
import pandas as pd

# Rows factorized at a time (``id_codes``); pandas' table is about 80 bytes a row of strings.
ID_CHUNK_ROWS = 65_536


def id_codes(ids: np.ndarray, sort: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of ``ids`` (an object array of shared strings) and the distinct values by
    code, in the order they first appear — or, with ``sort``, in sorted order:
    ``pd.factorize``'s answer, made ``ID_CHUNK_ROWS`` rows at a time so that its hash table is
    sized to a chunk rather than to every rank's rows."""
    known: dict = {}
    codes = np.empty(len(ids), dtype=np.int64)
    for lo in range(0, len(ids), ID_CHUNK_ROWS):
        chunk, distinct = pd.factorize(ids[lo:lo + ID_CHUNK_ROWS], use_na_sentinel=False)
        local = np.fromiter((known.setdefault(x, len(known)) for x in distinct),
                            dtype=np.int64, count=len(distinct))
        codes[lo:lo + len(chunk)] = local[chunk]
    uniques = np.empty(len(known), dtype=object)
    uniques[:] = list(known)
    if not sort:
        return codes, uniques
    order = np.argsort(uniques, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    return position[codes], uniques[order]
