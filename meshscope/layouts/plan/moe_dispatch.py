"""Where an MoE layer's token dispatch travels: how many copies of a token cross the network
and how many NVLink, for the two ways frameworks move them.

A token routed to k experts is sent to the ranks holding them, and its expert outputs come
back (the combine), forward and again in backward. With expert parallelism over ``ep`` ranks,
``g`` of them in each node (``N = ep / g`` nodes), each node holds ``E · g / ep`` of the E
experts.

- ``alltoall`` — an NCCL all-to-all (Megatron's default dispatcher, torchtitan): every routed
  copy is its own message. Of a rank's k copies, k · (ep − g) / ep go to other nodes over the
  rank's NIC and k · (g − 1) / ep to the other GPUs of its node over NVLink.
- ``deepep`` — DeepEP's normal kernels (DeepSeek-V3 report §3.2.2; DeepEP's README; NVIDIA's
  HybridEP works the same way): a token goes over the network once to each *node* holding one
  of its experts, to the GPU of the same in-node index, which forwards it over NVLink to the
  GPUs holding the experts (and the combine reduces within the node before it crosses back).
  Network copies are the distinct remote nodes among the token's experts, NVLink carries each
  routed copy at most once.

The distinct nodes of a token's k experts depend on the router: ``uniform`` (benchmarks'
force-balanced or fake balanced gates: k experts uniform over E) touches a node with
probability 1 − C(E − E_node, k) / C(E, k); a group-limited router (DeepSeek-V3's
``n_group`` / ``topk_group``: the experts are chosen inside ``topk_group`` of ``n_group``
expert groups; with the groups laid out whole on nodes, a token reaches at most that many
nodes) touches a node holding q groups with probability 1 − C(n_group − q, topk_group) /
C(n_group, topk_group). Expectations over uniform choices: real routing is skewed, which the
per-expert capacity (``--capacity-factor``) speaks for.

The two parts run at once on different links: a dispatch takes the longer of its network
bytes over the NIC's bandwidth and its NVLink bytes over the node's.
"""
from __future__ import annotations

import dataclasses
import math

DISPATCHERS = ("alltoall", "deepep")
ROUTINGS = ("model", "uniform")


def _miss(pool: int, taken: int, draws: int) -> float:
    """P(none of ``draws`` picks without replacement from ``pool`` lands in ``taken``)."""
    if draws > pool - taken:
        return 0.0
    return math.exp(math.lgamma(pool - taken + 1) - math.lgamma(pool - taken - draws + 1)
                    - math.lgamma(pool + 1) + math.lgamma(pool - draws + 1))


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """Copies of one token a dispatch (or combine) moves, per link."""
    dispatcher: str
    nodes: int                  # nodes the ep group spans
    network_copies: float       # copies leaving the rank's node
    nvlink_copies: float        # copies moved between GPUs of a node
    routed_copies: float        # k (× capacity factor)
    how: str                    # where the network copies come from, in words

    @classmethod
    def of(cls, spec, ep: int, ranks_per_node: int, dispatcher: str, routing: str,
           capacity_factor: float = 1.0) -> "Dispatch":
        k, E = spec.moe_top_k, spec.moe_experts
        g = max(1, min(ranks_per_node, ep))
        nodes = max(1, ep // g)
        routed = k * capacity_factor
        if nodes == 1:
            return cls(dispatcher, 1, 0.0, routed * (ep - 1) / ep, routed,
                       "the ep group sits in one node")
        if dispatcher == "alltoall":
            return cls(dispatcher, nodes, routed * (ep - g) / ep, routed * (g - 1) / ep,
                       routed, f"every routed copy its own message: k · (ep − g) / ep with "
                       f"g = {g} ranks a node")
        per_node = E * g // ep
        groups, limit = spec.moe_groups, spec.moe_group_limit
        if routing == "model" and groups and limit and E % groups == 0 \
                and per_node % (E // groups) == 0:
            q = per_node // (E // groups)       # whole expert groups a node holds
            touched = 1.0 - _miss(groups, q, limit)
            how = (f"a token reaches the nodes of {limit} of {groups} expert groups "
                   f"({q} a node)")
        else:
            touched = 1.0 - _miss(E, per_node, k)
            how = f"{k} experts uniform over {E}, {per_node} a node"
        remote = (nodes - 1) * touched * capacity_factor
        return cls(dispatcher, nodes, remote, routed * (g - 1) / g, routed,
                   f"one copy a remote node: {how}")

    def time_us(self, msg_bytes: float, intra, inter) -> float:
        """One dispatch or combine of a rank whose ``msg_bytes`` hold all its routed copies
        (``routed_copies`` a token), the two links (``comm_model.CommModel``) at once."""
        if msg_bytes <= 0:
            return 0.0
        per_copy = msg_bytes / self.routed_copies
        nvl = per_copy * self.nvlink_copies / (intra.busbw_gbps * 1e3)
        if self.nodes == 1:
            return intra.alpha_us + nvl
        net = per_copy * self.network_copies / (inter.busbw_gbps * 1e3)
        return inter.alpha_us + max(net, nvl)
