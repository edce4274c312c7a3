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
from meshscope.layouts.plan.serial import plan_to_dict
from meshscope.parallel.layout import LayoutError, parse_layout
from meshscope.vocabulary import PARALLEL_DIMS

from .common import fail
from .layout_choices import assumed_rates, baseline_model, choice_options, csv_values, \
    layouts_of, model_overrides
from .plan_inputs import apply_pipeline_options, job_setup, model_spec, training_setup


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
                   "(dp × this), instead of --microbatches.")
@click.option("--dp-modes", default="ddp", show_default=True,
              help="ddp, zero1, zero2, fsdp (comma-separated; zero1 = the distributed "
                   "optimizer, planning only).")
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
              default="none", show_default=True,
              help="Activation recomputation (op: torchtitan's op-level selective).")
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
@click.option("--from", "from_runs", multiple=True, type=click.Path(file_okay=False),
              help="Calibrate from this measured run (repeatable); without --model or "
                   "--model-json predicts the run's own model.")
@click.option("--top", type=int, default=None, help="Print the first N layouts.")
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
    training = training_setup(framework, style, precision, optimizer, recompute, attention,
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
    cands = _candidates(job, world, spec, dims=dims, schedules=schedules,
                        microbatches=microbatches, micro_batch_size=micro_batch_size,
                        dp_modes=dp_modes, global_batch=global_batch, no_sp=no_sp,
                        layouts=layouts)
    cands = apply_pipeline_options(cands, virtual_stages, stage_layers, spec.n_layers)
    cands = _offloadable(cands, training)
    memory_bytes = dev.memory_bytes if dev is not None else (
        device_memory_gb * 2 ** 30 if device_memory_gb else None)
    band, band_source = uncertainty_of(spec, training) if dev is not None else (None, "")
    try:
        p = plan(spec, cands, precision=training.as_precision() if job else training.precision,
                 rates=rates, comm=comm, device_memory_bytes=memory_bytes, notes=notes,
                 training=training, device=dev, topology=topo,
                 job_options=JobOptions(dp_overlap=dp_overlap, tp_overlap=tp_overlap,
                                        step_overhead_us=overhead_us),
                 uncertainty=band, uncertainty_source=band_source)
    except ValueError as e:
        fail(str(e))
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
                dp_modes, global_batch, no_sp, layouts) -> list:
    """The candidate layouts of ``world`` ranks that the choices allow and ``_layout_check``
    passes (``job_candidates`` for a GPU job, ``enumerate_candidates`` for the runner's),
    before the pipeline options; with --layouts and --micro-batch-size each layout's
    microbatches follow from its own dp. A refused choice ends the command (exit 2)."""
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
        fail(str(e))
    return cands


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
        d = plan_to_dict(p)
        if top:
            d["rows"] = d["rows"][:top]
        click.echo(json.dumps(d, indent=2))
    else:
        click.echo(render_plan(p, detail, top))


COMMANDS = (plan_cmd,)
