"""Mixture-of-experts feed-forward with top-k routing, dropless dispatch and expert parallelism.

Every token is routed to its ``k`` highest-scoring experts (softmax router, gates renormalised
over the chosen k; Shazeer et al., 2017). Dispatch is dropless: tokens are sorted by expert and
each expert processes exactly the tokens routed to it, however many (MegaBlocks, Gale et al.,
2023). With expert parallelism (``shard_experts``) each rank of the ``ep`` group keeps
E/ep experts; a dispatch ``all_to_all_single`` with uneven splits sends every token to the rank
that owns its expert (the per-expert counts are exchanged first so each rank knows what it will
receive), and a second all-to-all combines the results back (GShard, Lepikhin et al., 2020).

The load-balancing loss is the Switch Transformer's E · Σ_e f_e · P_e (Fedus et al., 2021),
with f_e the share of routing slots that chose expert e and P_e the mean router probability,
computed per sequence and averaged, so it does not depend on how the batch is sharded. It is
added to the gradient directly (``_AddAuxLoss``), so it works on any pipeline stage.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_to_all_single


class _Expert(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _AddAuxLoss(torch.autograd.Function):
    """Identity on ``out``; in backward, gives ``aux`` the gradient 1 (so that d aux/dθ joins
    the parameters' gradients as if aux had been added to the loss)."""

    @staticmethod
    def forward(ctx, out, aux):
        ctx.dtype = aux.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, torch.ones((), dtype=ctx.dtype, device=grad_out.device)


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_experts, self.top_k, self.aux_coef = cfg.moe_experts, cfg.moe_top_k, cfg.moe_aux_coef
        self.router = nn.Linear(cfg.dim, cfg.moe_experts, bias=False)
        # Keyed by global expert id, so a shard keeps the names of the full model.
        self.experts = nn.ModuleDict({str(e): _Expert(cfg.dim, cfg.moe_hidden)
                                      for e in range(cfg.moe_experts)})
        self.ep_group = None

    # -- routing ----------------------------------------------------------------------------

    def _route(self, tokens: torch.Tensor, batch: int):
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        top_p, top_e = probs.topk(self.top_k, dim=-1)
        gates = (top_p / top_p.sum(-1, keepdim=True)).to(tokens.dtype)
        chosen = F.one_hot(top_e, self.n_experts).sum(1).float()          # (T, E)
        f = chosen.view(batch, -1, self.n_experts).mean(1) / self.top_k    # (B, E)
        p = probs.view(batch, -1, self.n_experts).mean(1)
        aux = self.n_experts * (f * p).sum(-1).mean()
        return top_e, gates, aux

    # -- experts ----------------------------------------------------------------------------

    def _run_experts(self, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """Apply to each row of ``x`` the local expert named in ``expert_ids`` (sorted)."""
        out = torch.empty_like(x)
        for key, expert in self.experts.items():
            rows = (expert_ids == int(key)).nonzero(as_tuple=True)[0]
            if rows.numel():
                out = out.index_copy(0, rows, expert(x[rows]))
        return out

    def _dispatch_ep(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Send rows (sorted by expert, ``counts`` per expert) to their experts' ranks, run the
        local experts, and bring the results back in the same order."""
        n = dist.get_world_size(self.ep_group)
        local = self.n_experts // n
        send = counts.view(n, local)                                   # rows per (rank, expert)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.ep_group)       # counts first
        in_splits, out_splits = send.sum(1).tolist(), recv.sum(1).tolist()
        received = all_to_all_single(x_sorted.new_empty(sum(out_splits), x_sorted.shape[1]),
                                     x_sorted, out_splits, in_splits, group=self.ep_group)
        first = dist.get_rank(self.ep_group) * local
        ids = torch.repeat_interleave(torch.arange(local).repeat(n) + first, recv.flatten())
        processed = self._run_experts(received, ids)
        return all_to_all_single(x_sorted.new_empty(x_sorted.shape), processed, in_splits,
                                 out_splits, group=self.ep_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = x.reshape(-1, d)
        top_e, gates, aux = self._route(tokens, b)
        expert = top_e.flatten()
        order = torch.argsort(expert, stable=True)
        token_of = torch.arange(tokens.shape[0], device=x.device).repeat_interleave(self.top_k)
        x_sorted = tokens[token_of[order]]
        if self.ep_group is None:
            y_sorted = self._run_experts(x_sorted, expert[order])
        else:
            counts = torch.bincount(expert, minlength=self.n_experts)
            y_sorted = self._dispatch_ep(x_sorted, counts)
        y = torch.zeros_like(tokens).index_add(0, token_of[order],
                                               y_sorted * gates.flatten()[order, None])
        return _AddAuxLoss.apply(y.view(b, s, d), aux * self.aux_coef)


def shard_experts(model: nn.Module, ep_group) -> list[nn.Parameter]:
    """Keep on this rank only its E/ep experts of every MoE layer; returns their parameters
    (which data parallelism must not average with other ranks' different experts)."""
    n, r = dist.get_world_size(ep_group), dist.get_rank(ep_group)
    params = []
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        local = moe.n_experts // n
        keep = {str(e) for e in range(r * local, (r + 1) * local)}
        for key in list(moe.experts.keys()):
            if key not in keep:
                del moe.experts[key]
        moe.ep_group = ep_group
        params += list(moe.experts.parameters())
    return params
