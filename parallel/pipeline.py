"""Pipeline parallelism through ``torch.distributed.pipelining``.

The model's layers are cut into ``p · v`` stages (p pipeline ranks, v virtual stages per rank).
Each stage keeps only its layers of the full model (``split_model``); the first stage also owns
the token embedding, the last the final norm and output head. Stages are placed on ranks in one
of two ways:

- **loop** (GPipe, 1F1B, interleaved 1F1B, looped BFS, interleaved zero bubble): stage s runs on
  rank s mod p, so rank r holds stages r, r+p, r+2p, …;
- **V** (ZB-V, DualPipeV; v = 2): rank r holds stages r and 2p−1−r, so the first and the last
  stage share rank 0.

The schedule then moves microbatches between stages with point-to-point sends: GPipe runs all
forwards then all backwards (Huang et al., 2019); 1F1B alternates one forward and one backward
after a warm-up (Narayanan et al., 2021); interleaved 1F1B does so over v chunks per rank,
shrinking the bubble by v (same paper); zero-bubble schedules split the backward into the input
gradient (B) and the weight gradient (W) and use W to fill the bubble (Qi et al., 2024);
DualPipeV overlaps a forward and a backward chunk (DeepSeek-V3 report, 2024).

``torch.distributed.pipelining`` adds no per-microbatch profiler ranges around the compute, so
``AnnotatedStage`` wraps every forward, backward and weight-gradient call in the annotations of
``collectors.annotations``; the analysis finds microbatches by those names.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch.distributed.pipelining import PipelineStage, schedules
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import record_function

from meshscope.collectors import annotations
from meshscope.theory.schedules import SCHEDULES, stages_of_rank  # noqa: F401 - re-exported

from .model import Transformer


# The torch class of each schedule in ``schedules.SCHEDULES`` (placement and stages per rank
# are there, without torch).
SCHEDULE_CLASSES = {
    "gpipe": schedules.ScheduleGPipe,
    "1f1b": schedules.Schedule1F1B,
    "interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
    "looped-bfs": schedules.ScheduleLoopedBFS,
    "zero-bubble": schedules.ScheduleInterleavedZeroBubble,
    "zbv": schedules.ScheduleZBVZeroBubble,
    "dualpipev": schedules.ScheduleDualPipeV,
}


def split_model(model: Transformer, layer_ids: list[int], *, first: bool, last: bool
                ) -> Transformer:
    """Drop from ``model`` (in place) everything that stage does not own."""
    keep = {str(i) for i in layer_ids}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


class AnnotatedStage(PipelineStage):
    """A PipelineStage whose per-microbatch work carries meshscope profiler annotations."""

    def __init__(self, *args, chunk: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self._chunk = chunk

    def _name(self, phase: str, mb: int) -> str:
        return annotations.microbatch(phase, self.stage_index, self._chunk, mb)

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        with record_function(self._name("forward", fwd_chunk_id)):
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        with record_function(self._name("backward", bwd_chunk_id)):
            return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)

    def backward_weight_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        with record_function(self._name("weight-grad", bwd_chunk_id)):
            return super().backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs)


def build_schedule(modules: dict[int, torch.nn.Module], *, num_stages: int, device: torch.device,
                   group, schedule: str, microbatches: int, loss_fn):
    """Stages for ``modules`` (global stage index → module, in chunk order) and the named
    schedule running ``microbatches`` per step."""
    spec, cls = SCHEDULES[schedule], SCHEDULE_CLASSES[schedule]
    stages = [AnnotatedStage(mod, idx, num_stages, device, group=group, chunk=chunk)
              for chunk, (idx, mod) in enumerate(modules.items())]
    if spec.multi:
        return cls(stages, microbatches, loss_fn=loss_fn)
    (stage,) = stages
    return cls(stage, microbatches, loss_fn=loss_fn)


@contextlib.contextmanager
def dp_sync_left_to_stages(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Run a schedule step with every DDP-wrapped stage module in ``no_sync``, so that the only
    backward whose gradients DDP reduces is the one the stage marks as the last.

    The stage already runs each microbatch's forward and each non-last backward under
    ``no_sync``, and arms DDP's reducer itself before the last backward
    (``PipelineStage.backward_maybe_with_nosync`` calls ``reducer.prepare_for_backward``).
    One forward escapes that in torch 2.13: the first step's metadata inference
    (``PipelineStage._forward_metadata_inference``) calls the DDP module with gradients on
    and outside ``no_sync``, whose ``_post_forward`` arms the reducer; that inference never
    runs a backward through the parameters, so the first real backward — a non-last one —
    then reduces its gradients and records its parameter order for the bucket rebuild, and
    the last backward records them again. When no forward runs between those two backwards
    (the first stage of 1F1B with as many microbatches as stages: F0 F1 B0 B1), DDP's
    bucket rebuild at the next forward finds twice the parameters and fails
    (``params_.size() == rebuilt_param_indices_.size()``, reducer.cpp). Under ``no_sync``
    the inference's forward leaves the reducer alone; nothing else changes (every other
    forward already ran under it, and the last backward's ``prepare_for_backward`` does not
    look at it). FSDP stages are left to the stage's own handling."""
    with contextlib.ExitStack() as stack:
        for module in modules:
            if isinstance(module, DDP):
                stack.enter_context(module.no_sync())
        yield
