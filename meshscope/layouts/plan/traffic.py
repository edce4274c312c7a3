"""Communication per training step, per rank, dimension and op — as the runner issues it.

Every row (``Transfer``) is one kind of collective or point-to-point operation of one pipeline
rank in one step: how many times it runs and its message size S, with S as nccl-tests and the
report's ``msg_bytes`` define it (the buffer for all_reduce; the whole gathered output for
all_gather and the whole input for reduce_scatter; each rank's send buffer for all_to_all; the
tensor for send/recv). Ranks with the same pipeline coordinate issue the same operations.
What each dimension issues, read from the runner's code and checked against its traces:

**dp** (``parallel/data_parallel.py``; gradients are averaged over dp × cp). ``ddp``:
DistributedDataParallel packs the gradients into buckets — the first capped at 1 MiB, the
others at 25 MiB, filled in the order gradients become ready (the reverse of registration) —
and all-reduces each bucket once per step (``no_sync`` on all but the last microbatch); with
tensor-parallel (DTensor) weights FSDP2's ``replicate`` does one all-reduce of all local
gradients. ``fsdp`` (ZeRO-3): each layer and the stage's remaining weights are one FSDP unit,
all-gathered before every microbatch's forward and again before its backward; ``zero2``: once
per microbatch; each unit's gradients are reduce-scattered once per step.
``fsdp_noreshard`` (reshard_after_forward=False, no gradient sync until the last
microbatch): each unit gathered once a step and its gradients reduce-scattered once a step. FSDP pads every
weight's first dimension to a multiple of the shard count. Experts of an expert-parallel MoE
are left out and all-reduced one tensor at a time over the ``ep_replica`` group.

**tp** (``parallel/tensor_parallel.py``, DTensor), per microbatch and stage, with sequence
parallelism: an all-gather before attention and before the FFN and a reduce-scatter after
each, mirrored in backward (4 of each per layer), the embedding's reduce-scatter and the head's
all-gather with their backward mirrors (one more of each on the first and on the last stage),
and the head's all-gather of the logits along the vocabulary. The replicated norm weights'
gradients are partial sums: AdamW all-reduces each one three times (once per use of the
gradient), or once when data parallelism (``replicate``) has reduced it first. Without sequence
parallelism: an all-reduce after attention and after the FFN in forward and of the input
gradient of each in backward, plus one for the embedding (forward) and one for the head
(backward), and the logits' all-gather.

**pp** (``parallel/pipeline.py``): per microbatch and stage boundary, the activation forward
(send → recv) and its gradient backward; a boundary between two stages on one rank (the V
schedules' middle) moves nothing. Under sequence parallelism the activation is 1/tp of the
sequence.

**cp** (``parallel/context_parallel.py``), per layer and microbatch: the forward ring makes
cp − 1 exchanges of K, V and the keys' positions, the backward ring cp exchanges of K, V,
positions, dK and dV; each exchange is one send and one receive per tensor. A GPU job of the
``torch`` framework runs torch's own ring instead (``_torch_cp_transfers``): K and V repeated
to the query heads and all-gathered once a layer's forward and once its backward, dK and dV
passed on in fp32 at every step of the backward.

**ep** (``parallel/moe.py``), per MoE layer and microbatch: the per-expert counts (E int64)
first, then the tokens' dispatch and combine all-to-alls in forward and their two mirrors in
backward, each moving T·k rows of h (T tokens of the rank's microbatch, k experts each). The
split between ranks depends on routing; what a rank sends in a dispatch is always all its T·k
rows, so the rows here are the ep group's mean per rank — exact for the group's total.
"""
from __future__ import annotations

import dataclasses

from meshscope.theory.bus_factors import bus_factor

from .candidate import Candidate
from .precision import Precision, precision_of
from .spec import ModelSpec, Param

DDP_FIRST_BUCKET_BYTES = 1 << 20     # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 << 20          # DistributedDataParallel(bucket_cap_mb=25)
COUNT_BYTES = 8                      # the expert counts are int64


@dataclasses.dataclass(frozen=True)
class Transfer:
    pp_rank: int
    dim: str            # dp, tp, pp, cp, ep or ep_replica: the process group's dimension
    op: str             # all_reduce, all_gather, reduce_scatter, all_to_all, send, recv
    what: str           # what moves, in words
    phase: str          # microbatch (inside a microbatch's forward or backward), step
                        # (after the last backward), optimizer
    count: int          # instances per step on one rank
    msg_bytes: float    # S of one instance
    group_size: int

    @property
    def bytes(self) -> float:
        return self.count * self.msg_bytes

    @property
    def wire_bytes(self) -> float:
        """Bytes this rank sends on the wire per step: S × nccl-tests' bus factor (ring
        all-reduce 2(n−1)/n, all-gather, reduce-scatter and all-to-all (n−1)/n, a send 1,
        a receive 0)."""
        if self.op == "recv":
            return 0.0
        if self.op == "send":
            return self.bytes
        return self.bytes * bus_factor(self.op, max(self.group_size, 1))

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "bytes": self.bytes, "wire_bytes": self.wire_bytes}


@dataclasses.dataclass(frozen=True)
class _Shape:
    """The per-rank sizes every formula below uses."""
    b_mb: int           # sequences per microbatch on one rank
    s: int              # tokens of a sequence on one rank (seq_len / cp)
    m: int              # microbatches per step

    @property
    def tokens(self) -> int:
        return self.b_mb * self.s


def shape_of(spec: ModelSpec, cand: Candidate) -> _Shape:
    dp, cp = cand.layout.size("dp"), cand.layout.size("cp")
    return _Shape(b_mb=cand.global_batch // dp // cand.microbatches, s=spec.seq_len // cp,
                  m=cand.microbatches)


def _padded_numel(p: Param, tp: int, shards: int) -> int:
    """FSDP2's full (gathered) size of a weight (each of ``p.count``): dim 0 padded to a
    multiple of ``shards``."""
    shape = p.local_shape(tp)
    rows = -(-shape[0] // shards) * shards
    rest = 1
    for d in shape[1:]:
        rest *= d
    return rows * rest * p.count


def _is_expert(p: Param) -> bool:
    return p.name.startswith("expert")


def _tensor_sizes(params: list[Param], tp: int) -> list[int]:
    """Local elements of each tensor in registration order, a MoE layer's experts expanded
    one expert at a time (expert 0's w1, w2, w3, then expert 1's …) as the runner registers
    them."""
    out: list[int] = []
    pending: list[Param] = []

    def flush():
        for e in range(pending[0].count if pending else 0):
            out.extend(q.local_numel(tp) // q.count for q in pending)
        pending.clear()

    for p in params:
        if p.count > 1:
            if pending and pending[0].count != p.count:
                flush()
            pending.append(p)
            continue
        flush()
        out.append(p.local_numel(tp))
    flush()
    return out


def ddp_buckets(sizes_bytes: list[int]) -> list[int]:
    """Bucket sizes for gradients of ``sizes_bytes`` in the order they become ready: each
    bucket is closed once it reaches its cap (1 MiB for the first, 25 MiB after), as torch's
    ``_compute_bucket_assignment_by_size``."""
    out, current, cap = [], 0, DDP_FIRST_BUCKET_BYTES
    for size in sizes_bytes:
        current += size
        if current >= cap:
            out.append(current)
            current, cap = 0, DDP_BUCKET_BYTES
    if current:
        out.append(current)
    return out


def _registration_order(groups: list[list[Param]], first: bool) -> list[Param]:
    """A stage module's weights in ``parallel.model``'s registration order: embedding,
    layers, final norm, head (``stage_params`` puts the stage's own weights last)."""
    *layers, root = groups
    head = [p for p in root if p.name == "tok_embeddings"]
    tail = [p for p in root if p.name != "tok_embeddings"]
    return head + [p for g in layers for p in g] + tail


def _ddp_transfers(cand, prec, r, stage, groups) -> list[Transfer]:
    """``ddp``'s gradient all-reduces of one stage, once per step: one row per bucket size
    (DistributedDataParallel's buckets, or one bucket of every local gradient under tensor
    parallelism); an expert-parallel MoE's experts are left to ``_expert_replica_transfers``."""
    tp, n, ep = cand.layout.size("tp"), cand.dp_shards, cand.layout.size("ep")
    params = [p for p in _registration_order(groups, stage == 0)
              if not (ep > 1 and _is_expert(p))]
    sizes = [numel * prec.grad_bytes for numel in reversed(_tensor_sizes(params, tp))]
    if tp > 1:   # FSDP2's replicate: one all-reduce of every local gradient
        buckets = [sum(sizes)] if sizes else []
    else:
        buckets = ddp_buckets(sizes)
    return [Transfer(r, "dp", "all_reduce", f"stage {stage} gradient buckets", "step",
                     buckets.count(size), size, n) for size in sorted(set(buckets))]


def _zero1_transfers(cand, prec, r, stage, groups, training=None) -> list[Transfer]:
    """``zero1``'s operations of one stage, once per step — ZeRO-1 / Megatron's distributed
    optimizer: the gradients reduce-scattered to their optimizer shard and the updated
    weights all-gathered (DeepSpeed's BF16_Optimizer: one all-reduce of its fp32 gradients);
    with a GPU job's ``training``, an expert-parallel MoE's experts the same over their own
    ``ep_replica`` group."""
    tp, n, ep = cand.layout.size("tp"), cand.dp_shards, cand.layout.size("ep")
    job = training is not None
    out = []
    params = [p for g in groups for p in g if not (ep > 1 and _is_expert(p))]
    full = sum(_padded_numel(p, tp, n) for p in params)
    if full and job and training.deepspeed_bf16_optimizer(1):
        # DeepSpeed's BF16_Optimizer all-reduces its whole fp32 gradient buffer
        out.append(Transfer(r, "dp", "all_reduce", f"stage {stage} fp32 gradients "
                            "(DeepSpeed BF16_Optimizer)", "step", 1,
                            full * prec.grad_bytes, n))
    elif full:
        out.append(Transfer(r, "dp", "reduce_scatter", f"stage {stage} gradients "
                            "(distributed optimizer)", "step", 1,
                            full * prec.grad_bytes, n))
        out.append(Transfer(r, "dp", "all_gather", f"stage {stage} updated weights "
                            "(distributed optimizer)", "step", 1,
                            full * prec.param_bytes, n))
    if job and ep > 1 and n // ep > 1:
        experts = sum(_padded_numel(p, tp, n // ep) for g in groups for p in g
                      if _is_expert(p)) / ep
        if experts:
            out += [Transfer(r, "ep_replica", "reduce_scatter", f"stage {stage} "
                             "expert gradients (distributed optimizer)", "step", 1,
                             experts * prec.grad_bytes, n // ep),
                    Transfer(r, "ep_replica", "all_gather", f"stage {stage} updated "
                             "expert weights (distributed optimizer)", "step", 1,
                             experts * prec.param_bytes, n // ep)]
    return out


def _sharded_transfers(cand, prec, r, stage, groups, sh, job: bool) -> list[Transfer]:
    """``fsdp``'s and ``zero2``'s operations of one stage: per FSDP unit (each layer, then
    the stage's remaining weights) a parameter all-gather before each microbatch's forward
    (and, fsdp, its backward) and a gradient reduce-scatter once a step; in a GPU ``job``,
    FSDP on torch's defaults (``_dp_transfers``) and an expert-parallel MoE's experts the
    same over their ``ep_replica`` group."""
    tp, n, ep = cand.layout.size("tp"), cand.dp_shards, cand.layout.size("ep")
    out = []
    gathers = 2 if cand.dp_mode == "fsdp" else 1
    reduces, reduce_phase = 1, "step"
    if job and cand.dp_mode == "fsdp":
        if cand.pp > 1:
            gathers = 1.0 / sh.m          # once a step
        else:
            reduces, reduce_phase = sh.m, "microbatch"
    elif cand.dp_mode == "fsdp_noreshard":
        gathers = 1.0 / sh.m              # kept gathered: once a step, reduced once a step
    for i, g in enumerate(groups):
        unit = f"layer {i}" if i < len(groups) - 1 else "stage weights"
        parts = [("dp", [p for p in g if not (job and ep > 1 and _is_expert(p))], n, 1)]
        if job and ep > 1:
            parts.append(("ep_replica", [p for p in g if _is_expert(p)], n // ep, ep))
        for dim, params, ranks, split in parts:
            if ranks < 2:
                continue
            full = sum(_padded_numel(p, tp, ranks) for p in params) / split
            if not full:
                continue
            what = "" if dim == "dp" else "expert "
            out.append(Transfer(r, dim, "all_gather", f"stage {stage} {unit} {what}parameters",
                                "microbatch", max(1, round(gathers * sh.m)),
                                full * prec.param_bytes, ranks))
            out.append(Transfer(r, dim, "reduce_scatter", f"stage {stage} {unit} {what}gradients",
                                reduce_phase, reduces, full * prec.grad_bytes, ranks))
    return out


def _expert_replica_transfers(cand, prec, r, stage, groups) -> list[Transfer]:
    """The all-reduces of an expert-parallel MoE's expert gradients over their replicas
    (``ep_replica``: dp·cp/ep ranks), one tensor at a time, once per step: one row per
    tensor size, the largest first."""
    ep = cand.layout.size("ep")
    replicas = cand.dp_shards // ep
    per_size: dict[int, int] = {}
    for p in (p for g in groups for p in g if _is_expert(p)):
        per_size[p.tensor_numel] = per_size.get(p.tensor_numel, 0) + p.count
    out = []
    for numel, count in sorted(per_size.items(), reverse=True):
        mine = count // ep
        if mine:
            out.append(Transfer(r, "ep_replica", "all_reduce",
                                f"stage {stage} expert gradients, one tensor at a time",
                                "step", mine, numel * prec.grad_bytes, replicas))
    return out


def _dp_transfers(spec, cand, prec, r, stage, groups, sh, training=None) -> list[Transfer]:
    """Data parallelism's operations (module docstring). With a GPU job's ``training``
    (``job``), an expert-parallel MoE's experts are sharded, reduced and gathered over
    their own data-parallel group (``ep_replica``: dp·cp/ep ranks), as Megatron's
    distributed optimizer and FSDP do; and FSDP follows torch's defaults: with a pipeline a
    stage keeps its weights gathered from the first microbatch's forward to the step's end
    and reduces its gradients once (``reshard_after_forward=False`` and no gradient sync
    until the last microbatch), without one each microbatch gathers twice and reduces once."""
    n, ep = cand.dp_shards, cand.layout.size("ep")
    job = training is not None
    out = []
    if n > 1:
        if cand.dp_mode == "ddp":
            out += _ddp_transfers(cand, prec, r, stage, groups)
        elif cand.dp_mode == "zero1":
            out += _zero1_transfers(cand, prec, r, stage, groups, training)
        else:
            out += _sharded_transfers(cand, prec, r, stage, groups, sh, job)
    if ep > 1 and n // ep > 1 and (not job or cand.dp_mode == "ddp"):
        out += _expert_replica_transfers(cand, prec, r, stage, groups)
    return out


def _tp_transfers(spec, cand, prec, r, stage, groups, sh, loss_parallel=False,
                  fp8_gather=False) -> list[Transfer]:
    """tp's operations of one stage (module docstring). With ``fp8_gather`` (torchtitan's
    Float8 tensor parallelism) the forward's sequence-parallel all-gathers into attention
    and the FFN move float8, one byte an element: ``PrepareFloat8ModuleInput`` casts before
    it gathers (torchtitan docs/float8.md: float8 all-gather for TP, by default for
    Float8Linear); the backward's gathers and every reduce-scatter stay 16-bit."""
    tp = cand.layout.size("tp")
    if tp == 1:
        return []
    first, last = stage == 0, stage == cand.n_stages - 1
    n_layers = len(groups) - 1
    act = sh.tokens * spec.dim * prec.act_bytes
    per_mb = 4 * n_layers + int(first) + int(last)
    out = []
    if cand.sp and fp8_gather:
        out += [Transfer(r, "tp", "all_gather", f"stage {stage} activations (sequence "
                         "parallel entry into attention / FFN, forward, in float8)",
                         "microbatch", 2 * n_layers * sh.m, sh.tokens * spec.dim, tp),
                Transfer(r, "tp", "all_gather", f"stage {stage} activations (sequence "
                         "parallel, backward / head)", "microbatch",
                         (per_mb - 2 * n_layers) * sh.m, act, tp),
                Transfer(r, "tp", "reduce_scatter", f"stage {stage} activations (sequence "
                         "parallel exit from attention / FFN / embedding)", "microbatch",
                         per_mb * sh.m, act, tp)]
    elif cand.sp:
        out += [Transfer(r, "tp", "all_gather", f"stage {stage} activations (sequence "
                         "parallel entry into attention / FFN / head)", "microbatch",
                         per_mb * sh.m, act, tp),
                Transfer(r, "tp", "reduce_scatter", f"stage {stage} activations (sequence "
                         "parallel exit from attention / FFN / embedding)", "microbatch",
                         per_mb * sh.m, act, tp)]
    else:
        out.append(Transfer(r, "tp", "all_reduce", f"stage {stage} activations (row-parallel "
                            "outputs, column-parallel input gradients)", "microbatch",
                            per_mb * sh.m, act, tp))
    if last and not loss_parallel:   # Megatron's vocab-parallel cross-entropy gathers none
        out.append(Transfer(r, "tp", "all_gather", f"stage {stage} logits", "microbatch", sh.m,
                            sh.tokens * spec.vocab_size * prec.act_bytes, tp))
    if cand.sp:
        replicated = [p for g in groups for p in g if p.tp_split == "rep"
                      and not _is_expert(p) and p.name != "router"]
        uses = 1 if cand.dp_shards > 1 else 3
        for size in sorted({p.numel for p in replicated}):
            k = sum(1 for p in replicated if p.numel == size)
            out.append(Transfer(r, "tp", "all_reduce", f"stage {stage} replicated norm "
                                "weight gradients (partial sums)", "optimizer", uses * k,
                                size * prec.grad_bytes, tp))
    return out


def _pp_transfers(spec, cand, prec, r, stage, sh, scatter=False) -> list[Transfer]:
    if cand.pp == 1:
        return []
    tp = cand.layout.size("tp")
    # with sequence parallelism each tp rank holds 1/tp of the sequence; Megatron's
    # scatter/gather optimization (Narayanan et al. 2021, §4.1) sends 1/tp without it too
    act = sh.tokens * spec.dim * prec.act_bytes // (tp if tp > 1 and (cand.sp or scatter)
                                                    else 1)
    out = []
    prev_remote = stage > 0 and cand.rank_of_stage(stage - 1) != r
    next_remote = stage < cand.n_stages - 1 and cand.rank_of_stage(stage + 1) != r
    if prev_remote:
        out += [Transfer(r, "pp", "recv", f"stage {stage} input activations", "microbatch",
                         sh.m, act, 2),
                Transfer(r, "pp", "send", f"stage {stage} input gradients", "microbatch",
                         sh.m, act, 2)]
    if next_remote:
        out += [Transfer(r, "pp", "send", f"stage {stage} output activations", "microbatch",
                         sh.m, act, 2),
                Transfer(r, "pp", "recv", f"stage {stage} output gradients", "microbatch",
                         sh.m, act, 2)]
    return out


# torch's context parallelism (``torch.distributed.tensor.experimental.context_parallel``, as
# torchtitan runs it): what moves, per layer and microbatch (``_torch_cp_transfers``)
TORCH_CP_GATHER_FORWARD = "ring attention K, V all-gathered at the query heads (forward)"
TORCH_CP_GATHER_BACKWARD = "ring attention K, V all-gathered at the query heads (backward)"
TORCH_CP_GRADS = "ring attention dK, dV passed on (fp32)"


def _torch_cp_transfers(spec, cand, prec, r, stage, n_layers, sh, recompute) -> list[Transfer]:
    """torch's ring attention as torchtitan runs it (torch 2.6 to 2.13,
    ``tensor/experimental/_attention.py``): the model repeats K and V to the query heads
    before SDPA (torchtitan's ``repeat_kv``), and the ring's default rotation
    (``_cp_options.rotate_method = ALL_GATHER``, ``_AllGatherRotater``) all-gathers them once
    a layer's forward, and again in its backward (full recomputation: once more); the backward
    passes each step's dK, dV on to the next rank (``_RotateMethod.ALL_TO_ALL``), accumulated
    in fp32 (``convert_to_f32``): cp sends a layer."""
    cp, tp = cand.layout.size("cp"), cand.layout.size("tp")
    v_width = spec.v_head_dim or spec.head_width
    kv = sh.b_mb * (spec.n_heads // tp) * sh.s * (spec.head_width + v_width) * prec.act_bytes
    forwards = 2 if recompute == "full" else 1
    n = n_layers * sh.m
    return [Transfer(r, "cp", "all_gather", f"stage {stage} {TORCH_CP_GATHER_FORWARD}",
                     "microbatch", forwards * n, cp * kv, cp),
            Transfer(r, "cp", "all_gather", f"stage {stage} {TORCH_CP_GATHER_BACKWARD}",
                     "microbatch", n, cp * kv, cp),
            Transfer(r, "cp", "send", f"stage {stage} {TORCH_CP_GRADS}", "microbatch",
                     cp * n, kv * 4 / prec.act_bytes, cp)]


def _cp_transfers(spec, cand, prec, r, stage, groups, sh, torch_ring=False,
                  recompute="none") -> list[Transfer]:
    cp = cand.layout.size("cp")
    if cp == 1:
        return []
    tp = cand.layout.size("tp")
    n_layers = len(groups) - 1
    if torch_ring:
        return _torch_cp_transfers(spec, cand, prec, r, stage, n_layers, sh, recompute)
    kv = sh.b_mb * (spec.kv_heads // tp) * sh.s * spec.head_width * prec.act_bytes
    pos = sh.s * prec.act_bytes
    per_layer = {kv: 2 * (cp - 1) + 4 * cp, pos: (cp - 1) + cp}
    if kv == pos:
        per_layer = {kv: sum(per_layer.values())}
    out = []
    for size, k in per_layer.items():
        what = "K, V, dK, dV blocks" if size == kv else "key positions"
        for op in ("send", "recv"):
            out.append(Transfer(r, "cp", op, f"stage {stage} ring attention {what}",
                                "microbatch", k * n_layers * sh.m, size, cp))
    return out


def _ep_transfers(spec, cand, prec, r, stage, layers, sh, capacity_factor=1.0
                  ) -> list[Transfer]:
    ep = cand.layout.size("ep")
    moe_layers = sum(1 for i in layers if spec.is_moe_layer(i))
    if ep == 1 or not moe_layers:
        return []
    tp = cand.layout.size("tp")
    # with tensor and sequence parallelism each tp rank routes its 1/tp of the tokens; a
    # capacity factor pads each expert's share
    rows = sh.tokens * spec.moe_top_k * capacity_factor * spec.dim * prec.act_bytes \
        / (tp if cand.sp else 1)
    n = moe_layers * sh.m
    return [Transfer(r, "ep", "all_to_all", f"stage {stage} tokens per expert (counts)",
                     "microbatch", n, spec.moe_experts * COUNT_BYTES, ep),
            Transfer(r, "ep", "all_to_all", f"stage {stage} token dispatch and combine, "
                     "forward and backward (group mean)", "microbatch", 4 * n, rows, ep)]


def transfers(spec: ModelSpec, cand: Candidate, precision: Precision | str = "fp32",
              training=None) -> list[Transfer]:
    """Every operation of one step, per pipeline rank (see the module docstring). With a
    ``training`` of another framework than the runner: its element sizes, Megatron's
    pipeline scatter/gather, and full recomputation's second forward (tp's forward
    collectives once more)."""
    job = training is not None and training.framework != "runner"
    prec = training.as_precision() if job else precision_of(precision)
    sh = shape_of(spec, cand)
    layers_of = cand.stage_layers(spec.n_layers)
    out: list[Transfer] = []
    for r in range(cand.pp):
        for stage in cand.stages_of(r):
            first, last = stage == 0, stage == cand.n_stages - 1
            groups = spec.stage_params(layers_of[stage], first=first, last=last)
            out += _dp_transfers(spec, cand, prec, r, stage, groups, sh,
                                 training if job else None)
            fp8_gather = job and training.job_style == "fsdp" and \
                training.uses_fp8("qkv") and training.uses_fp8("fc1")
            tp_rows = _tp_transfers(spec, cand, prec, r, stage, groups, sh, loss_parallel=job,
                                    fp8_gather=fp8_gather)
            if job and training.recompute == "full":
                extra = []
                for t in tp_rows:
                    if t.phase != "microbatch" or "logits" in t.what:
                        continue
                    # the recomputed forward repeats the forward's collectives: the float8
                    # gathers all (when split out), the others half of theirs
                    if "backward / head" in t.what:
                        continue
                    count = t.count if "in float8" in t.what else t.count // 2
                    extra.append(dataclasses.replace(
                        t, what=t.what + " — recomputed forward", count=count))
                tp_rows += extra
            out += tp_rows
            out += _pp_transfers(spec, cand, prec, r, stage, sh,
                                 scatter=job and training.framework == "megatron")
            out += _cp_transfers(spec, cand, prec, r, stage, groups, sh,
                                 torch_ring=job and training.framework == "torch",
                                 recompute=training.recompute if job else "none")
            out += _ep_transfers(spec, cand, prec, r, stage, layers_of[stage], sh,
                                 (training.capacity_factor or 1.0) if job else 1.0)
    return out


def bytes_by_rank(spec: ModelSpec, cand: Candidate, precision: Precision | str = "fp32"
                  ) -> dict[int, dict[tuple[str, str], float]]:
    """rank → (dim, op) → bytes per step (the sum of S over the step's instances)."""
    per_pp: dict[int, dict[tuple[str, str], float]] = {}
    for t in transfers(spec, cand, precision):
        d = per_pp.setdefault(t.pp_rank, {})
        d[(t.dim, t.op)] = d.get((t.dim, t.op), 0.0) + t.bytes
    layout = cand.layout
    return {rank: dict(per_pp.get(layout.coordinates(rank)["pp"], {}))
            for rank in range(layout.world_size)}
