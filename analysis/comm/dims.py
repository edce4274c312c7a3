"""Which parallel dimension a communication operation belongs to, and how that was decided.

``attribute(...)`` returns ``(dim, source)``; ``source`` says which evidence decided, from the
most direct to the least (``meshscope.vocabulary.DIM_SOURCES``):

- ``trace``: the group's description in the trace or its Flight Recorder entry is a DeviceMesh
  name, ``mesh_<dim>`` (torchtitan's ``dp_shard``, ``dp_replicate`` … count as ``dp``);
- ``run.json``: run.json names the group (by torch's group name, else by its rank set);
- ``flight_recorder``: the same, for an instance matched to a Flight Recorder entry, whose
  group name and rank set the analysis then took from that entry (``comm/instances.py``);
- ``--layout``: a layout given for a foreign job maps the group's rank set to a dimension
  (``LayoutMap``);
- ``scope``: a ``meshscope/comm dim=D`` range encloses the call;
- ``layout``: the run's layout alone: send/recv are pipeline traffic when pp > 1 (context
  parallelism's ring when only cp > 1), all_to_all is expert traffic when ep > 1, and any other
  collective belongs to the one remaining dimension of size > 1;
- ``world``: no operation names a group, every rank has a trace and all issued the same
  collectives: they are taken to be on the world group, dimension still unknown
  (``comm/matching.py``);
- ``unknown``: none of these.

``LayoutMap`` — for traces of another framework, whose groups carry no mesh names:
``meshscope analyze --layout dp=4,tp=2,pp=2 --rank-order tp-dp-pp`` says how ranks were laid
out (``rank_order`` lists the dimensions from the fastest-varying to the slowest). Megatron-LM
orders ranks tp-cp-ep-dp-pp (its default ``--rank-order``: tensor-parallel ranks adjacent,
pipeline stages farthest apart); torchtitan's DeviceMesh is [pp, dp_replicate, dp_shard, cp, tp]
outermost first, i.e. tp-cp-dp-pp; meshscope's own runner is tp-cp-dp-pp too. A group is
mapped to the dimension whose rank set it equals.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from meshscope.analysis import intervals as iv
from meshscope.analysis.comm.bandwidth import ALL_TO_ALL
from meshscope.collectors.run_info import MESH_DIMENSIONS, RunInfo, ranks_key
from meshscope.vocabulary import PARALLEL_DIMS, UNKNOWN_DIM

UNKNOWN = UNKNOWN_DIM
RANK_ORDERS = {"megatron": "tp-cp-ep-dp-pp", "torchtitan": "tp-cp-dp-pp",
               "meshscope": "tp-cp-dp-pp"}


def from_desc(desc) -> str | None:
    """``mesh_dp`` → ``dp``, ``mesh_dp_shard`` → ``dp``; None for other descriptions."""
    if not isinstance(desc, str) or not desc.startswith("mesh_"):
        return None
    name = desc[len("mesh_"):]
    return MESH_DIMENSIONS.get(name, name)


@dataclasses.dataclass(frozen=True)
class LayoutMap:
    """Rank set → dimension for a job laid out as ``sizes`` in ``order`` (fastest first)."""
    sizes: dict[str, int]
    order: tuple[str, ...]

    @classmethod
    def parse(cls, layout: str, rank_order: str | None = None) -> "LayoutMap":
        """``"dp=4,tp=2,pp=2"`` and ``"tp-dp-pp"`` (or ``megatron`` / ``torchtitan``); ValueError
        naming the problem."""
        sizes: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in layout.split(","))):
            name, sep, value = part.partition("=")
            if not sep or name not in PARALLEL_DIMS or not value.isdigit() or int(value) < 1:
                raise ValueError(f"--layout part {part!r}: expected DIM=N with DIM one of "
                                 f"{', '.join(PARALLEL_DIMS)} and N ≥ 1")
            sizes[name] = int(value)
        order_text = RANK_ORDERS.get(rank_order or "meshscope", rank_order or "")
        order = tuple(d for d in order_text.split("-") if d)
        if set(order) - set(PARALLEL_DIMS) or len(set(order)) != len(order):
            raise ValueError(f"--rank-order {rank_order!r}: expected dimensions joined by '-' "
                             f"(e.g. tp-cp-ep-dp-pp), or one of {', '.join(RANK_ORDERS)}")
        # ep borrows ranks from dp (and cp): it is not a factor of the world size.
        missing = [d for d in sizes if d != "ep" and sizes[d] > 1 and d not in order]
        if missing:
            raise ValueError(f"--rank-order {order_text!r} does not place {', '.join(missing)}")
        return cls(sizes, order)

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes.get(d, 1) for d in self.order if d != "ep")

    def groups(self) -> dict[str, str]:
        """ranks_key → dimension for every group of every dimension of size > 1."""
        dims = [d for d in self.order if d != "ep"]
        strides, s = {}, 1
        for d in dims:
            strides[d] = s
            s *= self.sizes.get(d, 1)
        out: dict[str, str] = {}
        for dim in dims:
            n = self.sizes.get(dim, 1)
            if n < 2:
                continue
            others = [d for d in dims if d != dim]
            for fixed in itertools.product(*(range(self.sizes.get(d, 1)) for d in others)):
                base = sum(i * strides[d] for d, i in zip(others, fixed))
                out.setdefault(ranks_key(base + i * strides[dim] for i in range(n)), dim)
        ep = self.sizes.get("ep", 1)
        if ep > 1:  # ep groups: consecutive ranks along dp (×cp), as torchtitan carves them
            inner = [d for d in dims if d in ("cp", "dp")]
            for key, dim in list(out.items()):
                if dim == inner[-1] if inner else False:
                    ranks = [int(x) for x in key.split(",")]
                    for i in range(0, len(ranks), ep):
                        out.setdefault(ranks_key(ranks[i:i + ep]), "ep")
        return out


def _layout_guess(op: str, p2p: bool, run: RunInfo | None, in_ring: bool) -> str | None:
    if run is None:
        return None
    big = [d for d in PARALLEL_DIMS if run.size(d) > 1]
    if p2p:
        if "pp" in big and not in_ring:
            return "pp"
        if "cp" in big:
            return "cp"
        return "pp" if "pp" in big else None
    if op == ALL_TO_ALL and "ep" in big:
        return "ep"
    others = [d for d in big if d not in ("pp", "ep")]
    return others[0] if len(others) == 1 else None


def attribute(*, op: str, p2p: bool, pg_name, pg_desc, pg_ranks: str, run: RunInfo | None,
              layout_map: dict[str, str] | None, scope: str | None,
              in_ring: bool = False) -> tuple[str, str]:
    """(dimension, source) of one operation (module docstring)."""
    dim = from_desc(pg_desc)
    if dim is not None:
        return dim, "trace"
    if run is not None:
        g = run.group_named(pg_name) if pg_name is not None else None
        if g is not None and g.dimension in PARALLEL_DIMS:
            return g.dimension, "run.json"
        if pg_ranks:
            dims = [d for d in run.dims_of_ranks(pg_ranks.split(",")) if d in PARALLEL_DIMS]
            if op == ALL_TO_ALL and "ep" in dims:
                return "ep", "run.json"
            if len(set(dims)) == 1:
                return dims[0], "run.json"
    if layout_map and pg_ranks and pg_ranks in layout_map:
        return layout_map[pg_ranks], "--layout"
    if scope:
        return scope, "scope"
    guess = _layout_guess(op, p2p, run, in_ring)
    if guess is not None:
        return guess, "layout"
    return UNKNOWN, "unknown"


# The instance table's columns that ``interval_sets`` reads.
INTERVAL_COLUMNS = ["dim", "op", "call_ts_us", "call_end_us", "exec_ts_us", "exec_end_us",
                    "end_us"]


def interval_sets(inst, waits, wait_until) -> dict[tuple[str, str], "np.ndarray"]:
    """(dimension, op) → the rank's communication time of that dimension and op: the host
    calls and the executing spans of its instances (``analysis/comm/instances.py``) and the
    waits that ended when one of them completed. ``by_dimension`` unites them per dimension;
    the step breakdown splits exposed communication by these sets
    (``analysis/timeline/breakdown.py``)."""
    out: dict[tuple[str, str], np.ndarray] = {}
    if inst is None or len(inst) == 0:
        return out
    inst = inst[inst["dim"].notna()]
    inst = inst.assign(op=inst["op"].astype(object).where(inst["op"].notna(), "unknown"))
    ends = {}
    for (dim, op), g in inst.groupby(["dim", "op"], sort=True, observed=True):
        key = (str(dim), str(op))
        starts = np.concatenate([g["call_ts_us"].to_numpy(float), g["exec_ts_us"].to_numpy(float)])
        stops = np.concatenate([g["call_end_us"].to_numpy(float), g["exec_end_us"].to_numpy(float)])
        ok = np.isfinite(starts) & np.isfinite(stops)
        out[key] = iv.union(starts[ok], stops[ok])
        for e in g["end_us"].to_numpy(float):
            ends[round(float(e), 3)] = key
    if len(waits):
        extra: dict[tuple[str, str], list] = {}
        for (a, b), c in zip(waits, wait_until):
            key = ends.get(round(float(c), 3))
            if key is not None:
                extra.setdefault(key, []).append((a, b))
        for key, spans in extra.items():
            out[key] = iv.merge(out.get(key, iv.EMPTY), np.array(spans, dtype=np.float64))
    return out


def by_dimension(sets: dict[tuple[str, str], "np.ndarray"]) -> dict[str, "np.ndarray"]:
    """dimension → the union of its ops' sets (``interval_sets``), in the order of the
    dimensions' first appearance there (sorted)."""
    out: dict[str, list] = {}
    for (dim, _), x in sets.items():
        out.setdefault(dim, []).append(x)
    return {d: iv.merge(*xs) for d, xs in out.items()}
