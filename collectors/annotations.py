"""Profiler annotation names: the one definition shared by the runner and the analysis.

Every annotation is a ``torch.profiler.record_function`` range whose name starts with
``meshscope/``:

- ``meshscope/pipeline`` — one pipeline schedule execution (the pipeline window of a step);
- ``meshscope/<phase> stage=S chunk=C mb=M`` — one microbatch's work on one stage, with phase
  ``forward``, ``backward`` (the full backward, or the input-gradient part when a schedule splits
  it) or ``weight-grad``;
- ``meshscope/optimizer`` — the optimizer step;
- ``meshscope/comm dim=D`` — communication inside this range belongs to parallel dimension D
  (``dp``, ``tp``, ``pp``, ``cp``, ``ep``); gloo ranges carry no process group, so this is how
  the analysis attributes them where the layout alone cannot.

Steps themselves are the profiler's own ``ProfilerStep#N`` ranges (N = the run's step index).
"""
from __future__ import annotations

import re

PREFIX = "meshscope/"
PIPELINE = PREFIX + "pipeline"
OPTIMIZER = PREFIX + "optimizer"
MICROBATCH_PHASES = ("forward", "backward", "weight-grad")

_MICROBATCH_RE = re.compile(
    r"^meshscope/(?P<phase>forward|backward|weight-grad) stage=(?P<stage>\d+) "
    r"chunk=(?P<chunk>\d+) mb=(?P<mb>\d+)$")
STEP_RE = re.compile(r"^ProfilerStep#(?P<step>\d+)$")
COMM_SCOPE_RE = re.compile(r"^meshscope/comm dim=(?P<dim>\w+)$")


def comm_scope(dim: str) -> str:
    return f"{PREFIX}comm dim={dim}"


def microbatch(phase: str, stage: int, chunk: int, mb: int) -> str:
    if phase not in MICROBATCH_PHASES:
        raise ValueError(f"unknown microbatch phase {phase!r}")
    return f"{PREFIX}{phase} stage={stage} chunk={chunk} mb={mb}"


def parse_microbatch(name: str) -> dict | None:
    """``{'phase', 'stage', 'chunk', 'mb'}`` for a microbatch annotation, else None."""
    m = _MICROBATCH_RE.match(name)
    if not m:
        return None
    return {"phase": m["phase"], "stage": int(m["stage"]), "chunk": int(m["chunk"]),
            "mb": int(m["mb"])}
