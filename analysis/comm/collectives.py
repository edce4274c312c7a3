"""What both cross-rank reports need of one rank's collectives: its groups and, on gloo
traces, each collective call paired with the range that ran it.

``rank_groups`` — dimension → the rank's group as ``"r0,r1,…"``: from run.json; for a foreign
trace whose job has a single process group (``distributedInfo.pg_config``: plain DDP), that
group under the dimension ``unknown``.

``gloo_pairs`` — on CPU/gloo traces a collective shows twice: the ``c10d::`` call on the calling
thread (it names the algorithm: ``_reduce_scatter_base_`` is a reduce_scatter, and its start is
the rank's arrival) and the ``gloo:`` range that ran it (on a gloo worker thread, or on the
calling thread for send/recv: its duration and the tensor it moved). Calls and ranges of known
ops (``bandwidth.canonical_op``; barriers and waits are not) are paired in issue order,
point-to-point and collectives separately, since an asynchronous collective's range may start
after a later send.
"""
from __future__ import annotations

import pandas as pd

from meshscope.analysis.ingest import classify
from meshscope.analysis.comm.bandwidth import canonical_op


def rank_groups(rank: int, run: dict | None, meta: dict | None = None) -> dict[str, str]:
    out = {}
    for g in (run or {}).get("process_groups", []):
        if rank in g["ranks"]:
            out.setdefault(g["dimension"], ",".join(map(str, sorted(g["ranks"]))))
    if run is None and meta:
        pgs = (meta.get("distributedInfo") or {}).get("pg_config") or []
        if isinstance(pgs, list) and len(pgs) == 1 and isinstance(pgs[0].get("ranks"), list):
            out["unknown"] = ",".join(map(str, sorted(pgs[0]["ranks"])))
    return out


def call_op(name: str) -> str | None:
    """The op of a ``c10d::`` call (None for barrier, wait and other non-collectives)."""
    return canonical_op(name.split("::")[-1])


def gloo_pairs(comm: pd.DataFrame, *, p2p: bool | None = None):
    """(call, range, op) for the communication events ``comm`` of one rank, in issue order;
    ``p2p`` True / False keeps only point-to-point / collective pairs, None both."""
    calls = comm[comm["name"].str.startswith("c10d::")
                 & comm["name"].map(lambda n: call_op(n) is not None)]
    ranges = comm[comm["name"].str.startswith("gloo:")
                  & comm["name"].map(lambda n: canonical_op(n) is not None)]
    families = (True, False) if p2p is None else (p2p,)
    for family in families:
        c = calls[calls["name"].map(classify.is_p2p) == family].sort_values("ts_us")
        r = ranges[ranges["name"].map(classify.is_p2p) == family].sort_values("ts_us")
        for call, rng in zip(c.itertuples(), r.itertuples()):
            yield call, rng, call_op(call.name)
