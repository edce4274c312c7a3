"""plan.json: a plan as JSON, and the rates and comm model it was made with read back.

A sweep writes its plan before the first run (``SWEEP/plan.json``); ``meshscope compare
SWEEP`` reads the rates and comm model back (``load_rates``) to put the same predictions beside
the measured numbers.
"""
from __future__ import annotations

import json
import pathlib

from .comm_model import CommModel
from .cost import Rates
from .planner import Plan


def comm_to_dict(comm: CommModel) -> dict:
    return {"alpha_us": comm.alpha_us, "busbw_gbps": comm.busbw_gbps, "source": comm.source,
            "table": [{"op": op, "n_ranks": n, "points": pts}
                      for (op, n), pts in sorted(comm.table.items())]}


def comm_from_dict(d: dict) -> CommModel:
    table = {(t["op"], int(t["n_ranks"])): [tuple(map(float, p)) for p in t["points"]]
             for t in d.get("table") or []}
    return CommModel(alpha_us=float(d["alpha_us"]), busbw_gbps=float(d["busbw_gbps"]),
                     table=table, source=str(d.get("source") or "table"))


def plan_to_dict(p: Plan) -> dict:
    d = p.as_dict()
    d["comm_model"] = comm_to_dict(p.comm) if p.comm else None
    return d


def rates_from_dict(d: dict) -> Rates:
    d = dict(d)
    d["exposure"] = tuple(sorted((d.get("exposure") or {}).items()))
    return Rates(**d)


def load_rates(path: pathlib.Path) -> tuple[Rates, CommModel] | None:
    """The rates and comm model of a written plan.json; None when it has no rates or cannot
    be read (a plan of memory and traffic only)."""
    try:
        d = json.loads(pathlib.Path(path).read_text())
        if not d.get("rates"):
            return None
        return rates_from_dict(d["rates"]), comm_from_dict(d.get("comm_model") or
                                                           {"alpha_us": 50, "busbw_gbps": 1})
    except (OSError, ValueError, KeyError, TypeError):
        return None
