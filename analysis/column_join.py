"""Frames put together one column at a time (issue 51): each frame's columns are copied out as
the frame comes (so the frame itself can go), and each column of the result is joined and its
pieces dropped before the next — the pieces and one joined column at most, where one
``pd.concat`` of the frames holds them and the whole result at once. For the cross-rank stage's
tables of a row per operation and rank: the instance tables of whole ranks, a table's columns
read back from its parts on disk."""
from __future__ import annotations

from typing import Iterable

import pandas as pd


def joined_by_column(frames: Iterable[pd.DataFrame], names: list[str]) -> pd.DataFrame | None:
    """The columns ``names`` of ``frames`` one after another, as ``pd.concat(frames,
    ignore_index=True)[names]`` gives them (each column's type reconciled as pandas joins it);
    None when there is no frame."""
    pieces: dict[str, list[pd.Series]] = {n: [] for n in names}
    seen = False
    for frame in frames:
        seen = True
        for n in names:
            pieces[n].append(frame[n].copy(deep=True))
        del frame
    if not seen:
        return None
    return pd.DataFrame({n: pd.concat(pieces.pop(n), ignore_index=True) for n in names},
                        copy=False)
