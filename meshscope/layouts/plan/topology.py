"""Where each process group's ranks sit, and the link that carries its traffic.

A cluster has two link levels: inside a node (NVLink / NVSwitch, or AMD's xGMI) and between
nodes (InfiniBand or RoCE, one NIC per GPU). Ranks are numbered as the runner's mesh lays them
out (``parallel.layout.MESH_ORDER``: pp outermost, then dp, cp, tp innermost) and placed
``gpus_per_node`` to a node in rank order. A group of dimension d is a run of ranks spaced by
the product of the sizes inside d; it stays in one node when its span (stride × size) fits in
a node — so tp groups of up to a node's GPUs use NVLink, and everything spanning nodes uses the
network. Expert parallelism takes its groups from consecutive dp · cp ranks (the runner's
``ep`` sub-mesh), ``ep_replica`` the rest of them.

Each level has a latency α and a bus bandwidth: a collective of S bytes over n ranks takes
α + S·f(op, n)/busbw (nccl-tests' bus factor f, ``comm_model.py``). The defaults are the
vendors' per-GPU figures derated to what nccl-tests typically reaches; pass measured ones
(``--intra-gbps``, ``--inter-gbps`` or ``--baseline``) for a real cluster.
"""
from __future__ import annotations

import dataclasses

from .candidate import Candidate
from .comm_model import CommModel

# Achieved bus bandwidth per GPU (GB/s) and latency (µs), nccl-tests scale: NVLink 3 (A100,
# 600 GB/s bidirectional → about 230 GB/s busbw), NVLink 4 (H100, 900 GB/s → about 360), one
# 200 Gb/s HDR (A100 pods) or 400 Gb/s NDR (H100 pods) NIC per GPU → about 22 / 45 GB/s.
LINKS = {
    "A100": {"intra": (230.0, 8.0), "inter": (22.0, 15.0)},
    "H100": {"intra": (360.0, 8.0), "inter": (45.0, 15.0)},
    "H200": {"intra": (360.0, 8.0), "inter": (45.0, 15.0)},
    "B200": {"intra": (720.0, 8.0), "inter": (45.0, 15.0)},
    "MI300X": {"intra": (300.0, 10.0), "inter": (45.0, 15.0)},
}
DEFAULT_LINKS = {"intra": (100.0, 10.0), "inter": (20.0, 15.0)}


@dataclasses.dataclass
class Topology:
    gpus_per_node: int
    intra: CommModel            # inside a node
    inter: CommModel            # between nodes

    @classmethod
    def for_device(cls, device: str | None, gpus_per_node: int = 8, *,
                   intra_gbps: float | None = None, inter_gbps: float | None = None,
                   intra_us: float | None = None, inter_us: float | None = None
                   ) -> "Topology":
        links = next((v for k, v in LINKS.items() if device and k in device.upper()),
                     DEFAULT_LINKS)
        bw_i, lat_i = links["intra"]
        bw_x, lat_x = links["inter"]
        src = f"{device or 'default'} links"
        return cls(gpus_per_node,
                   CommModel(alpha_us=intra_us if intra_us is not None else lat_i,
                             busbw_gbps=intra_gbps or bw_i, source=f"{src}, in a node"),
                   CommModel(alpha_us=inter_us if inter_us is not None else lat_x,
                             busbw_gbps=inter_gbps or bw_x, source=f"{src}, between nodes"))

    def level_of(self, cand: Candidate, dim: str) -> str:
        """``intra`` or ``inter``: where the groups of ``dim`` run."""
        layout = cand.layout
        sizes = {d: layout.size(d) for d in ("pp", "dp", "cp", "tp")}
        if dim in ("ep", "ep_replica"):
            ep = layout.size("ep")
            inner = sizes["tp"] * sizes["cp"]
            span = inner * ep if dim == "ep" else inner * sizes["dp"]
        elif dim in sizes:
            order = ("pp", "dp", "cp", "tp")
            stride = 1
            for d in order[order.index(dim) + 1:]:
                stride *= sizes[d]
            span = stride * sizes[dim]
            if dim == "dp" and sizes["cp"] > 1:   # gradients reduce over dp × cp
                span = sizes["tp"] * sizes["cp"] * sizes["dp"]
        else:
            return "intra"
        return "intra" if span <= self.gpus_per_node else "inter"

    def comm_for(self, cand: Candidate, dim: str) -> CommModel:
        return self.intra if self.level_of(cand, dim) == "intra" else self.inter

    def describe(self) -> str:
        return (f"{self.gpus_per_node} GPUs a node; in a node {self.intra.describe()}; "
                f"between nodes {self.inter.describe()}")
