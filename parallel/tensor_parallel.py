"""Tensor parallelism (Megatron-LM style) with sequence parallelism, through DTensor.

Inside each block the attention's q/k/v projections and the FFN's w1/w3 are split by output
columns (each tp rank computes its heads / its slice of the hidden layer), and the output
projections wo and w2 by input rows, so a block needs one reduction in forward and one in
backward per sublayer (Shoeybi et al., 2019). With sequence parallelism (default; Korthikanti
et al., 2022) the activations between those regions stay sharded along the sequence: the
norms run on a 1/tp slice of the tokens, the reduction becomes a reduce-scatter and the entry
into attention/FFN an all-gather — the same bytes as an all-reduce, but the norm's activations
are not replicated. Without it (``sp=False``) the row-parallel outputs are all-reduced and the
norms run replicated.

``parallelize_tp`` applies the plan to a plain ``Transformer`` (or one pipeline stage of it) in
place, the torchtitan way; the model code does not change. Attention reshapes with ``-1``
heads, so it runs on its local heads unchanged.
"""
from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from .moe import MoE


def parallelize_tp(model, tp_mesh, *, sp: bool = True) -> None:
    """Shard ``model``'s linear layers over ``tp_mesh`` (see the module docstring)."""
    act = Shard(1) if sp else Replicate()
    top = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=act, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan = {
            "attention": PrepareModuleInput(input_layouts=(act, None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=act),
        }
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        if isinstance(block.feed_forward, MoE):
            raise ValueError("tensor parallelism of MoE layers is not implemented")
        plan.update({
            "feed_forward": PrepareModuleInput(input_layouts=(act,),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=act),
        })
        parallelize_module(block, tp_mesh, plan)
