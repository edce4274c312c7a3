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

from .config import ModelConfig
from meshscope.vocabulary import MESH_ORDER, PARALLEL_DIMS



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
        return ",".join(f"{d}={self.size(d)}" for d in PARALLEL_DIMS if self.size(d) > 1) or "dp=1"

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

    def coordinate_table(self) -> str:
        """rank → mesh coordinates, one line per rank, for printing before launch."""
        dims = self.mesh_dims
        lines = ["  rank  " + "  ".join(f"{d:>3}" for d in dims)]
        for r in range(self.world_size):
            c = self.coordinates(r)
            lines.append(f"  {r:>4}  " + "  ".join(f"{c[d]:>3}" for d in dims))
        return "\n".join(lines)

    def _dp_cp_blocks(self) -> list[list[int]]:
        """For each (pp, tp) position, the ranks of its dp × cp block, dp-major."""
        out = []
        for pp in range(self.size("pp")):
            for tp in range(self.size("tp")):
                out.append([self.rank_of({"pp": pp, "tp": tp, "dp": d, "cp": c})
                            for d in range(self.size("dp")) for c in range(self.size("cp"))])
        return out

    def ep_groups(self) -> list[list[int]]:
        """Expert-parallel groups: consecutive runs of ``ep`` ranks of each dp × cp block
        (ep borrows its ranks from data and context parallelism, as in torchtitan)."""
        ep = self.size("ep")
        return [b[i:i + ep] for b in self._dp_cp_blocks() for i in range(0, len(b), ep)]

    def ep_replica_groups(self) -> list[list[int]]:
        """Ranks holding the same experts: the same position in every ep group of a block."""
        ep = self.size("ep")
        return [b[i::ep] for b in self._dp_cp_blocks() for i in range(ep)]

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
        if not sep or name not in PARALLEL_DIMS:
            raise LayoutError(f"layout part {part!r}: expected DIM=N with DIM one of "
                              f"{', '.join(PARALLEL_DIMS)}")
        try:
            n = int(value)
        except ValueError:
            raise LayoutError(f"layout part {part!r}: size must be an integer") from None
        if n < 1:
            raise LayoutError(f"layout part {part!r}: size must be at least 1")
        if name in sizes:
            raise LayoutError(f"layout names {name} twice")
        sizes[name] = n
    return Layout(sizes)


def virtual_stages(schedule: str, requested: int | None) -> int:
    """Stages per pipeline rank for ``schedule``: 1 for single-stage schedules, 2 for the
    V-shaped ones, ``requested`` (default 2) for the other multi-stage schedules."""
    from meshscope.theory.schedules import SCHEDULES

    spec = SCHEDULES[schedule]
    if spec.fixed_virtual is not None:
        if requested not in (None, spec.fixed_virtual):
            raise LayoutError(f"schedule {schedule} runs exactly {spec.fixed_virtual} stage(s) "
                              f"per rank, not --virtual-stages {requested}")
        return spec.fixed_virtual
    v = 2 if requested is None else requested
    if v < 1:
        raise LayoutError("--virtual-stages must be at least 1")
    return v


def validate(layout: Layout, cfg: ModelConfig, *, schedule: str, microbatches: int,
             global_batch: int, virtual: int | None = None,
             layers_per_stage: list[int] | None = None) -> None:
    """Raise LayoutError naming the first violated constraint."""
    from meshscope.theory.schedules import SCHEDULES

    pp = layout.size("pp")
    if schedule not in SCHEDULES:
        raise LayoutError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if microbatches < 1:
        raise LayoutError("--microbatches must be at least 1")
    v = virtual_stages(schedule, virtual) if pp > 1 else 1
    n_stages = pp * v
    if pp > cfg.n_layers:
        raise LayoutError(f"pp={pp} is larger than the model's {cfg.n_layers} layers "
                          f"(each pipeline stage needs at least one layer)")
    if n_stages > cfg.n_layers:
        raise LayoutError(f"pp={pp} × {v} stages per rank = {n_stages} stages, more than the "
                          f"model's {cfg.n_layers} layers (use --layers or fewer stages)")
    if pp > 1:
        if schedule in ("1f1b", "dualpipev") and microbatches < n_stages:
            raise LayoutError(f"schedule {schedule} needs at least {n_stages} microbatches "
                              f"(the number of stages), got {microbatches}")
        if SCHEDULES[schedule].multi and SCHEDULES[schedule].placement == "loop":
            rounds = max(1, microbatches // pp)
            if microbatches % rounds:
                raise LayoutError(f"schedule {schedule} needs microbatches divisible by "
                                  f"max(1, microbatches // pp) = {rounds}, got {microbatches}")
    if layers_per_stage is not None:
        if len(layers_per_stage) != n_stages or any(n < 1 for n in layers_per_stage) \
                or sum(layers_per_stage) != cfg.n_layers:
            raise LayoutError(f"--stage-layers {','.join(map(str, layers_per_stage))}: need "
                              f"{n_stages} positive counts adding up to {cfg.n_layers} layers")
    tp, cp, ep = layout.size("tp"), layout.size("cp"), layout.size("ep")
    for what, n in (("attention heads", cfg.n_heads), ("FFN hidden size", cfg.ffn_hidden)):
        if n % tp:
            raise LayoutError(f"tp={tp} does not divide the model's {n} {what}")
    if cfg.seq_len % (2 * cp):
        raise LayoutError(f"cp={cp} needs the sequence length {cfg.seq_len} to be divisible by "
                          f"2·cp = {2 * cp} (each rank holds two mirrored chunks)")
    if ep > 1:
        if cfg.moe_experts == 0:
            raise LayoutError(f"ep={ep} needs a mixture-of-experts model (--moe-experts N)")
        if (layout.size("dp") * cp) % ep:
            raise LayoutError(f"ep={ep} must divide dp·cp = {layout.size('dp') * cp} (expert "
                              f"parallelism borrows the data and context ranks)")
    if cfg.moe_experts:
        if cfg.moe_experts % ep:
            raise LayoutError(f"ep={ep} does not divide the {cfg.moe_experts} experts")
        if not 1 <= cfg.moe_top_k <= cfg.moe_experts:
            raise LayoutError(f"--moe-top-k {cfg.moe_top_k} must be between 1 and the "
                              f"{cfg.moe_experts} experts")
        if tp > 1:
            raise LayoutError("tensor parallelism of MoE layers is not implemented: use tp=1 "
                              "with --moe-experts")
    dp = layout.size("dp")
    if global_batch % (dp * microbatches):
        raise LayoutError(f"global batch {global_batch} is not divisible by dp={dp} × "
                          f"microbatches={microbatches}")


def stage_layers(n_layers: int, n_stages: int, counts: list[int] | None = None
                 ) -> list[list[int]]:
    """Layer indices per pipeline stage: ``counts`` layers each when given, else as even as
    possible (earlier stages get the remainder)."""
    if counts is None:
        base, extra = divmod(n_layers, n_stages)
        counts = [base + (1 if s < extra else 0) for s in range(n_stages)]
    out, start = [], 0
    for n in counts:
        out.append(list(range(start, start + n)))
        start += n
    return out
