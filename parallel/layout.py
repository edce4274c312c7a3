"""Parallel layouts: parsing, validation before launch, and the rank → mesh-coordinate map.

A layout names the size of each parallel dimension, e.g. ``dp=2,pp=2``. The device mesh orders
its dimensions outermost first as ``MESH_ORDER`` (pipeline outermost, as in torchtitan, so that a
pipeline stage's data-parallel peers are adjacent ranks): rank = row-major index of its
coordinates. Every check here runs in the launcher, before any process starts.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from .model import ModelConfig

MESH_ORDER = ("pp", "dp", "cp", "tp")
ALL_DIMS = ("dp", "tp", "pp", "cp", "ep")
# Dimensions the runner implements so far; the others are parsed and refused clearly.
IMPLEMENTED_DIMS = ("dp", "pp")
SCHEDULES = ("gpipe", "1f1b")


class LayoutError(ValueError):
    """A layout or run option that cannot work; the message is one line naming the constraint."""


@dataclasses.dataclass(frozen=True)
class Layout:
    sizes: dict[str, int]

    def size(self, dim: str) -> int:
        return self.sizes.get(dim, 1)

    @property
    def world_size(self) -> int:
        return math.prod(self.size(d) for d in MESH_ORDER)

    @property
    def mesh_dims(self) -> tuple[str, ...]:
        """Mesh dimension names in mesh order, size-1 dimensions included only for dp and pp
        (the runner's mesh always has those two so that code paths stay uniform)."""
        return tuple(d for d in MESH_ORDER if d in ("pp", "dp") or self.size(d) > 1)

    def __str__(self) -> str:
        return ",".join(f"{d}={self.size(d)}" for d in ALL_DIMS if self.size(d) > 1) or "dp=1"

    def coordinates(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of ``rank`` (row-major over ``mesh_dims``)."""
        coords = {}
        for dim in reversed(self.mesh_dims):
            coords[dim] = rank % self.size(dim)
            rank //= self.size(dim)
        return {d: coords[d] for d in self.mesh_dims}

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for dim in self.mesh_dims:
            rank = rank * self.size(dim) + coords.get(dim, 0)
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """The rank groups along ``dim``: ranks that differ only in their ``dim`` coordinate."""
        others = [d for d in self.mesh_dims if d != dim]
        out = []
        for fixed in itertools.product(*(range(self.size(d)) for d in others)):
            base = dict(zip(others, fixed))
            out.append([self.rank_of({**base, dim: i}) for i in range(self.size(dim))])
        return out


def parse_layout(text: str) -> Layout:
    """Parse ``dp=2,pp=2`` (any subset of dp, tp, pp, cp, ep; missing dimensions are 1)."""
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in ALL_DIMS:
            raise LayoutError(f"layout part {part!r}: expected DIM=N with DIM one of "
                              f"{', '.join(ALL_DIMS)}")
        try:
            n = int(value)
        except ValueError:
            raise LayoutError(f"layout part {part!r}: size must be an integer") from None
        if n < 1:
            raise LayoutError(f"layout part {part!r}: size must be at least 1")
        if name in sizes:
            raise LayoutError(f"layout names {name} twice")
        sizes[name] = n
    for dim, n in sizes.items():
        if n > 1 and dim not in IMPLEMENTED_DIMS:
            raise LayoutError(f"{dim}={n}: the runner does not implement the {dim} dimension yet "
                              f"(implemented: {', '.join(IMPLEMENTED_DIMS)})")
    return Layout(sizes)


def validate(layout: Layout, cfg: ModelConfig, *, schedule: str, microbatches: int,
             global_batch: int, nproc: int | None = None) -> None:
    """Raise LayoutError naming the first violated constraint."""
    if nproc is not None and nproc != layout.world_size:
        raise LayoutError(f"layout {layout} needs {layout.world_size} ranks, but {nproc} were "
                          f"requested")
    pp = layout.size("pp")
    if schedule not in SCHEDULES:
        raise LayoutError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if pp > cfg.n_layers:
        raise LayoutError(f"pp={pp} is larger than the model's {cfg.n_layers} layers "
                          f"(each pipeline stage needs at least one layer)")
    if microbatches < 1:
        raise LayoutError("--microbatches must be at least 1")
    if pp > 1 and schedule == "1f1b" and microbatches < pp:
        raise LayoutError(f"schedule 1f1b needs at least pp={pp} microbatches, got {microbatches}")
    dp = layout.size("dp")
    if global_batch % (dp * microbatches):
        raise LayoutError(f"global batch {global_batch} is not divisible by dp={dp} × "
                          f"microbatches={microbatches}")


def stage_layers(n_layers: int, pp: int) -> list[list[int]]:
    """Layer indices per pipeline stage, split as evenly as possible (earlier stages get the
    remainder)."""
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out
