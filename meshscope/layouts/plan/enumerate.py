"""Every valid layout of a world of ranks: ``enumerate_candidates``, what ``meshscope sweep``
runs and ``meshscope plan`` weighs (``job_candidates`` widens it to what a GPU framework can
take). A layout that ``meshscope run`` would refuse (``parallel.layout.validate``) is left out,
or — named explicitly with ``--layouts`` — refused with ``ChoiceError`` naming it and why.
"""
from __future__ import annotations

import itertools

from meshscope.parallel.config import ModelConfig
from meshscope.parallel.layout import Layout, LayoutError, parse_layout, validate
from meshscope.vocabulary import PARALLEL_DIMS

from .candidate import RUNNER_DP_MODES, ZERO_STAGE, Candidate


class ChoiceError(ValueError):
    """Layouts that cannot be chosen (an unknown dimension, a layout the runner refuses, none
    valid); the message is one line."""


def divisors(n: int) -> list[int]:
    """The divisors of n, smallest first."""
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(world: int, dims: tuple[str, ...]) -> list[dict[str, int]]:
    """Every assignment of sizes to the mesh dimensions in ``dims`` whose product is world."""
    mesh = [d for d in ("dp", "tp", "pp", "cp") if d in dims]
    out = []
    for sizes in itertools.product(*(divisors(world) for _ in mesh)):
        prod = 1
        for s in sizes:
            prod *= s
        if prod == world:
            out.append(dict(zip(mesh, sizes)))
    return out


def _order_key(c: Candidate):
    """dp=N first, then single dimensions, then mixes; within, by the dims' order."""
    sizes = [c.layout.size(d) for d in PARALLEL_DIMS]
    return (sum(1 for s in sizes if s > 1), [-s for s in sizes], c.schedule, c.microbatches,
            RUNNER_DP_MODES.index(c.dp_mode) if c.dp_mode in RUNNER_DP_MODES else 9)


def _accepts(c: Candidate, cfg: ModelConfig, runner_only: bool = True) -> str | None:
    """None when ``meshscope run`` would launch ``c`` (``runner_only=False``: or could, with
    a data-parallel mode the runner lacks), else why not (one line)."""
    try:
        validate(c.layout, cfg, schedule=c.schedule, microbatches=c.microbatches,
                 global_batch=c.global_batch, virtual=c.virtual,
                 layers_per_stage=list(c.stage_layer_counts) if c.stage_layer_counts else None)
    except LayoutError as e:
        return str(e)
    if c.dp_mode not in ZERO_STAGE:
        return f"unknown dp mode {c.dp_mode!r} (known: {', '.join(ZERO_STAGE)})"
    if runner_only and c.dp_mode not in RUNNER_DP_MODES:
        return f"dp mode {c.dp_mode} is not implemented by the runner"
    if c.layout.size("ep") > 1 and c.dp_mode != "ddp":
        return f"expert parallelism runs with --dp-mode ddp only, not {c.dp_mode}"
    return None


def enumerate_candidates(world: int, cfg: ModelConfig, *, dims=("dp", "tp", "pp"),
                         schedules=("1f1b",), microbatches=(4,), dp_modes=("ddp",),
                         global_batch: int = 16, sp: bool = True, layouts=None,
                         runner_only: bool = True, extra_check=None) -> list[Candidate]:
    """Every valid layout of ``world`` ranks (see the module docstring). Explicit ``layouts``
    (``["dp=2,pp=2", "tp=4"]``) that the runner would refuse raise ChoiceError naming the
    layout and the reason. ``runner_only=False`` (the planner) also keeps data-parallel modes
    the runner does not implement (``zero1``); ``extra_check(candidate)`` returns a reason to
    refuse one more (the planner's for models the runner cannot build), or None."""
    if layouts:
        bases = []
        for text in layouts:
            try:
                layout = parse_layout(text)
            except LayoutError as e:
                raise ChoiceError(f"--layouts {text!r}: {e}") from None
            if layout.world_size != world:
                raise ChoiceError(f"--layouts {text!r} needs {layout.world_size} ranks, not "
                                 f"--world {world}")
            bases.append(layout.sizes)
    else:
        unknown = [d for d in dims if d not in PARALLEL_DIMS]
        if unknown:
            raise ChoiceError(f"--dims: unknown dimension {unknown[0]!r} (known: "
                             f"{', '.join(PARALLEL_DIMS)})")
        bases = []
        for sizes in _splits(world, tuple(dims)):
            eps = [1]
            if "ep" in dims and cfg.moe_experts:
                eps = divisors(sizes.get("dp", 1) * sizes.get("cp", 1))
            bases += [{**sizes, "ep": ep} for ep in eps]
    out, seen = [], set()
    for sizes in bases:
        layout = Layout({d: n for d, n in sizes.items() if n > 1})
        pp, shards = layout.size("pp"), layout.size("dp") * layout.size("cp")
        for schedule, m, mode in itertools.product(
                schedules if pp > 1 else ("1f1b",), microbatches,
                dp_modes if shards > 1 else ("ddp",)):
            c = Candidate(layout=layout, schedule=schedule, microbatches=m, dp_mode=mode,
                          sp=sp, global_batch=global_batch)
            why = _accepts(c, cfg, runner_only) or (extra_check(c) if extra_check else None)
            if why and layouts:
                raise ChoiceError(f"--layouts {layout}: {why}")
            if not why and c.name not in seen:
                seen.add(c.name)
                out.append(c)
    if not out:
        raise ChoiceError(f"no valid layout of {world} ranks for this model over "
                         f"{', '.join(dims)} (see `meshscope run --help` for the rules)")
    return sorted(out, key=_order_key)
