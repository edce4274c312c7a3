"""Peak memory of one rank of a GPU job, each term on its own (as the Playbook's memory widget
shows them): the model-state terms of ``states.py``, the buffers each framework allocates,
activations (``activations.py``) times the microbatches the schedule keeps in flight, the
loss's logits, and the caching allocator's reserve.

Per pipeline rank r, over the stages it holds:

- **weights** a rank holds: every dense weight split by tensor parallelism (``Param``'s split),
  experts split over ep and — as Megatron's expert tensor parallelism does by default — over
  tp; the first stage adds the embedding, the last the head (unless tied) and DeepSeek's
  multi-token-prediction modules.
- **model states**: dense weights' terms sharded over N_d = dp · cp, the experts' over the
  expert-data-parallel group dp · cp / ep (ZeRO-sharded experts); moments in fp32 or bf16.
- **buffers**, each a named term:

  - ``fsdp_unsharded_params`` / ``fsdp_unsharded_grads`` (``torch``, ZeRO-3): FSDP gathers a
    unit's weights before using it and prefetches the next ``fsdp_prefetch`` units, so the
    largest 1 + prefetch units are whole at once (16-bit, or 1 byte with fp8 weights); in
    backward a unit's unsharded 16-bit gradients and their fp32 copy for the reduce-scatter
    (FSDP2's ``reduce_dtype`` fp32, torchtitan's default) beside the next unit's gradients;
    with a pipeline, or ``fsdp_noreshard`` (any framework), the stage's weights whole and
    its gradients accumulated unsharded (fp32 with more than one microbatch) through the
    step;
  - ``ddp_bucket_copy`` (``torch``, ZeRO-0): DDP copies every gradient into its buckets;
  - ``zero3_gather_buffer`` and ``deepspeed_prefetch_bucket`` (``deepspeed``, ZeRO-3): the
    largest layer gathered with its gradients (DeepSpeed's estimator) and
    ``stage3_prefetch_bucket_size`` elements in flight; ``deepspeed_reduce_bucket`` and
    ``deepspeed_allgather_bucket`` (ZeRO-1/2): ``reduce_bucket_size`` and
    ``allgather_bucket_size`` 16-bit elements;
  - ``fp8_weight_copies``: a GEMM in fp8 keeps its weight cast to fp8 and transposed (1 + 1
    bytes a parameter of the fp8 layers); ``fp8_weight_transposes``: with fp8 weights
    (``fp8_params``) the cast goes but the transpose stays, 1 byte a parameter — Transformer
    Engine's ``Float8Tensor.update_usage(columnwise_usage=True)`` creates ``_transpose`` for
    the backward's GEMMs wherever fp8 GEMMs take only the TN layout (Hopper:
    ``non_tn_fp8_gemm_supported()`` is false below compute capability 10); on Blackwell a
    per-tensor fp8 weight needs none, so both terms over-count there by 1 byte a parameter
    (not modelled: the memory model does not know the device);
  - ``moe_dispatch_buffers``: the all-to-all's send and receive buffers of one MoE layer's
    routed tokens (T · k · capacity factor · h, 16-bit, each way);
  - ``cp_ring_buffers`` (``torch`` with context parallelism): torch's ring attention beside a
    layer's attention backward — the K, V of every cp rank all-gathered at the query heads,
    the fp32 dQ, dK, dV accumulators and the fp32 dK, dV passed on and received;
  - Megatron keeps none beyond these (its gradient buffer *is* the gradients).

- **activations**: per layer ``layer_activation_bytes``, the embedding's on the first stage and
  the output layer's input on the last, times ``bubble.in_flight`` (1F1B's first rank: min(m,
  p) microbatches; interleaved: p + (p − 1)/v, as Megatron's ``theoretical_memory_usage``
  counts it).
- ``recompute_working_set``: with full or op-level recomputation, the layer being recomputed
  holds its whole forward's activations again during its backward (the largest layer's).
- ``logits_loss``: the last stage's logits and loss in fp32 (``activations.LOGIT_BYTES`` per
  element of tokens × V/t), one microbatch at a time.
- ``allocator_reserve``: what the caching allocator holds beyond the allocated peak, the
  stated fraction ``allocator_reserve`` of everything above (what a framework reports as
  "reserved" memory).
"""
from __future__ import annotations

import dataclasses
import functools

from meshscope.theory.schedules import in_flight

from .activations import (first_stage_extra_bytes, last_stage_extra_bytes,
                          layer_activation_bytes, logits_loss_bytes)
from .candidate import Candidate
from .estimate import MemoryEstimate
from .spec import ModelSpec, is_expert
from .states import gather_buffer_bytes, model_states_by_term
from .traffic import shape_of
from .training import Training

FP8_LINEAR = ("wq", "wk", "wv", "wo", "w1", "w2", "w3", "wq_a", "wq_b", "wkv_a", "wkv_b")


@functools.lru_cache(maxsize=16)
def layer_kinds(spec: ModelSpec) -> tuple[tuple[bool, int], ...]:
    """Each layer's kind — what makes layers cost alike: MoE or dense, and the attention's
    span (kept: hashing the model costs more than reading it, so callers take the tuple
    once)."""
    return tuple((spec.is_moe_layer(i), spec.shape.attention_span(i))
                 for i in range(spec.n_layers))


def local_weights(spec: ModelSpec, cand: Candidate, pp_rank: int) -> tuple[float, float, list]:
    """(dense, expert) parameters on a rank of pipeline coordinate ``pp_rank``, and each
    layer's (unit's) local dense size."""
    tp, ep = cand.layout.size("tp"), cand.layout.size("ep")
    layers_of = cand.stage_layers(spec.n_layers)
    dense = experts = 0.0
    units: list[float] = []
    for stage in cand.stages_of(pp_rank):
        d, e, u = _stage_weights(spec, tuple(layers_of[stage]), stage == 0,
                                 stage == cand.n_stages - 1, tp, ep)
        dense += d
        experts += e
        units += u
    return dense, experts, units


@functools.lru_cache(maxsize=4096)
def _stage_weights(spec: ModelSpec, layers: tuple[int, ...], first: bool, last: bool,
                   tp: int, ep: int) -> tuple[float, float, tuple[float, ...]]:
    """``local_weights`` of one stage (a layout search asks for the same stages many
    times: kept)."""
    dense = experts = 0.0
    units = []
    for g in spec.stage_params(list(layers), first=first, last=last):
        unit = 0.0
        for p in g:
            if is_expert(p):
                experts += p.numel / (tp * ep)
            else:
                unit += p.local_numel(tp)
        dense += unit
        units.append(unit)
    return dense, experts, tuple(units)


def fp8_weights(spec: ModelSpec, cand: Candidate, pp_rank: int, t: Training) -> float:
    """Local parameters of the linear layers whose GEMMs run in fp8."""
    if t.precision != "fp8":
        return 0.0
    tp, ep = cand.layout.size("tp"), cand.layout.size("ep")
    layers_of = cand.stage_layers(spec.n_layers)
    n = 0.0
    for stage in cand.stages_of(pp_rank):
        for i in layers_of[stage]:
            for p in spec.layer_params(i):
                base = p.name.split(".")[-1]
                if base not in FP8_LINEAR:
                    continue
                if is_expert(p):
                    n += p.numel / (tp * ep) if t.uses_fp8("experts") else 0.0
                elif t.uses_fp8(_op_of(base)):
                    n += p.local_numel(tp)
    return n


def _op_of(weight: str) -> str:
    return {"wq": "qkv", "wk": "qkv", "wv": "qkv", "wq_a": "qkv", "wq_b": "qkv",
            "wkv_a": "qkv", "wkv_b": "qkv", "wo": "proj", "w1": "fc1", "w3": "fc1",
            "w2": "fc2"}[weight]


def _buffers(spec, cand, t, r, dense, units, terms, experts_local=0.0) -> float:
    """The framework's buffers of pipeline rank ``r`` (module docstring), added to ``terms``."""
    tp = cand.layout.size("tp")
    zero, n_d = cand.zero_stage, cand.dp_shards
    layers_of = cand.stage_layers(spec.n_layers)
    sh = shape_of(spec, cand)
    total = 0.0

    def add(name, b):
        nonlocal total
        if b > 0:
            terms[name] = terms.get(name, 0.0) + b
            total += b

    if t.framework == "deepspeed":
        largest = max((p.local_numel(tp) for s in cand.stages_of(r)
                       for g in spec.stage_params(layers_of[s], first=s == 0,
                                                  last=s == cand.n_stages - 1)
                       for p in g if not is_expert(p)), default=0)
        add("zero3_gather_buffer", gather_buffer_bytes(largest, zero, t))
        if n_d > 1:
            if zero == 3:
                add("deepspeed_prefetch_bucket", t.prefetch_bucket * 2)
                add("deepspeed_reduce_bucket", t.reduce_bucket * 2)
            elif zero >= 1:
                add("deepspeed_reduce_bucket", t.reduce_bucket * 2)
                add("deepspeed_allgather_bucket", t.allgather_bucket * 2)
    elif n_d > 1 and (t.framework == "torch" or cand.dp_mode == "fsdp_noreshard"):
        if zero == 3:
            big = sorted(units, reverse=True)
            wbytes = 1 if t.fp8_params else 2
            grad16 = 4 if t.precision == "fp32" else 2
            if cand.pp > 1 or cand.dp_mode == "fsdp_noreshard":
                # with a pipeline FSDP keeps the stage gathered through the step and
                # accumulates unsharded (fp32) gradients until the last microbatch
                whole = dense + experts_local
                add("fsdp_unsharded_params", whole * wbytes)
                add("fsdp_unsharded_grads", whole * (4 if cand.microbatches > 1 else grad16))
            else:
                add("fsdp_unsharded_params", sum(big[:1 + t.fsdp_prefetch]) * wbytes)
                first = big[0] if big else 0.0
                second = big[1] if len(big) > 1 else 0.0
                add("fsdp_unsharded_grads", first * (grad16 + 4) + second * grad16)
        elif zero == 0:
            add("ddp_bucket_copy", dense * (4 if t.main_grads_fp32 or t.precision == "fp32"
                                            else 2))
    if t.precision == "fp8" and t.job_style == "megatron":
        if t.fp8_params:
            # Transformer Engine's fp8 weights (Float8Tensor) still keep a transposed copy
            # for the backward's GEMMs (``update_usage(columnwise_usage=True)`` creates
            # ``_transpose`` where fp8 GEMMs take only the TN layout): 1 byte a parameter
            add("fp8_weight_transposes", fp8_weights(spec, cand, r, t))
        else:
            add("fp8_weight_copies", 2 * fp8_weights(spec, cand, r, t))
    ep = cand.layout.size("ep")
    moe_layers = any(spec.is_moe_layer(i) for s in cand.stages_of(r) for i in layers_of[s])
    if moe_layers and ep > 1:
        cf = t.capacity_factor or 1.0
        add("moe_dispatch_buffers", 2 * sh.tokens * spec.moe_top_k * cf * spec.dim
            * t.act_bytes / (tp if cand.sp else 1))
    cp = cand.layout.size("cp")
    if t.framework == "torch" and cp > 1:
        add("cp_ring_buffers", torch_ring_buffer_bytes(spec, cand, t))
    return total


def torch_ring_buffer_bytes(spec: ModelSpec, cand: Candidate, t: Training) -> float:
    """What torch's ring attention (``traffic._torch_cp_transfers``) holds beside a layer's
    attention backward: the all-gathered K, V of every cp rank at the query heads, the fp32
    accumulators of dQ, dK, dV (``convert_to_f32``) and the dK, dV being passed on and
    received (fp32)."""
    cp, tp = cand.layout.size("cp"), cand.layout.size("tp")
    sh = shape_of(spec, cand)
    heads = sh.b_mb * (spec.n_heads // tp) * sh.s
    v_width = spec.v_head_dim or spec.head_width
    kv = heads * (spec.head_width + v_width)               # K and V elements a rank
    q = heads * spec.head_width
    return cp * kv * t.act_bytes + 4 * (q + kv) + 2 * 4 * kv


def job_memory(spec: ModelSpec, cand: Candidate, t: Training,
               pp_ranks: tuple[int, ...] | None = None) -> list:
    """One ``MemoryEstimate`` per pipeline rank (or per rank of ``pp_ranks``)."""

    tp, ep = cand.layout.size("tp"), cand.layout.size("ep")
    sp = cand.sp and tp > 1
    zero, n_d = cand.zero_stage, cand.dp_shards
    sh = shape_of(spec, cand)
    layers_of = cand.stage_layers(spec.n_layers)
    cf = t.capacity_factor or 1.0
    out = []
    kinds_of = layer_kinds(spec)
    for r in (range(cand.pp) if pp_ranks is None else pp_ranks):
        dense, experts, units = local_weights(spec, cand, r)
        ds = model_states_by_term(dense, zero, n_d, t)
        es = model_states_by_term(experts, zero, max(1, n_d // ep), t)
        terms: dict[str, float] = {}
        for states, suffix in ((ds, ""), (es, " (experts)")):
            for name, b in states.gpu_bytes.items():
                if b:
                    terms[name + suffix] = b
        cpu = sum(ds.cpu_bytes.values()) + sum(es.cpu_bytes.values())
        buffers = _buffers(spec, cand, t, r, dense, units, terms, experts)
        acts = 0.0
        last = False
        per_kind: dict[tuple[bool, int], float] = {}   # a layer's, by its kind
        for stage in cand.stages_of(r):
            for i in layers_of[stage]:
                kind = kinds_of[i]
                if kind not in per_kind:
                    per_kind[kind] = layer_activation_bytes(
                        spec, i, tokens=sh.tokens, tp=tp, sp=sp, t=t, s_local=sh.s,
                        b=sh.b_mb, capacity_factor=cf)
                acts += per_kind[kind]
            if stage == 0:
                acts += first_stage_extra_bytes(spec, tokens=sh.tokens, tp=tp, sp=sp, t=t)
            if stage == cand.n_stages - 1:
                last = True
                acts += last_stage_extra_bytes(spec, tokens=sh.tokens, tp=tp, sp=sp, t=t)
                for _ in range(spec.mtp_layers):   # each MTP module is one more layer
                    acts += layer_activation_bytes(spec, spec.n_layers - 1, tokens=sh.tokens,
                                                   tp=tp, sp=sp, t=t, s_local=sh.s,
                                                   b=sh.b_mb, capacity_factor=cf)
        flight = in_flight(cand.schedule, cand.pp, cand.microbatches, cand.v, r)
        terms["activations"] = acts * flight
        if t.recompute in ("full", "op"):
            # the layer being recomputed holds its whole forward's activations again while
            # its backward runs
            keep = dataclasses.replace(t, recompute="none")
            kinds = {kinds_of[i]: i
                     for s in cand.stages_of(r) for i in layers_of[s]}   # one of each kind
            terms["recompute_working_set"] = max(
                (layer_activation_bytes(spec, i, tokens=sh.tokens, tp=tp, sp=sp, t=keep,
                                        s_local=sh.s, b=sh.b_mb, capacity_factor=cf)
                 for i in kinds.values()), default=0.0)
            buffers += terms["recompute_working_set"]
        if last:
            logits = logits_loss_bytes(spec, tokens=sh.tokens, tp=tp) * (1 + spec.mtp_layers)
            terms["logits_loss"] = logits
            buffers += logits
        allocated = sum(terms.values())
        reserve = allocated * t.allocator_reserve
        if reserve:
            terms["allocator_reserve"] = reserve
            buffers += reserve
        out.append(MemoryEstimate(
            pp_rank=r, params_bytes=ds.kind_bytes("params") + es.kind_bytes("params"),
            grads_bytes=ds.kind_bytes("grads") + es.kind_bytes("grads"),
            optimizer_bytes=ds.kind_bytes("optimizer") + es.kind_bytes("optimizer"),
            buffers_bytes=buffers, activations_bytes=acts * flight,
            microbatches_in_flight=flight, terms=terms, cpu_bytes=cpu))
    return out
