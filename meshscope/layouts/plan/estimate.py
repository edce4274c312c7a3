"""A rank's planned memory, term by term: ``MemoryEstimate``, what both memory models return —
the runner's (``memory.py``) and a GPU framework's (``job_memory.py``) — and what the planner,
``plan --detail`` and ``compare --detail`` read."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Peak memory of one rank (the pipeline rank ``pp_rank``; every rank of that pipeline
    coordinate holds the same)."""
    pp_rank: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    buffers_bytes: float
    activations_bytes: float
    microbatches_in_flight: float
    terms: dict = dataclasses.field(default_factory=dict)   # every term, bytes on the device
    cpu_bytes: float = 0.0                                  # offloaded to host memory

    @property
    def model_states_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.model_states_bytes + self.buffers_bytes + self.activations_bytes

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "model_states_bytes": self.model_states_bytes,
                "total_bytes": self.total_bytes}
