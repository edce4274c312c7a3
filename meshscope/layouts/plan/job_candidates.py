"""The layouts of a GPU job: the runner's rules where they are the model's, not the runner's.

``layouts.plan.enumerate.enumerate_candidates`` keeps what ``meshscope run`` can launch; a Megatron or
DeepSpeed job can do more — above all tensor parallelism inside MoE layers (Megatron's expert
tensor parallelism). So a job's layouts are enumerated on the model's dense stand-in (the
same divisibility rules for heads, FFN width, layers, sequence and batch) and expert
parallelism is added back with the rules that belong to the model: ep divides the data ×
context ranks it borrows and the number of experts.
"""
from __future__ import annotations

import dataclasses

from meshscope.parallel.layout import Layout, LayoutError, parse_layout
from .enumerate import ChoiceError, divisors, enumerate_candidates
from .candidate import Candidate
from .spec import ModelSpec


def _with_ep(c: Candidate, ep: int) -> Candidate:
    sizes = {d: c.layout.size(d) for d in ("dp", "tp", "pp", "cp")}
    sizes["ep"] = ep
    return dataclasses.replace(c, layout=Layout({d: n for d, n in sizes.items() if n > 1}))


def _ep_problem(c: Candidate, ep: int, spec: ModelSpec) -> str | None:
    if ep == 1:
        return None
    if not spec.moe_experts:
        return f"ep={ep} needs a mixture-of-experts model"
    if c.dp_shards % ep:
        return f"ep={ep} must divide dp·cp = {c.dp_shards}"
    if spec.moe_experts % ep:
        return f"ep={ep} does not divide the {spec.moe_experts} experts"
    return None


def job_candidates(world: int, spec: ModelSpec, *, dims, schedules, microbatches, dp_modes,
                   global_batch: int, sp: bool, layouts=None, extra_check=None
                   ) -> list[Candidate]:
    """Every valid layout of ``world`` GPUs for ``spec`` (ChoiceError for one that is not)."""
    dense = dataclasses.replace(spec.as_config(), moe_experts=0)
    common = dict(schedules=schedules, microbatches=microbatches, dp_modes=dp_modes,
                  global_batch=global_batch, sp=sp, runner_only=False, extra_check=extra_check)
    out: list[Candidate] = []
    if layouts:
        for text in layouts:
            try:
                layout = parse_layout(text)
            except LayoutError as e:
                raise ChoiceError(f"--layouts {text!r}: {e}") from None
            ep = layout.size("ep")
            base = ",".join(f"{d}={layout.size(d)}" for d in ("dp", "tp", "pp", "cp")
                            if layout.size(d) > 1) or "dp=1"
            for c in enumerate_candidates(world, dense, layouts=[base], **common):
                why = _ep_problem(c, ep, spec)
                if why:
                    raise ChoiceError(f"--layouts {text}: {why}")
                out.append(_with_ep(c, ep))
    else:
        plain = tuple(d for d in dims if d != "ep")
        for c in enumerate_candidates(world, dense, dims=plain, **common):
            eps = divisors(c.dp_shards) if "ep" in dims and spec.moe_experts else [1]
            out += [_with_ep(c, ep) for ep in eps if not _ep_problem(c, ep, spec)]
    seen, unique = set(), []
    for c in out:
        if c.name not in seen:
            seen.add(c.name)
            unique.append(c)
    return unique
