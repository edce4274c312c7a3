"""Context parallelism: ring attention over a sequence sharded across the ``cp`` ranks.

The sequence of S tokens is cut into 2·cp chunks and rank r keeps chunks r and 2·cp−1−r
(``shard_sequence``): under a causal mask early chunks attend to little and late ones to much,
so pairing them gives every rank the same work (the load-balanced layout of Megatron-LM's CP
and of Llama 3's training report).

Attention then runs as a ring (Liu et al., 2023, "Ring Attention"): each rank keeps its queries
and passes its keys/values around the ring; at each of the cp steps it starts sending the
block it holds to the next rank and receiving the previous rank's, computes attention of its
queries against the block it holds while the transfer runs, and merges the partial result into
its running output with the online-softmax rule (Milakov & Gimelshein, 2018; FlashAttention):
with m the log-sum-exp of the scores so far, out ← out·e^(m−m′) + out_blk·e^(m_blk−m′) and
m′ = log(e^m + e^(m_blk)). The backward pass runs the same ring, carrying the key/value
gradients along with their blocks so that after cp steps each block's gradient is back home.

torch's ``context_parallel`` is not used: in torch 2.13 it has no sharding strategy for CPU
scaled-dot-product attention.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.profiler import record_function

from meshscope.collectors import annotations


def shard_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global token positions held by context-parallel rank ``rank``."""
    chunk = seq_len // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    second = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)
    return torch.cat([first, second])


def shard_sequence(t: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """This rank's tokens of (batch, seq) ``t`` (see ``shard_positions``)."""
    return t[:, shard_positions(t.shape[1], cp, rank)].contiguous()


def _ring_exchange(tensors: list[torch.Tensor], group) -> tuple[list[torch.Tensor], list]:
    """Start sending ``tensors`` to the next rank of the ring and receiving the previous rank's;
    returns the receive buffers and the requests to wait on."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    nxt, prv = dist.get_global_rank(group, (r + 1) % n), dist.get_global_rank(group, (r - 1) % n)
    bufs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, b, prv, group) for b in bufs]
    # The ring's sends and recvs are context-parallel traffic: gloo traces carry no group, and
    # a pipeline's sends look the same, so the range names the dimension for the analysis.
    with record_function(annotations.comm_scope("cp")):
        return bufs, dist.batch_isend_irecv(ops)


def _scores(q, k, q_pos, k_pos, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = q_pos[:, None] >= k_pos[None, :]
    return s.masked_fill(~mask, float("-inf"))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_pos, k_pos, group):
        n = dist.get_world_size(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        blk = [k.contiguous(), v.contiguous(), k_pos.to(q.dtype)]
        for step in range(n):
            pending = _ring_exchange(blk, group) if step < n - 1 else None
            s = _scores(q, blk[0], q_pos, blk[2].long(), scale)
            blk_lse = torch.logsumexp(s, dim=-1)
            safe = torch.where(torch.isinf(blk_lse), torch.zeros_like(blk_lse), blk_lse)
            blk_out = torch.matmul(torch.exp(s - safe[..., None]), blk[1])
            new_lse = torch.logaddexp(lse, blk_lse)
            safe_new = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
            out = out * torch.exp(lse - safe_new)[..., None] \
                + blk_out * torch.exp(blk_lse - safe_new)[..., None]
            lse = new_lse
            if pending:
                bufs, reqs = pending
                for req in reqs:
                    req.wait()
                blk = bufs
        ctx.save_for_backward(q, k, v, q_pos, k_pos, out, lse)
        ctx.group, ctx.scale = group, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, q_pos, k_pos, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        n = dist.get_world_size(group)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q)
        blk = [k.contiguous(), v.contiguous(), k_pos.to(q.dtype), torch.zeros_like(k),
               torch.zeros_like(v)]
        for step in range(n):
            kk, vv, kpos, dk, dv = blk
            s = _scores(q, kk, q_pos, kpos.long(), scale)
            p = torch.exp(s - lse[..., None])
            dv = dv + torch.matmul(p.transpose(-1, -2), dout)
            ds = p * (torch.matmul(dout, vv.transpose(-1, -2)) - delta[..., None])
            dq = dq + torch.matmul(ds, kk) * scale
            dk = dk + torch.matmul(ds.transpose(-1, -2), q) * scale
            # n moves bring every block, and the gradient it gathered, back to its owner.
            bufs, reqs = _ring_exchange([kk, vv, kpos, dk, dv], group)
            for req in reqs:
                req.wait()
            blk = bufs
        return dq, blk[3], blk[4], None, None, None


def ring_attention_fn(group, positions: torch.Tensor):
    """An ``Attention.attn_fn`` doing causal ring attention over ``group`` for queries and keys
    at global ``positions``."""
    def attn(q, k, v):
        return _RingAttention.apply(q, k, v, positions, positions, group)
    return attn


def parallelize_cp(model, cp_group, cp_rank: int, cp: int) -> None:
    """Make ``model`` (or a pipeline stage of it) run on this rank's share of the sequence."""
    positions = shard_positions(model.cfg.seq_len, cp, cp_rank).to(model.rope_cos.device)
    model.positions = positions
    for block in model.layers.values():
        block.attention.attn_fn = ring_attention_fn(cp_group, positions)
