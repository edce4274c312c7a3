"""Pipeline parallelism through ``torch.distributed.pipelining``.

Each pipeline rank keeps only its stage's layers of the full model (``split_model``); the first
stage also owns the token embedding and the last the final norm and output head. A schedule
(GPipe: all forwards then all backwards; 1F1B: after a warm-up of p−s−1 forwards, stage s
alternates one forward and one backward — Narayanan et al., 2021) then moves microbatches
between stages with point-to-point sends. The bubble, the share of the schedule in which a
stage waits, is (p−1)/(m+p−1) for both when stages are balanced (Huang et al., 2019).

``torch.distributed.pipelining`` adds no per-microbatch profiler ranges of its own around the
compute, so ``AnnotatedStage`` wraps every forward, backward and weight-gradient call in the
annotations of ``collectors.annotations``; the analysis finds microbatches by those names.
"""
from __future__ import annotations

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.profiler import record_function

from collectors import annotations

from .model import Transformer

SCHEDULE_CLASSES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


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


def build_schedule(module: torch.nn.Module, *, stage_index: int, num_stages: int,
                   device: torch.device, group, schedule: str, microbatches: int, loss_fn):
    """The stage for ``module`` and the named schedule running ``microbatches`` per step."""
    stage = AnnotatedStage(module, stage_index, num_stages, device, group=group)
    return SCHEDULE_CLASSES[schedule](stage, microbatches, loss_fn=loss_fn)
