"""Where each process group's ranks sit, and the link that carries its traffic.

A cluster has two link levels: inside a node (NVLink / NVSwitch, or AMD's xGMI) and between
nodes (InfiniBand or RoCE, one NIC per GPU). Ranks are numbered as the runner's mesh lays them
out (``vocabulary.MESH_ORDER``: pp outermost, then dp, cp, tp innermost) and placed
``gpus_per_node`` to a node in rank order. A group of dimension d is a run of ranks spaced by
the product of the sizes inside d; it stays in one node when its span (stride × size) fits in
a node — so tp groups of up to a node's GPUs use NVLink, and everything spanning nodes uses the
network. Expert parallelism takes its groups from consecutive dp · cp ranks (the runner's
``ep`` sub-mesh), ``ep_replica`` the rest of them.

Each level has a latency α and a bus bandwidth: a collective of S bytes over n ranks takes
α + S·f(op, n)/busbw (nccl-tests' bus factor f, ``comm_model.py``). The defaults are the
vendors' per-GPU figures derated to what nccl-tests typically reaches; pass measured ones
(``--intra-gbps``, ``--inter-gbps`` or ``--baseline``) for a real cluster. The defaults
are the device catalogue's (``devices.py``), each with its source.
"""
from __future__ import annotations

import dataclasses

from .candidate import Candidate
from .comm_model import CommModel
from .devices import DeviceSpec, lookup
from meshscope.vocabulary import MESH_ORDER

DEFAULT_LINKS = {"intra": (100.0, 10.0), "inter": (20.0, 15.0)}


@dataclasses.dataclass
class Topology:
    gpus_per_node: int
    intra: CommModel            # inside a node
    inter: CommModel            # between nodes, one GPU's NIC
    _rails: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    _links: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def for_device(cls, device, gpus_per_node: int | None = None, *,
                   intra_gbps: float | None = None, inter_gbps: float | None = None,
                   intra_us: float | None = None, inter_us: float | None = None
                   ) -> "Topology":
        """The two levels of ``device`` (a ``devices.DeviceSpec`` or a catalogue name; its
        link values, or ``DEFAULT_LINKS`` for an unknown one), each overridable."""
        spec = device if isinstance(device, DeviceSpec) else lookup(device)
        if spec is not None:
            bw_i, lat_i = spec.intra_gbps, spec.intra_us
            bw_x, lat_x = spec.inter_gbps, spec.inter_us
            gpus_per_node = gpus_per_node or spec.gpus_per_node
            name = spec.name
        else:
            (bw_i, lat_i), (bw_x, lat_x) = DEFAULT_LINKS["intra"], DEFAULT_LINKS["inter"]
            name = device or "default"
        gpus_per_node = gpus_per_node or 8
        src = f"{name} links"
        return cls(gpus_per_node,
                   CommModel(alpha_us=intra_us if intra_us is not None else lat_i,
                             busbw_gbps=intra_gbps or bw_i, source=f"{src}, in a node"),
                   CommModel(alpha_us=inter_us if inter_us is not None else lat_x,
                             busbw_gbps=inter_gbps or bw_x, source=f"{src}, between nodes"))

    def _group(self, cand: Candidate, dim: str) -> tuple[int, int] | None:
        """(stride, ranks) of a group of ``dim``: its ranks are ``stride`` apart."""
        layout = cand.layout
        sizes = {d: layout.size(d) for d in MESH_ORDER}
        if dim == "ep":
            return sizes["tp"], layout.size("ep")
        if dim == "ep_replica":
            ep = layout.size("ep")
            return sizes["tp"] * ep, max(1, sizes["dp"] * sizes["cp"] // ep)
        if dim == "dp" and sizes["cp"] > 1:        # gradients reduce over dp × cp
            return sizes["tp"], sizes["dp"] * sizes["cp"]
        if dim not in sizes:
            return None
        stride = 1
        for d in MESH_ORDER[MESH_ORDER.index(dim) + 1:]:
            stride *= sizes[d]
        return stride, sizes[dim]

    def level_of(self, cand: Candidate, dim: str) -> str:
        """``intra`` or ``inter``: where the groups of ``dim`` run."""
        g = self._group(cand, dim)
        if g is None:
            return "intra"
        stride, n = g
        return "intra" if stride * n <= self.gpus_per_node else "inter"

    def ranks_per_node(self, cand: Candidate, dim: str) -> int:
        """How many of a group's ranks share a node (1 when its ranks are a node apart)."""
        g = self._group(cand, dim)
        if g is None:
            return 1
        stride, n = g
        return max(1, min(n, self.gpus_per_node // stride)) if stride < self.gpus_per_node \
            else 1

    def comm_for(self, cand: Candidate, dim: str, op: str | None = None) -> CommModel:
        """The link model of ``dim``'s groups. Between nodes each GPU has its own NIC (one
        rail a GPU): a ring collective (all-reduce, all-gather, reduce-scatter) of a group with
        k ranks in every node spreads its rings over k NICs, so its bus bandwidth is k × the
        per-GPU figure, up to the in-node one — nccl-tests' busbw of a full-node all-reduce
        across nodes is about the node's NIC bandwidth. An all-to-all or a send sends each
        GPU's own bytes through its own NIC: the per-GPU figure."""
        # a layout search asks the same layout's dimensions thousands of times: kept per
        # layout object (held in the value, so that its id is not reused while cached)
        # (and the links it was made with: a topology's levels may be replaced)
        key = (id(cand.layout), dim, op in ("all_to_all", "send", "recv", "send_recv"))
        hit = self._links.get(key)
        if hit is not None and hit[0] is cand.layout and hit[1] is self.intra \
                and hit[2] is self.inter:
            return hit[3]
        model = self._comm_for(cand, dim, op)
        self._links[key] = (cand.layout, self.intra, self.inter, model)
        return model

    def _comm_for(self, cand: Candidate, dim: str, op: str | None) -> CommModel:
        if self.level_of(cand, dim) == "intra":
            return self.intra
        if op in ("all_to_all", "send", "recv", "send_recv"):
            return self.inter
        k = self.ranks_per_node(cand, dim)
        if k == 1 or self.inter.table:
            return self.inter
        key = (k, self.inter.busbw_gbps, self.inter.alpha_us)
        cached = self._rails.get(key)
        if cached is None:
            cached = dataclasses.replace(
                self.inter, busbw_gbps=min(self.intra.busbw_gbps, self.inter.busbw_gbps * k),
                source=f"{self.inter.source}, over {k} NICs a node")
            self._rails[key] = cached
        return cached

    def describe(self) -> str:
        return (f"{self.gpus_per_node} GPUs a node; in a node {self.intra.describe()}; "
                f"between nodes {self.inter.describe()}")
