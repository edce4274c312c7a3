"""Whether two runs compare like for like, and where they do not (issue 45).

A difference in step time between an A100 job of 8 ranks and a V100 job of 2 is not a
regression of anyone's code: before any cause is named, a comparison says what differs in what
the runs ran on and how they were measured. ``differences(before, after)`` lists, in words,
each of these that differs (each side's ``model.Environment``, run.json's layout, the ranks):

- the device model (deviceProperties) and how many devices each trace lists;
- the world size and the ranks compared (by id, by position, or none in common);
- the communication backend and the versions the traces record (NCCL, the CUDA runtime and
  driver) and run.json's torch version;
- the profiler's settings (shapes, memory, stacks, FLOPs, modules: each costs time);
- what a step is (ProfilerStep ranges, a user's annotation, the whole trace as one window);
- run.json's layout and schedule.

A field neither side states is no difference; one side stating it and the other not is said
("device: NVIDIA A100 → not recorded"). ``hardware_changed`` says whether the device model
differs — then every kernel-level sentence of the comparison says so.
"""
from __future__ import annotations

from .sides import Side

#: (Environment field, what it is, in words)
FIELDS = (("devices", "device"), ("device_counts", "devices per trace"),
          ("backends", "backend"), ("nccl_versions", "NCCL version"),
          ("cuda_runtime_versions", "CUDA runtime"), ("cuda_driver_versions", "CUDA driver"),
          ("torch_versions", "PyTorch"), ("profiler_settings", "profiler settings"),
          ("step_definitions", "step definition"))


def _text(values: list) -> str:
    return " / ".join(map(str, values)) if values else "not recorded"


def _fact(side: Side, key: str):
    return side.summary.run_fact(key)


def differences(before: Side, after: Side, rank_match: str) -> list[str]:
    """What differs between the two runs' environments (module docstring), one line each;
    empty when they are alike in everything both state."""
    a, b = before.summary.environment, after.summary.environment
    out = []
    if before.summary.device != after.summary.device:
        out.append(f"device type: {before.summary.device} → {after.summary.device}")
    for field, words in FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        if x != y and (x or y):
            out.append(f"{words}: {_text(x)} → {_text(y)}")
    wa, wb = a.world_sizes, b.world_sizes
    if wa and wb and wa != wb:
        out.append(f"world size: {_text(wa)} → {_text(wb)}")
    if rank_match == "position":
        out.append(f"ranks compared by position: {before.ranks} → {after.ranks} (no rank id "
                   f"in common)")
    elif rank_match == "none":
        out.append(f"ranks: {before.ranks} → {after.ranks} (none in common, different counts)")
    for key, words in (("layout_str", "layout"), ("schedule", "schedule")):
        x, y = _fact(before, key), _fact(after, key)
        if x != y and x is not None and y is not None:
            out.append(f"{words}: {x} → {y}")
    return out


def hardware_changed(before: Side, after: Side) -> bool:
    """Whether the device model differs (both sides name theirs)."""
    a, b = before.summary.environment.devices, after.summary.environment.devices
    return bool(a and b and a != b) or before.summary.device != after.summary.device
