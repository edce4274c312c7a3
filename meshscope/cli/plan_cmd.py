"""``meshscope plan``: memory, traffic and step time of every layout, predicted before running.

A model (a preset, or a Hugging Face ``config.json``), a training setup (framework, precision,
optimizer, recomputation…), a device and a topology go in; ``layouts.plan`` predicts each
layout's terms, optionally calibrated on measured runs (``--from``). ``meshscope sweep`` runs
the layouts instead (``sweep_cmd.py``), ``meshscope compare`` ranks runs (``compare_cmd.py``).
What the flags say, as the planner's records, is ``plan_inputs.py``.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import click

from meshscope.layouts.plan import CommModel, ModelSpec, Rates, plan
from meshscope.layouts.plan.enumerate import ChoiceError, enumerate_candidates
from meshscope.layouts.plan.job_candidates import job_candidates
from meshscope.layouts.plan.job_step import JobOptions, uncertainty_of
from meshscope.layouts.plan.render import render_plan
from meshscope.layouts.plan.devices import lookup
from meshscope.layouts.plan.enumerate import divisors
from meshscope.layouts.plan.planner import Plan, plan_one, rank
from meshscope.layouts.plan.search import (FSDP_RECOMPUTE, MIN_CP_TOKENS,
                                           SEARCHED_RECOMPUTE, SEARCHED_SCHEDULES,
                                           SEARCHED_VIRTUAL, STYLE_DP_MODES, Knobs, Try, fastest,
                                           fit_advice, search, searched_dims,
                                           step_lower_bound_us)
from meshscope.theory.schedules import SCHEDULES
from meshscope.layouts.plan.serial import plan_to_dict
from meshscope.parallel.layout import LayoutError, parse_layout
from meshscope.vocabulary import PARALLEL_DIMS

from .common import fail
from .layout_choices import assumed_rates, baseline_model, choice_options, csv_values, \
    layouts_of, model_overrides
from .plan_inputs import (apply_pipeline_options, job_setup, model_spec, split_from,
                          training_setup)


@click.command("plan")
@click.option("--world", type=int, default=None, help="Ranks (default: the --from run's).")
@click.option("--model", default="tiny", show_default=True, help="Model preset.")
@click.option("--model-json", default=None, type=click.Path(exists=True, dir_okay=False),
              help="A Hugging Face config.json, or the sizes in meshscope's field names "
                   "(docs/layouts.md); a field the planner cannot honour is refused.")
@click.option("--seq-len", type=int, default=None, help="Sequence length trained (overrides "
                                                        "the model's; needed without one).")
@choice_options
@click.option("--micro-batch-size", type=int, default=None,
              help="Sequences per microbatch: each layout's microbatches = global batch / "
                   "(dp × this), instead of --microbatches. A GPU job given neither searches "
                   "every size from 1 up to what fits.")
@click.option("--dp-modes", default=None,
              help="ddp, zero1, zero2, fsdp, fsdp_noreshard (comma-separated; zero1 = the "
                   "distributed optimizer, planning only; fsdp_noreshard keeps a stage "
                   "gathered through the step). Default: ddp for the runner; a GPU job "
                   "searches its style's (all without --style; fsdp: fsdp,fsdp_noreshard).")
@click.option("--virtual-stages", type=int, default=None,
              help="Stages per pipeline rank for interleaved schedules.")
@click.option("--stage-layers", default=None,
              help="Layers of each pipeline stage, comma-separated (e.g. 19,20,20,21).")
@click.option("--framework", type=click.Choice(["runner", "megatron", "deepspeed", "torch"]),
              default=None, help="Whose memory and traffic to plan (default: runner for a "
                                 "preset, megatron for --model-json, the --style's).")
@click.option("--style", type=click.Choice(["megatron", "fsdp", "deepspeed"]), default=None,
              help="How the job runs: each dimension's overlap (default: the framework's; "
                   "fsdp implies --framework torch).")
@click.option("--precision", type=click.Choice(["fp32", "mixed", "bf16", "fp8"]), default=None,
              help="fp32 (the runner's), mixed (bf16 + fp32 master; GPU default), bf16 "
                   "(no master copy), fp8 (mixed with the --fp8-ops GEMMs in fp8).")
@click.option("--fp8-ops", default=None,
              help="GEMMs run in fp8 with --precision fp8 (default qkv,proj,fc1,fc2,experts; "
                   "also head, attention).")
@click.option("--fp8-recipe", type=click.Choice(["delayed", "current", "mx"]),
              default="delayed", show_default=True, help="fp8 scaling (current/mx: one more "
                                                         "pass over each cast tensor).")
@click.option("--fp8-params", is_flag=True, help="Weights held in fp8 (beside the fp32 "
                                                 "master copy).")
@click.option("--optimizer", type=click.Choice(["adam", "sgd", "adafactor"]), default="adam",
              show_default=True)
@click.option("--optimizer-states", type=click.Choice(["fp32", "bf16"]), default="fp32",
              show_default=True, help="The optimizer's moments in fp32 or bf16.")
@click.option("--recompute", type=click.Choice(["none", "selective", "op", "full"]),
              default=None,
              help="Activation recomputation (op: torchtitan's op-level selective). Default: "
                   "none for the runner; a GPU job searches none, selective (op with --style "
                   "fsdp) and full, keeping each layout's least that fits.")
@click.option("--attention", type=click.Choice(["flash", "eager"]), default="flash",
              show_default=True, help="eager keeps the s × s scores (Korthikanti's 5as²b).")
@click.option("--block", type=click.Choice(["llama", "gpt"]), default="llama",
              show_default=True, help="Layer structure (gpt: LayerNorm, a plain GeLU MLP, "
                                      "dropout).")
@click.option("--offload", type=click.Choice(["none", "optimizer", "all"]), default="none",
              show_default=True, help="CPU offload (all = weights too, with fsdp).")
@click.option("--fp32-grads/--no-fp32-grads", default=None,
              help="An fp32 gradient accumulation buffer (default: the framework's).")
@click.option("--fsdp-prefetch", type=int, default=1, show_default=True,
              help="Layers FSDP gathers ahead (its unsharded working set).")
@click.option("--allocator-reserve", type=float, default=None,
              help="Reserved memory above the allocated peak, a fraction (default 0.05).")
@click.option("--capacity-factor", type=float, default=None,
              help="MoE: tokens an expert takes over its balanced share (default: dropless).")
@click.option("--ep-dispatcher", type=click.Choice(["alltoall", "deepep"]),
              default="alltoall", show_default=True,
              help="MoE token dispatch: an NCCL all-to-all (every routed copy its own "
                   "message) or DeepEP/HybridEP (one network copy a remote node, forwarded "
                   "over NVLink).")
@click.option("--moe-routing", type=click.Choice(["model", "uniform"]), default="model",
              show_default=True,
              help="Which experts a token reaches: the config's router (group-limited where "
                   "it has n_group/topk_group) or uniform (force-balanced benchmark gates).")
@click.option("--fused-kernels/--eager-kernels", "fused", default=None,
              help="Norms, activations and residual adds as fused kernels (Transformer "
                   "Engine, torch.compile) or PyTorch's eager ops (default: fused, eager for "
                   "--style fsdp).")
@click.option("--overlap", default=None,
              help="Fraction of each dimension's communication hidden, over the style's "
                   "defaults: tp=0.5,dp=1,ep=0 …")
@click.option("--gpus-per-node", type=int, default=None,
              help="GPUs a node (default: the device's, 8): groups inside a node use NVLink, "
                   "others the network.")
@click.option("--intra-gbps", type=float, default=None, help="Bus bandwidth in a node, GB/s.")
@click.option("--inter-gbps", type=float, default=None,
              help="Bus bandwidth between nodes per GPU, GB/s.")
@click.option("--intra-latency-us", type=float, default=None)
@click.option("--inter-latency-us", type=float, default=None)
@click.option("--dp-overlap/--no-dp-overlap", default=True,
              help="Data-parallel reductions overlap the backward (--no-dp-overlap: dp=0).")
@click.option("--tp-overlap", is_flag=True, help="Tensor-parallel communication hidden "
                                                 "(Megatron's --tp-comm-overlap: tp=1).")
@click.option("--tflops", type=float, default=None, help="Sustained TFLOP/s per device.")
@click.option("--peak-tflops", type=float, default=None, help="Peak TFLOP/s per device (MFU; "
                                                              "the runner's).")
@click.option("--device", default=None, help="A device of the catalogue: H100-SXM, H100-PCIe, "
                                             "H800, H200, B200, A100-80GB, A100-40GB, MI300X, "
                                             "MI250.")
@click.option("--device-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="A custom device, TOML (docs/layouts.md).")
@click.option("--bf16-tflops", type=float, default=None, help="The device's bf16 peak.")
@click.option("--fp8-tflops", type=float, default=None, help="The device's fp8 peak.")
@click.option("--memory-tbps", type=float, default=None, help="The device's memory bandwidth.")
@click.option("--gemm-efficiency", type=float, default=None,
              help="Scale the device's GEMM curves to this efficiency at 8192-sized products.")
@click.option("--devices", type=int, default=None,
              help="Devices the ranks share (runner on CPU: cores).")
@click.option("--device-memory-gb", type=float, default=None,
              help="Memory of one device, GiB (default: the device's): layouts that do not "
                   "fit are marked and ranked last.")
@click.option("--bandwidth-gbps", type=float, default=None,
              help="Bus bandwidth, GB/s (runner; GPU jobs: --intra-gbps/--inter-gbps).")
@click.option("--latency-us", type=float, default=None, help="Collective latency, µs (runner).")
@click.option("--baseline", default=None, type=click.Path(exists=True),
              help="bench-comm baseline.parquet or nccl-tests output for communication (GPU "
                   "jobs: the network between nodes).")
@click.option("--from", "from_runs", multiple=True, type=click.Path(),
              help="Calibrate from this measured run (repeatable); without --model or "
                   "--model-json predicts the run's own model. A GPU job also takes anyone's "
                   "Kineto trace file (record_shapes=True): its GEMMs' achieved rate "
                   "replaces the device curve's.")
@click.option("--top", type=int, default=None, help="Print the first N layouts (a searched "
                                                    "GPU plan: 20 unless given).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON, every term.")
@click.option("--detail", is_flag=True, help="Every term and operation of every layout, and "
                                             "every device value with its source.")
@click.pass_context
def plan_cmd(ctx, world, model, model_json, seq_len, dims, layouts, schedules, microbatches,
             global_batch, no_sp, layers, moe_experts, moe_top_k, moe_every, micro_batch_size,
             dp_modes, virtual_stages, stage_layers, framework, style, precision, fp8_ops,
             fp8_recipe, fp8_params, optimizer, optimizer_states, recompute, attention, block,
             offload, fp32_grads, fsdp_prefetch, allocator_reserve, capacity_factor,
             ep_dispatcher, moe_routing, fused, overlap, gpus_per_node, intra_gbps, inter_gbps,
             intra_latency_us, inter_latency_us,
             dp_overlap, tp_overlap, tflops, peak_tflops, device, device_file, bf16_tflops,
             fp8_tflops, memory_tbps, gemm_efficiency, devices, device_memory_gb,
             bandwidth_gbps, latency_us, baseline, from_runs, top, as_json, detail):
    """Predict memory, communication and step time of layouts, before running them."""
    def given(name):
        return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

    if top is not None and top < 1:
        fail(f"--top {top}: at least 1")
    searched_recompute = recompute is None
    training = training_setup(framework, style, precision, optimizer, recompute or "none",
                              attention,
                              block, offload, fp32_grads, model_json, from_runs, fp8_ops,
                              fp8_recipe, fp8_params, optimizer_states, overlap, fsdp_prefetch,
                              allocator_reserve, capacity_factor, fused, ep_dispatcher,
                              moe_routing)
    job = training.framework != "runner"
    _check_flags(training, given, devices=devices, bandwidth_gbps=bandwidth_gbps,
                 latency_us=latency_us, peak_tflops=peak_tflops, tp_overlap=tp_overlap,
                 dp_overlap=dp_overlap, micro_batch_size=micro_batch_size)
    base_comm = baseline_model(baseline)
    notes: list[str] = []
    explicit_model = model_json or given("model") or any(
        given(x) for x in ("layers", "moe_experts", "moe_top_k", "moe_every"))
    spec = model_spec(model, model_json, seq_len,
                      model_overrides(layers, moe_experts, moe_top_k, moe_every), notes,
                      block if job else None) if explicit_model or not from_runs else None
    rates = comm = None
    dev = topo = None
    overhead_us = 0.0
    if job:
        dev, topo, overhead_us = job_setup(
            training, device, device_file,
            {"bf16_tflops": bf16_tflops, "fp8_tflops": fp8_tflops,
             "device_memory_gb": device_memory_gb, "memory_tbps": memory_tbps,
             "gemm_efficiency": gemm_efficiency}, tflops, gpus_per_node, intra_gbps,
            inter_gbps, intra_latency_us, inter_latency_us, base_comm, from_runs, notes)
        if from_runs and spec is None:
            fail("--from with a GPU framework calibrates the device; name the model to plan "
                 "with --model-json (or --model)")
    else:
        rates, comm, notes = _runner_rates(tflops, peak_tflops, devices, device,
                                           bandwidth_gbps, latency_us, base_comm, notes)
    if from_runs and not job:
        cal = _calibrated(from_runs, given, spec, world, global_batch, dims, rates, base_comm,
                          notes)
        spec, world, global_batch, dims = cal.spec, cal.world, cal.global_batch, cal.dims
        rates, comm, notes = cal.rates, cal.comm, cal.notes
    if world is None:
        fail("plan needs --world N (or --from RUN)")
    memory_bytes = dev.memory_bytes if dev is not None else (
        device_memory_gb * 2 ** 30 if device_memory_gb else None)
    band, band_source = uncertainty_of(spec, training) if dev is not None else (None, "")
    options = JobOptions(dp_overlap=dp_overlap, tp_overlap=tp_overlap,
                         step_overhead_us=overhead_us)
    knobs = Knobs(micro_batch=not (given("microbatches") or micro_batch_size),
                  dp_mode=dp_modes is None, recompute=searched_recompute)
    ask = _Ask(world=world, dims=dims if given("dims") else None,
               schedules=schedules if given("schedules") else None,
               microbatches=microbatches, micro_batch_size=micro_batch_size,
               dp_modes=dp_modes, global_batch=global_batch, no_sp=no_sp, layouts=layouts,
               virtual_stages=virtual_stages, stage_layers=stage_layers, recompute=recompute)
    if job and dev is not None and knobs.any:
        p = _searched_plan(spec, training, dev, topo, ask, memory_bytes, options, notes,
                           band, band_source, style, knobs, top or SHOWN)
        _print(p, as_json, detail, top or SHOWN)
        return
    cands = _candidates(job, world, spec, dims=dims, schedules=schedules,
                        microbatches=microbatches, micro_batch_size=micro_batch_size,
                        dp_modes=dp_modes or "ddp", global_batch=global_batch, no_sp=no_sp,
                        layouts=layouts)
    cands = apply_pipeline_options(cands, virtual_stages, stage_layers, spec.n_layers)
    cands = _offloadable(cands, training)
    try:
        p = plan(spec, cands, precision=training.as_precision() if job else training.precision,
                 rates=rates, comm=comm, device_memory_bytes=memory_bytes, notes=notes,
                 training=training, device=dev, topology=topo, job_options=options,
                 uncertainty=band, uncertainty_source=band_source)
    except ValueError as e:
        fail(str(e))
    if job and dev is not None and p.rows and all(r.fits is False for r in p.rows):
        p.fit_changes = fit_advice(min(r.peak_memory_bytes for r in p.rows),
                                   _fit_tries(spec, training, ask, knobs, style,
                                              memory_bytes))
    _print(p, as_json, detail, top)


def _check_flags(training, given, *, devices, bandwidth_gbps, latency_us, peak_tflops,
                 tp_overlap, dp_overlap, micro_batch_size) -> None:
    """Refuse (exit 2, one line) flags that contradict each other: the runner's machine
    flags in a GPU job's plan, a GPU job's flags (and overlap switches) in the runner's, and
    --micro-batch-size beside --microbatches; returns nothing when they agree. ``given``
    says whether a flag was on the command line."""
    if training.framework != "runner":
        for flag, value in (("--devices", devices), ("--bandwidth-gbps", bandwidth_gbps),
                            ("--latency-us", latency_us), ("--peak-tflops", peak_tflops)):
            if value is not None:
                fail(f"{flag} is the runner's; a --framework {training.framework} plan takes "
                     f"--device, --gpus-per-node, --intra-gbps and --inter-gbps")
    else:
        for flag in ("gpus_per_node", "intra_gbps", "inter_gbps", "intra_latency_us",
                     "inter_latency_us", "style", "device_file", "bf16_tflops", "fp8_tflops",
                     "memory_tbps", "gemm_efficiency", "fp8_ops", "fp8_params",
                     "optimizer_states", "overlap", "fsdp_prefetch", "allocator_reserve",
                     "capacity_factor", "fp8_recipe", "fused", "ep_dispatcher",
                     "moe_routing"):
            if given(flag):
                shown = {"fused": "fused-kernels/--eager-kernels"}.get(
                    flag, flag.replace("_", "-"))
                fail(f"--{shown} describes a GPU job; give --framework "
                     f"megatron, deepspeed or torch (or --style) to plan one")
        if tp_overlap or not dp_overlap:
            fail("--tp-overlap / --no-dp-overlap describe a GPU job; the runner's overlap is "
                 "its own (give --framework megatron, deepspeed or torch)")
    if micro_batch_size is not None and given("microbatches"):
        fail("--micro-batch-size and --microbatches both set the microbatches; give one")


def _runner_rates(tflops, peak_tflops, devices, device, bandwidth_gbps, latency_us,
                  base_comm, notes: list[str]) -> tuple[Rates, CommModel, list[str]]:
    """The runner's (rates, communication model, notes) before any calibration: the
    assumed or given rates, with a --baseline table (``base_comm``) in place of the assumed
    communication and its note; the notes are ``notes`` and the assumptions'."""
    rates, comm, runner_notes = assumed_rates(tflops, peak_tflops, devices, device,
                                              bandwidth_gbps, latency_us)
    notes = notes + runner_notes
    if base_comm is not None:
        comm = base_comm
        notes = [n for n in notes if not n.startswith("communication")]
    return rates, comm, notes


@dataclasses.dataclass(frozen=True)
class _Calibration:
    """The plan's inputs after ``--from`` runs calibrated the runner's planner."""
    spec: ModelSpec
    world: int
    global_batch: int
    dims: str
    rates: Rates
    comm: CommModel
    notes: list[str]


def _calibrated(from_runs, given, spec, world, global_batch, dims, rates, base_comm,
                notes) -> _Calibration:
    """The runner's plan calibrated on the ``--from`` runs, as a ``_Calibration``: their
    measured rates, communication and notes (after ``notes``), the first run's model
    (unless one was named; a note says the costs carry over to it), its world and global
    batch where not given, and every dimension the runs used added to ``dims``. A flag the
    calibration measures, or a run it cannot read, ends the command (exit 2)."""
    # imported only with --from (pandas, 0.4 s; as plan_inputs._calibrated_device does)
    from meshscope.layouts.ranked import CompareError, calibrated_planner, measured
    _, traces = split_from(from_runs)
    if traces:
        fail(f"--from {traces[0]}: a trace file calibrates a GPU job's GEMMs; give the model "
             f"(--model-json) and a GPU --framework (megatron, deepspeed, torch), or a run "
             f"folder of the runner")
    for flag in ("tflops", "devices", "bandwidth_gbps", "latency_us"):
        if given(flag):
            fail(f"--{flag.replace('_', '-')} with --from: the calibration measures it; "
                 f"drop one of the two")
    try:
        runs = [measured(pathlib.Path(r)) for r in from_runs]
        _, cal = calibrated_planner([pathlib.Path(r) for r in from_runs], rates, base_comm)
    except CompareError as e:
        fail(str(e))
    first = runs[0]
    if spec is None:
        spec = first.spec
    else:
        notes = notes + [f"calibrated on {first.spec.name} "
                         f"({first.spec.n_params() / 1e6:,.1f} M parameters) and applied to "
                         f"{spec.name} ({spec.n_params() / 1e6:,.1f} M): the per-layer, "
                         f"per-parameter and per-byte costs carry over; collectives larger "
                         f"than the run's are extrapolated along its measured sizes"]
    if not given("global_batch"):
        global_batch = first.candidate.global_batch
    used = {d for r in runs for d in PARALLEL_DIMS if r.candidate.layout.size(d) > 1}
    notes = [n for n in notes if not n.startswith("CPU")] + cal.notes
    notes.append(f"calibrated from {', '.join(r.name for r in runs)}")
    return _Calibration(
        spec=spec, world=world or first.candidate.layout.world_size,
        global_batch=global_batch,
        dims=",".join(sorted(set(csv_values(dims)) | used, key=PARALLEL_DIMS.index)),
        rates=cal.rates, comm=cal.comm, notes=notes)


def _layout_check(spec, micro_batch_size):
    """The check every candidate must pass, as a function of a candidate returning why it
    is refused, or None: tp must divide the model's key/value heads and, with
    ``micro_batch_size``, each microbatch must be that many sequences."""
    def check(c):
        tp = c.layout.size("tp")
        if spec.kv_heads % tp:
            return f"tp={tp} does not divide the model's {spec.kv_heads} key/value heads"
        if micro_batch_size and c.microbatches * micro_batch_size * c.layout.size("dp") \
                != c.global_batch:
            return f"not {micro_batch_size} sequences a microbatch"
        return None
    return check


def _microbatch_choices(microbatches, micro_batch_size, global_batch) -> tuple:
    """The microbatch counts to try: --microbatches', or with ``micro_batch_size`` every
    divisor of the global batch's sequences over it (one for each dp); a size that does
    not divide the global batch ends the command (exit 2)."""
    mb_choices = csv_values(microbatches, int)
    if micro_batch_size:
        if micro_batch_size < 1 or global_batch % micro_batch_size:
            fail(f"--micro-batch-size {micro_batch_size}: must divide the global batch "
                 f"{global_batch}")
        per = global_batch // micro_batch_size
        mb_choices = tuple(per // d for d in range(1, per + 1) if per % d == 0)
    return mb_choices


def _layout_microbatches(texts, global_batch, micro_batch_size):
    """Each explicit layout of ``texts`` with its microbatches, global batch / (its dp ×
    ``micro_batch_size``), yielded one at a time (so that a layout's refusal comes after
    those of the layouts before it); raises ``ChoiceError`` for a layout that does not
    parse or whose dp × size does not divide the global batch."""
    for text in texts:
        try:
            dp = parse_layout(text).size("dp")
        except LayoutError as e:
            raise ChoiceError(f"--layouts {text!r}: {e}") from None
        if global_batch % (dp * micro_batch_size):
            raise ChoiceError(f"--layouts {text}: global batch {global_batch} is not "
                              f"divisible by dp={dp} × {micro_batch_size} sequences")
        yield text, global_batch // (dp * micro_batch_size)


def _candidates(job, world, spec, *, dims, schedules, microbatches, micro_batch_size,
                dp_modes, global_batch, no_sp, layouts, raising: bool = False) -> list:
    """The candidate layouts of ``world`` ranks that the choices allow and ``_layout_check``
    passes (``job_candidates`` for a GPU job, ``enumerate_candidates`` for the runner's),
    before the pipeline options; with --layouts and --micro-batch-size each layout's
    microbatches follow from its own dp. A refused choice ends the command (exit 2), or with
    ``raising`` raises ``ChoiceError``."""
    kv_check = _layout_check(spec, micro_batch_size)
    mb_choices = _microbatch_choices(microbatches, micro_batch_size, global_batch)

    def enumerate_for(layout_texts, mbs):
        if job:
            return job_candidates(world, spec, dims=csv_values(dims),
                                  schedules=csv_values(schedules), microbatches=mbs,
                                  dp_modes=csv_values(dp_modes), global_batch=global_batch,
                                  sp=not no_sp, layouts=layout_texts, extra_check=kv_check)
        return enumerate_candidates(world, spec.as_config(), dims=csv_values(dims),
                                    schedules=csv_values(schedules), microbatches=mbs,
                                    dp_modes=csv_values(dp_modes), global_batch=global_batch,
                                    sp=not no_sp, layouts=layout_texts,
                                    runner_only=False, extra_check=kv_check)

    try:
        if micro_batch_size and layouts_of(layouts):
            # an explicit layout's microbatches follow from its own dp
            cands = []
            for text, mb in _layout_microbatches(layouts_of(layouts), global_batch,
                                                 micro_batch_size):
                cands += enumerate_for((text,), (mb,))
        else:
            cands = enumerate_for(layouts_of(layouts), mb_choices)
    except ChoiceError as e:
        if raising:
            raise
        fail(str(e))
    return cands


# Rows a searched plan prints without --top; layouts listed (marked) when none fits.
SHOWN = 20
SHOWN_NO_FIT = 5


@dataclasses.dataclass(frozen=True)
class _Ask:
    """The layout choices as given on the command line (None: not given, searched)."""
    world: int
    dims: str | None
    schedules: str | None
    microbatches: str
    micro_batch_size: int | None
    dp_modes: str | None
    global_batch: int
    no_sp: bool
    layouts: str | None
    virtual_stages: int | None
    stage_layers: str | None
    recompute: str | None


def _search_bases(spec, ask: _Ask, knobs: Knobs, raising: bool = False) -> list:
    """One candidate per layout, schedule, virtual stages and microbatch count (every count
    that divides the global batch when the micro-batch size is searched) with the pinned
    knobs' values: what ``search`` varies."""
    def of(layouts, counts, mbs, raising):
        return _candidates(True, ask.world, spec,
                           dims=ask.dims or ",".join(searched_dims(spec)),
                           schedules=ask.schedules or ",".join(SEARCHED_SCHEDULES),
                           microbatches=counts, micro_batch_size=mbs,
                           dp_modes="ddp" if knobs.dp_mode else ask.dp_modes,
                           global_batch=ask.global_batch, no_sp=ask.no_sp, layouts=layouts,
                           raising=raising)

    if not knobs.micro_batch:
        cands = of(ask.layouts, ask.microbatches, ask.micro_batch_size, raising)
    elif ask.layouts:           # each layout at every micro-batch size it can take
        cands = []
        for text in layouts_of(ask.layouts):
            mine = []
            for size in divisors(ask.global_batch):
                try:
                    mine += of(text, "1", size, True)
                except ChoiceError:
                    continue
            if not mine:        # none: the layout's own refusal, at one sequence
                mine = of(text, "1", 1, raising)
            cands += mine
    else:
        cands = of(None, ",".join(map(str, divisors(ask.global_batch))), None, raising)
    if ask.dims is None:      # context parallelism where a rank keeps enough tokens
        cands = [c for c in cands if c.layout.size("cp") == 1
                 or spec.seq_len // c.layout.size("cp") >= MIN_CP_TOKENS]
    if ask.virtual_stages is None:
        widened = []
        for c in cands:
            if c.pp > 1 and SCHEDULES[c.schedule].fixed_virtual is None:
                widened += [dataclasses.replace(c, virtual=v) for v in SEARCHED_VIRTUAL
                            if c.pp * v <= spec.n_layers]
            else:
                widened.append(c)
        cands = widened
    return apply_pipeline_options(cands, ask.virtual_stages, ask.stage_layers, spec.n_layers)


def _search_modes(training, style, ask: _Ask, knobs: Knobs) -> tuple[tuple, tuple]:
    """(data-parallel modes, recomputations) the search tries: the style's, or as given."""
    modes = STYLE_DP_MODES[style] if knobs.dp_mode else tuple(csv_values(ask.dp_modes))
    if training.offload == "all":
        modes = tuple(m for m in modes if m in ("fsdp", "fsdp_noreshard")) or \
            (("fsdp",) if knobs.dp_mode else ())
        if not modes:
            fail("--offload all moves the weights to the host, which needs --dp-modes fsdp")
    rcs = FSDP_RECOMPUTE if training.job_style == "fsdp" else SEARCHED_RECOMPUTE
    return modes, (rcs if knobs.recompute else (ask.recompute or training.recompute,))


def _searched_plan(spec, training, dev, topo, ask: _Ask, memory_bytes, options, notes,
                   band, band_source, style, knobs: Knobs, keep: int):
    """The plan of a GPU job whose unpinned knobs are searched (``layouts.plan.search``):
    every variant that fits, timed and ranked; when none fits, the most frugal layouts,
    marked, and the single changes that make one fit."""
    prec = training.as_precision()
    modes, rcs = _search_modes(training, style, ask, knobs)
    try:
        found = search(spec, _search_bases(spec, ask, knobs), training, memory_bytes, knobs,
                       modes, rcs)
    except ValueError as e:
        fail(str(e))
    searched = tuple(name for name, on in (("micro-batch size", knobs.micro_batch),
                                           ("recompute", knobs.recompute),
                                           ("dp mode", knobs.dp_mode)) if on)
    notes = notes + [f"searched {found.layouts} layouts ({len(found.fitting)} variants fit; "
                     f"{found.memory_checked} memory estimates)"]
    def time_one(c):
        return plan_one(spec, c, precision=prec, device_memory_bytes=memory_bytes,
                        training=training, device=dev, topology=topo, job_options=options)

    changes = []
    try:
        if found.fitting:
            rows, untimed = fastest(
                found.fitting, lambda c: step_lower_bound_us(spec, c, training, dev, options),
                time_one, keep, band or 0.0)
            if untimed:
                notes.append(f"{untimed} more variants fit, each slower than the "
                             f"{keep} shown by its compute alone (not timed)")
        else:
            rows = [time_one(c) for _, c in found.frugal[:SHOWN_NO_FIT]]
            changes = fit_advice(found.smallest_peak_bytes or 0.0,
                                 _fit_tries(spec, training, ask, knobs, style, memory_bytes))
    except ValueError as e:
        fail(str(e))
    rows, warnings = rank(rows, band)
    return Plan(model=spec, precision=prec, rates=None, comm=None, rows=rows, notes=notes,
                training=training, topology=topo, device=dev, uncertainty=band,
                uncertainty_source=band_source, warnings=warnings, searched=searched,
                fit_changes=changes, not_shown_over_memory=found.layouts_over_memory)


def _fit_tries(spec, training, ask: _Ask, knobs: Knobs, style, memory_bytes) -> list:
    """The single changes ``fit_advice`` tries, the least disruptive first: a pinned knob
    set to its most frugal value, the optimizer's states in bf16, the optimizer offloaded,
    more GPUs (2×, 4×, 8×: the first that fits), a device with more memory."""
    def run(ask2=ask, knobs2=knobs, training2=training, memory2=memory_bytes):
        def go():
            try:
                bases = _search_bases(spec, ask2, knobs2, raising=True)
            except ChoiceError:
                return None
            modes, rcs = _search_modes(training2, style, ask2, knobs2)
            return search(spec, bases, training2, memory2, knobs2, modes, rcs,
                          memory_only=True)
        return go

    r = dataclasses.replace
    tries = []
    if not knobs.recompute and ask.recompute != "full":
        tries.append(Try("--recompute", "full", run(ask2=r(ask, recompute="full")),
                         memory_bytes))
    if not knobs.dp_mode and "fsdp" not in csv_values(ask.dp_modes):
        tries.append(Try("--dp-modes", "fsdp", run(ask2=r(ask, dp_modes="fsdp")),
                         memory_bytes))
    if not knobs.micro_batch and ask.micro_batch_size != 1:
        tries.append(Try("--micro-batch-size", "1",
                         run(ask2=r(ask, micro_batch_size=1, microbatches="1")),
                         memory_bytes))
    if ask.dims is not None and not ask.layouts:
        wide = ",".join(searched_dims(spec))
        if set(csv_values(ask.dims)) != set(wide.split(",")):
            tries.append(Try("--dims", wide, run(ask2=r(ask, dims=wide)), memory_bytes))
    if training.optimizer_states == "fp32" and training.optimizer != "sgd":
        tries.append(Try("--optimizer-states", "bf16",
                         run(training2=r(training, optimizer_states="bf16")), memory_bytes))
    if training.offload == "none":
        tries.append(Try("--offload", "optimizer",
                         run(training2=r(training, offload="optimizer")), memory_bytes))
    if not ask.layouts:
        for k in (2, 4, 8):
            tries.append(Try("--world", str(ask.world * k), run(ask2=r(ask, world=ask.world * k)),
                             memory_bytes, group="world"))
    for name in ("H200", "B200"):
        bigger = lookup(name)
        if bigger is not None and bigger.memory_bytes > memory_bytes:
            tries.append(Try("--device", name, run(memory2=bigger.memory_bytes),
                             bigger.memory_bytes, group="device"))
    return tries


def _offloadable(cands, training) -> list:
    """``cands``, with --offload all only the layouts that shard their weights (fsdp); none
    of them ends the command (exit 2)."""
    if training.offload == "all" and not any(c.zero_stage == 3 for c in cands):
        fail("--offload all moves the weights to the host, which needs --dp-modes fsdp")
    if training.offload == "all":
        cands = [c for c in cands if c.zero_stage == 3]
    return cands


def _print(p, as_json, detail, top) -> None:
    """Print the plan: as JSON with every term (its warnings on stderr), or as the text
    table (every term with ``detail``); ``top`` keeps the first N layouts. Returns
    nothing."""
    if as_json:
        for w in p.warnings:
            click.echo(f"meshscope: warning: {w}", err=True)
        d = plan_to_dict(dataclasses.replace(p, rows=p.rows[:top]) if top else p)
        click.echo(json.dumps(d, indent=2))
    else:
        click.echo(render_plan(p, detail, top))


COMMANDS = (plan_cmd,)
