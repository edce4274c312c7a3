"""Arrow dictionary columns built batch by batch — each part with a dictionary of its own —
joined into one column of one dictionary: the event table's string columns
(``events.py``) and the [memory] events' lanes (``memory_events.py``)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa


def joined_codes(parts: list) -> tuple[np.ndarray, list[str]]:
    """(codes, values) of dictionary arrays with dictionaries of their own joined into one
    dictionary: each part's codes mapped to the joined dictionary's, int32, -1 for a null."""
    codes: dict[str, int] = {}
    out = []
    for part in parts:
        remap = np.array([codes.setdefault(v, len(codes)) for v in part.dictionary.to_pylist()]
                         + [-1], dtype=np.int32)
        idx = part.indices
        out.append(remap[(idx.fill_null(-1) if idx.null_count else idx)
                         .to_numpy(zero_copy_only=False)])
    return (np.concatenate(out) if out else np.zeros(0, dtype=np.int32)), list(codes)


def one_dictionary(parts: list) -> pa.DictionaryArray:
    """Dictionary arrays with dictionaries of their own joined into one array of one
    dictionary (``joined_codes``; a null stays null)."""
    codes, values = joined_codes(parts)
    missing = codes < 0
    indices = pa.array(codes, pa.int32(), mask=missing) if missing.any() else \
        pa.array(codes, pa.int32())
    return pa.DictionaryArray.from_arrays(indices, pa.array(values, pa.large_string()))
