"""Peak memory of one rank of a GPU job, each term on its own (as the Playbook's memory widget
shows them): the model-state terms of ``states.py``, temporary buffers, and activations
(``activations.py``) times the microbatches the schedule keeps in flight.

Per pipeline rank r, over the stages it holds:

- **weights** a rank holds: every dense weight split by tensor parallelism (``Param``'s split),
  experts split over ep and — as Megatron's expert tensor parallelism does by default — over
  tp; the first stage adds the embedding, the last the head (unless tied).
- **model states**: dense weights' terms sharded over N_d = dp · cp, the experts' over the
  expert-data-parallel group dp · cp / ep (ZeRO-sharded experts).
- **temporary buffers**: DeepSpeed ZeRO-3's gather buffer of the largest layer; FSDP2's
  all-gather prefetch (the two largest units, weights in 16 bits) under ``torch`` ZeRO-3;
  DDP's bucket copy of the gradients under ``torch`` ZeRO-0; none for Megatron (its gradient
  buffer is the gradients).
- **activations**: per layer ``layer_activation_bytes``, the embedding's on the first stage and
  the output layer's on the last, times ``bubble.in_flight`` (1F1B's first rank: min(m, p)
  microbatches; interleaved: p + (p − 1)/v, as Megatron's ``theoretical_memory_usage`` counts
  it).
"""
from __future__ import annotations

from meshscope.theory.schedules import in_flight

from .activations import (first_stage_extra_bytes, last_stage_extra_bytes,
                          layer_activation_bytes)
from .candidate import Candidate
from .spec import ModelSpec, Param
from .states import gather_buffer_bytes, model_states_by_term
from .traffic import shape_of
from .training import Training


def is_expert(p: Param) -> bool:
    return p.name.startswith("expert")


def local_weights(spec: ModelSpec, cand: Candidate, pp_rank: int) -> tuple[float, float, list]:
    """(dense, expert) parameters on a rank of pipeline coordinate ``pp_rank``, and each
    layer's (unit's) local dense size."""
    tp, ep = cand.layout.size("tp"), cand.layout.size("ep")
    layers_of = cand.stage_layers(spec.n_layers)
    dense = experts = 0.0
    units = []
    for stage in cand.stages_of(pp_rank):
        groups = spec.stage_params(layers_of[stage], first=stage == 0,
                                   last=stage == cand.n_stages - 1)
        for g in groups:
            unit = 0.0
            for p in g:
                if is_expert(p):
                    experts += p.numel / (tp * ep)
                else:
                    unit += p.local_numel(tp)
            dense += unit
            units.append(unit)
    return dense, experts, units


def job_memory(spec: ModelSpec, cand: Candidate, t: Training) -> list:
    from .memory import MemoryEstimate

    tp, ep = cand.layout.size("tp"), cand.layout.size("ep")
    sp = cand.sp and tp > 1
    zero, n_d = cand.zero_stage, cand.dp_shards
    sh = shape_of(spec, cand)
    layers_of = cand.stage_layers(spec.n_layers)
    out = []
    for r in range(cand.pp):
        dense, experts, units = local_weights(spec, cand, r)
        ds = model_states_by_term(dense, zero, n_d, t)
        es = model_states_by_term(experts, zero, max(1, n_d // ep), t)
        terms: dict[str, float] = {}
        for states, suffix in ((ds, ""), (es, " (experts)")):
            for name, b in states.gpu_bytes.items():
                if b:
                    terms[name + suffix] = b
        cpu = sum(ds.cpu_bytes.values()) + sum(es.cpu_bytes.values())
        buffers = 0.0
        if t.framework == "deepspeed":
            largest = max((p.local_numel(tp) for s in cand.stages_of(r)
                           for g in spec.stage_params(layers_of[s], first=s == 0,
                                                      last=s == cand.n_stages - 1)
                           for p in g), default=0)
            buffers = gather_buffer_bytes(largest, zero, t)
            if buffers:
                terms["zero3_gather_buffer"] = buffers
        elif t.framework == "torch" and n_d > 1:
            if zero == 3:
                buffers = sum(sorted(units)[-2:]) * t.weight_bytes
                terms["fsdp_allgather_prefetch"] = buffers
            elif zero == 0:
                buffers = dense * (4 if t.main_grads_fp32 or t.precision == "fp32" else 2)
                terms["ddp_bucket_copy"] = buffers
        acts = 0.0
        for stage in cand.stages_of(r):
            for i in layers_of[stage]:
                acts += layer_activation_bytes(spec, i, tokens=sh.tokens, tp=tp, sp=sp, t=t,
                                               s_local=sh.s, b=sh.b_mb)
            if stage == 0:
                acts += first_stage_extra_bytes(spec, tokens=sh.tokens, tp=tp, sp=sp, t=t)
            if stage == cand.n_stages - 1:
                acts += last_stage_extra_bytes(spec, tokens=sh.tokens, tp=tp, sp=sp, t=t)
        flight = in_flight(cand.schedule, cand.pp, cand.microbatches, cand.v, r)
        terms["activations"] = acts * flight
        out.append(MemoryEstimate(
            pp_rank=r, params_bytes=ds.kind_bytes("params") + es.kind_bytes("params"),
            grads_bytes=ds.kind_bytes("grads") + es.kind_bytes("grads"),
            optimizer_bytes=ds.kind_bytes("optimizer") + es.kind_bytes("optimizer"),
            buffers_bytes=buffers, activations_bytes=acts * flight,
            microbatches_in_flight=flight, terms=terms, cpu_bytes=cpu))
    return out
