"""The event table: its columns, their Arrow schema, the damage kept with it, and the frame.

A rank's trace is read (``events.load_trace``) into one table with a row per complete event
(``ph == "X"``, or a ``B``/``E`` pair), in file order (a pair where its ``E`` is):

=========== ======== ============================================================
column      dtype    meaning
=========== ======== ============================================================
name        category event name (the frame's ten string columns are pandas
                     categoricals: codes into their sorted distinct values, missing
                     where null, ``CATEGORICAL``; dictionary-encoded in the Arrow
                     table and its cache, ``NAMES``)
cat         category Kineto category as today's profiler names it (``cpu_op``,
                     ``kernel``, ``user_annotation``…; PyTorch 1.8's renamed:
                     ``events.py``)
ts_us       float    start, µs on the trace's clock
dur_us      float    duration, µs
lane        category ``gpu:<device>:<stream>`` for device events, ``cpu:<pid>:<tid>`` else
device      bool     True for GPU kernels / memcpy / memset
kind        category one of ``classify.KINDS``
correlation int      launch correlation id linking a GPU event to its CPU runtime
                     call (``cuda_runtime`` / ``cuda_driver``); -1 where absent
end_us      float    ts_us + dur_us
coll_name   category collective name as the trace spells it (``allreduce``,
                     ``_allgather_base``, ``all_reduce`` from ``gloo:all_reduce``);
                     null on events that carry no collective metadata
in_nelems   Int64    input elements (``In msg nelems``, or ``Input Dims`` of a
                     ``gloo:``/``nccl:`` range); null where unknown
out_nelems  Int64    output elements (``Out msg nelems``); null where unknown
dtype       category element type, canonical torch name (``float32``, ``bfloat16``);
                     the trace's spelling when unknown
pg_name     category process group name (``"0"``, ``"3"``)
pg_desc     category process group description (``default_pg``, ``mesh_tp``…)
pg_ranks    category global ranks of the group, comma-separated (``"0,1"``)
group_size  Int64    ranks in the group (``Group size``, else the count of pg_ranks)
seq         int      the collective's sequence number in its group (``Seq``); -1
                     where absent
msg_bytes   Int64    bytes S of the collective as nccl-tests defines them:
                     max(in_nelems, out_nelems) × element size; for ranges with only
                     ``Input Dims``, the input tensor's bytes
call_args   category on ``c10d::`` calls and matrix multiplications (``aten::mm``,
                     ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``) only: their
                     recorded arguments as JSON text, ``{"dims": Input Dims, "types":
                     Input type, "scalars": Concrete Inputs}`` (the peer of a send/recv,
                     the output and input buffers of an all_to_all:
                     ``analysis/comm/instances.py``; a GEMM's shapes:
                     ``analysis/gpu/kernels.py``); null elsewhere
=========== ======== ============================================================

Where the collective metadata comes from is spelled out in ``analysis/ingest/comm_meta.py``.

``SCHEMA`` is the Arrow table's (the string columns dictionary-encoded, ``NAMES``): what the
reader builds (``accumulator.py``) and the cache stores (``cache.py``). ``to_frame`` makes the
pandas frame of it (``RankTrace.events``): the string columns as categoricals
(``CATEGORICAL``), the columns that may be unknown as nullable ``Int64``. What ingest dropped
or ignored as damaged travels in the Arrow table's schema metadata (``with_damage``,
``damage_of``), so that a table read from the cache reports it too. A change to the columns or
their meaning bumps ``events.INGEST_VERSION``, which is part of the cache key.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from meshscope.analysis.ingest import allocator
from meshscope.analysis.ingest.dictionaries import joined_codes as _joined_codes
from meshscope.analysis.ingest.validate import Damage

_NULLABLE_INT = ("in_nelems", "out_nelems", "group_size", "msg_bytes")
# The string columns are dictionary-encoded in the Arrow table and its cache (int32 codes into
# the distinct values: a trace has hundreds of names among millions of events, and the
# collective metadata and call_args are null on all but a few), pandas categoricals in the
# frame (``to_frame``).
NAMES = pa.dictionary(pa.int32(), pa.large_string())
SCHEMA = pa.schema([
    ("name", NAMES), ("cat", NAMES), ("ts_us", pa.float64()),
    ("dur_us", pa.float64()), ("lane", NAMES), ("device", pa.bool_()),
    ("kind", NAMES), ("correlation", pa.int64()), ("end_us", pa.float64()),
    ("coll_name", NAMES), ("in_nelems", pa.int64()), ("out_nelems", pa.int64()),
    ("dtype", NAMES), ("pg_name", NAMES), ("pg_desc", NAMES), ("pg_ranks", NAMES),
    ("group_size", pa.int64()), ("seq", pa.int64()), ("msg_bytes", pa.int64()),
    ("call_args", NAMES),
])

# Key of the table's schema metadata under which what ingest dropped or ignored is kept.
DAMAGE_KEY = b"meshscope.damage"


def damage_of(table: pa.Table) -> Damage:
    """What ingest dropped or ignored making ``table`` (``events.parse_events``)."""
    return Damage.from_json((table.schema.metadata or {}).get(DAMAGE_KEY))


def with_damage(table: pa.Table, damage: Damage) -> pa.Table:
    """``table`` with ``damage`` in its schema metadata under ``DAMAGE_KEY`` (``damage_of``
    reads it); ``table`` itself when there is none."""
    if not damage:
        return table
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          DAMAGE_KEY: damage.to_json()})


def to_frame(table: pa.Table | list, *, release: bool = False) -> pd.DataFrame:
    """The pandas events table of an Arrow one (the module docstring's dtypes: categoricals for
    the string columns, nullable Int64 where documented). ``release``: each Arrow column is
    let go as soon as it is converted (the plain ones with ``self_destruct``), so that the
    table and the frame are not both held whole; ``table`` must not be used afterwards. Its
    memory is freed then only if nothing else holds the table: pass it as a list holding it
    alone (``[table]``, emptied here), which lets the caller drop its own reference."""
    if isinstance(table, list):
        table = table.pop()
    converted = {}
    for col in CATEGORICAL + _NULLABLE_INT:
        column = table.column(col)
        converted[col] = _categorical(column) if col in CATEGORICAL else \
            column.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        if release:
            table = table.drop_columns([col])
            del column
            allocator.trim()
    rest = table.drop_columns([c for c in CATEGORICAL + _NULLABLE_INT
                               if c in table.column_names])
    del table
    df = rest.to_pandas(self_destruct=True, split_blocks=True) if release else rest.to_pandas()
    del rest
    for col, values in converted.items():
        df[col] = values
    return df[[f.name for f in SCHEMA]]


# Columns of strings held in the frame as integer codes into a table of their distinct values
# (pandas categoricals, missing where the table has null): a trace has a few hundred distinct
# names among millions of events, and the collective metadata's strings are null on all but
# the few events that carry them (as 8-byte string offsets they were a third of a tiny
# event's frame; as codes they take a byte or two).
CATEGORICAL = ("name", "cat", "lane", "kind", "coll_name", "dtype", "pg_name", "pg_desc",
               "pg_ranks", "call_args")


def _categorical(column: pa.ChunkedArray) -> pd.Categorical:
    """``column`` (strings, dictionary-encoded or not, in one or more chunks; nulls allowed)
    as a pandas categorical whose categories are its distinct values in sorted order, so that
    sorting and grouping by it order rows as the strings themselves would; a null is missing
    (code -1). Only the codes are copied, never the strings."""
    parts = column.chunks if column.num_chunks else [pa.array([], NAMES)]
    if not pa.types.is_dictionary(column.type):
        parts = [pc.dictionary_encode(p) for p in parts]
    codes, values = _joined_codes(parts)
    order = sorted(range(len(values)), key=values.__getitem__)
    rank = np.empty(len(values) + 1, dtype=np.int32)
    rank[order] = np.arange(len(values), dtype=np.int32)
    rank[-1] = -1                               # a null's code, -1, indexes this
    return pd.Categorical.from_codes(rank[codes],
                                     categories=pd.Index([values[i] for i in order], dtype=str))


def names_where(names: pd.Series, test) -> np.ndarray:
    """Which rows of a name column (``name`` of the event table, categorical: few distinct
    values) pass ``test`` — a predicate of the text, or a pattern's ``match`` / ``search`` —,
    each distinct name tested once; a missing name does not."""
    codes, uniques = pd.factorize(names)
    return np.array([bool(test(str(u))) for u in uniques] + [False], dtype=bool)[codes]
