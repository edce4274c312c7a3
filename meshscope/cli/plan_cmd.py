"""``meshscope plan``: memory, traffic and step time of every layout, predicted before running.

A model (a preset, or a Hugging Face ``config.json``), a training setup (framework, precision,
optimizer, recomputation…), a device and a topology go in; ``layouts.plan`` predicts each
layout's terms, optionally calibrated on measured runs (``--from``). ``meshscope sweep`` runs
the layouts instead (``sweep_cmd.py``), ``meshscope compare`` ranks runs (``compare_cmd.py``).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import click

from meshscope.collectors.run_info import read_run_info
from meshscope.layouts.plan import CommModel, ModelSpec, SpecError, plan
from meshscope.layouts.plan.cost import rank_flops
from meshscope.layouts.plan.devices import CATALOGUE, CUSTOM_BASE, DeviceError, DeviceSpec, \
    intensity, lookup
from meshscope.layouts.plan.enumerate import ChoiceError, enumerate_candidates
from meshscope.layouts.plan.job_candidates import job_candidates
from meshscope.layouts.plan.job_step import JobOptions, scale_device, uncertainty_of
from meshscope.layouts.plan.model_file import MODEL_TYPES
from meshscope.layouts.plan.render import render_plan
from meshscope.layouts.plan.serial import plan_to_dict
from meshscope.layouts.plan.topology import Topology
from meshscope.layouts.plan.training import ALLOCATOR_RESERVE, DEFAULT_FP8_OPS, Training, \
    TrainingError
from meshscope.parallel.config import PRESETS
from meshscope.parallel.layout import LayoutError, parse_layout
from meshscope.theory.schedules import SCHEDULES
from meshscope.vocabulary import PARALLEL_DIMS

from .common import fail
from .layout_choices import assumed_rates, baseline_model, choice_options, csv_values, \
    layouts_of, model_overrides


def _spec(model, model_json, seq_len, overrides, notes, block=None):
    try:
        if model_json:
            spec = ModelSpec.from_json(pathlib.Path(model_json), seq_len=seq_len, notes=notes)
        else:
            if model not in PRESETS:
                fail(f"--model {model!r}: unknown preset (known: {', '.join(PRESETS)}); a "
                     f"config.json goes to --model-json")
            spec = ModelSpec.from_config(dataclasses.replace(PRESETS[model], **dict(overrides)),
                                         name=model)
            if seq_len:
                spec = dataclasses.replace(spec, seq_len=seq_len)
        if block == "gpt" and spec.gated_mlp:
            if model_json and _declares_gated(model_json):
                fail(f"--block gpt (a plain two-matrix GeLU MLP) contradicts {model_json}, "
                     f"whose MLP is gated (SwiGLU); drop one of the two")
            spec = dataclasses.replace(spec, gated_mlp=False)
    except SpecError as e:
        fail(str(e))
    return spec


def _declares_gated(model_json) -> bool:
    """Whether the JSON says its MLP is gated (a gated model_type or "mlp": "gated")."""
    data = json.loads(pathlib.Path(model_json).read_text())
    return data.get("mlp") == "gated" or \
        MODEL_TYPES.get(data.get("model_type"), {}).get("gated", False)


def _overlaps(text: str | None) -> tuple:
    """``tp=0.5,dp=1`` → (("tp", 0.5), ("dp", 1.0))."""
    out = []
    for part in csv_values(text):
        dim, sep, value = part.partition("=")
        try:
            out.append((dim.strip(), float(value)))
        except ValueError:
            fail(f"--overlap {part!r}: expected DIM=FRACTION (e.g. tp=0.5,dp=1)")
        if not sep:
            fail(f"--overlap {part!r}: expected DIM=FRACTION (e.g. tp=0.5,dp=1)")
    return tuple(out)


def _training(framework, style, precision, optimizer, recompute, attention, block, offload,
              fp32_grads, model_json, from_runs, fp8_ops, fp8_recipe, fp8_params,
              optimizer_states, overlap, fsdp_prefetch, allocator_reserve, capacity_factor,
              fused=None, ep_dispatcher="alltoall", moe_routing="model"):
    if framework is None:
        if style:
            framework = {"fsdp": "torch", "deepspeed": "deepspeed"}.get(style, "megatron")
        else:
            framework = "megatron" if model_json and not from_runs else "runner"
    if precision is None:
        precision = "fp32" if framework == "runner" else "mixed"
    try:
        return Training(framework=framework, style=style, precision=precision,
                        optimizer=optimizer, recompute=recompute,
                        flash_attention=attention == "flash", offload=offload,
                        fp32_grads=fp32_grads, block=block,
                        fp8_ops=csv_values(fp8_ops) if fp8_ops else DEFAULT_FP8_OPS,
                        fp8_recipe=fp8_recipe, fp8_params=fp8_params,
                        optimizer_states=optimizer_states, overlap=_overlaps(overlap),
                        fsdp_prefetch=fsdp_prefetch,
                        allocator_reserve=ALLOCATOR_RESERVE if allocator_reserve is None
                        else allocator_reserve, capacity_factor=capacity_factor,
                        fused=fused, ep_dispatcher=ep_dispatcher, moe_routing=moe_routing)
    except TrainingError as e:
        fail(str(e))


def _device(device, device_file, flags, notes):
    """The catalogue device, a TOML file's, or one from flags alone — each flag a value
    that says it came from there."""
    try:
        if device_file:
            dev = DeviceSpec.from_toml(pathlib.Path(device_file))
        elif device:
            dev = lookup(device)
            if dev is None:
                fail(f"--device {device!r}: not in the catalogue ({', '.join(CATALOGUE)}); "
                     f"describe it with --device-file FILE.toml or --bf16-tflops, "
                     f"--device-memory-gb and --memory-tbps")
        elif flags.get("bf16_tflops"):
            missing = [f for f in ("device_memory_gb", "memory_tbps") if not flags.get(f)]
            if missing:
                fail(f"a custom device from flags needs --{missing[0].replace('_', '-')} too "
                     f"(or --device NAME / --device-file FILE.toml)")
            dev = CUSTOM_BASE.with_values("flags", name="custom")
        else:
            return None
    except DeviceError as e:
        fail(str(e))
    values = {}
    for flag, key, scale in (("bf16_tflops", "peak_bf16", 1e12), ("fp8_tflops", "peak_fp8", 1e12),
                             ("device_memory_gb", "memory_bytes", 2 ** 30),
                             ("memory_tbps", "memory_bytes_s", 1e12),
                             ("gemm_efficiency", "gemm_efficiency", 1)):
        if flags.get(flag) is not None:
            if flags[flag] <= 0:
                fail(f"--{flag.replace('_', '-')} {flags[flag]:g}: expected a positive number")
            values[key] = flags[flag] * scale
    for key, value in values.items():
        flag = {"peak_bf16": "--bf16-tflops", "peak_fp8": "--fp8-tflops",
                "memory_bytes": "--device-memory-gb", "memory_bytes_s": "--memory-tbps",
                "gemm_efficiency": "--gemm-efficiency"}[key]
        dev = dev.with_values(flag, **{key: value})
    return dev


def _job_setup(training, device, device_file, device_flags, tflops, gpus_per_node,
               intra_gbps, inter_gbps, intra_latency_us, inter_latency_us, base_comm,
               from_runs, notes):
    """The device (catalogue values, overridden by flags) and the topology of a GPU job."""
    flags = dict(device_flags)
    dev = _device(device, device_file, flags, notes)
    if tflops:
        if dev is None:
            fail("--tflops with a GPU framework needs --device (its peak and memory bandwidth)")
        dev = dev.with_values("--tflops", gemm_efficiency=tflops * 1e12 / dev.peak_bf16)
        notes.append(f"compute: GEMMs at about the given {tflops:g} TFLOP/s (the device's "
                     f"curves scaled through it)")
    measured_comm, overhead_us = None, 0.0
    if from_runs:
        dev, measured_comm, run_world, overhead_us = _calibrated_device(from_runs, dev,
                                                                        training, notes)
    if dev is not None and training.precision == "fp8" and not dev.supports("fp8"):
        fail(f"--precision fp8: {dev.name} has no fp8 tensor cores (give --fp8-tflops for a "
             f"custom device)")
    topo = Topology.for_device(dev, gpus_per_node, intra_gbps=intra_gbps,
                               inter_gbps=inter_gbps, intra_us=intra_latency_us,
                               inter_us=inter_latency_us)
    if measured_comm is not None and measured_comm.table:
        level = "intra" if run_world <= topo.gpus_per_node else "inter"
        fallback = getattr(topo, level)
        measured_comm.alpha_us, measured_comm.busbw_gbps = fallback.alpha_us, \
            fallback.busbw_gbps
        setattr(topo, level, measured_comm)
        notes.append(f"{'in a node' if level == 'intra' else 'between nodes'}: the "
                     f"collectives measured in {from_runs[0]} ({measured_comm.describe()})")
    if base_comm is not None:
        topo.inter = base_comm
        notes.append("between nodes: the --baseline table (in a node: the link defaults or "
                     "--intra-gbps)")
    notes.append(f"topology: {topo.describe()}")
    if dev is None:
        notes.append("no --device: memory and traffic only (give --device for step times)")
    return dev, topo, overhead_us


def _calibrated_device(from_runs, dev, training, notes):
    """The device's GEMM and attention rates scaled through a measured GPU run's achieved
    rate (``plan --from GPU_RUN``)."""
    # Here, not above: reading measured runs imports pandas (0.4 s), which a plan without
    # ``--from`` never needs.
    from meshscope.layouts.ranked import CompareError, measured

    run = pathlib.Path(from_runs[0])
    if len(from_runs) > 1:
        fail("--from with a GPU framework takes one GPU run (its achieved GEMM rate)")
    try:
        info = read_run_info(run)
        m = measured(run)
    except (CompareError, OSError, ValueError) as e:
        fail(f"{run}: {e}")
    if info.device.type != "cuda" or not info.device.name:
        fail(f"{run} ran on {info.device.type}: its compute rate says nothing about a GPU "
             f"job; calibrate a --framework megatron/deepspeed/torch plan from a GPU run, or "
             f"plan it uncalibrated with --device")
    base = dev or lookup(info.device.name)
    if base is None:
        fail(f"{run}: device {info.device.name!r} is not in the device catalogue")
    cand = m.candidate
    r = max(m.compute_us, key=m.compute_us.get)
    busy_s = max(1e-9, (m.compute_us[r] - m.optimizer_us) / 1e6)
    eta = rank_flops(m.spec, cand, cand.layout.coordinates(r)["pp"]) / busy_s / base.peak_bf16
    tokens = cand.global_batch // cand.layout.size("dp") // cand.microbatches * m.spec.seq_len
    width = m.spec.dim / cand.layout.size("tp")
    expected = base.curve("bf16").efficiency(intensity(tokens, width, m.spec.dim))
    dev = scale_device(base, eta / expected,
                       f"scaled through {run.name}'s measured η = {eta:.3f} (the curve "
                       f"expects {expected:.3f} at its GEMMs)")
    notes.append(f"calibrated from {run} ({info.device.name}): GEMM and attention rates "
                 f"× {eta / expected:.3f}")
    comm = CommModel.from_rows(m.transfers, source=f"measured in {run.name}")
    # what the run's step spent outside compute, exposed communication and the bubble (data
    # loading, logging, host work): a fixed cost per step, carried over as it is
    overhead = max(0.0, m.step_time_us - m.compute_us[r] - sum(m.exposed_comm_us.values())
                   - (m.bubble_fraction or 0.0) * m.step_time_us)
    notes.append(f"a fixed {overhead / 1e3:.1f} ms a step of overhead measured in {run.name}")
    return dev, comm, cand.layout.world_size, overhead


def _apply_pipeline_options(cands, virtual_stages, stage_layers, n_layers):
    """``--virtual-stages`` and ``--stage-layers`` on every pipelined candidate."""
    counts = csv_values(stage_layers, int) if stage_layers else None
    out, took_v = [], False
    for c in cands:
        if c.pp == 1:
            out.append(c)
            continue
        if virtual_stages is not None and SCHEDULES[c.schedule].fixed_virtual is None:
            try:
                c = dataclasses.replace(c, virtual=virtual_stages)
                c.v
            except LayoutError as e:
                fail(str(e))
            if c.n_stages > n_layers:
                continue
            took_v = True
        if counts:
            if len(counts) != c.n_stages:
                continue
            if sum(counts) != n_layers or min(counts) < 1:
                fail(f"--stage-layers {stage_layers}: {len(counts)} stages of "
                     f"{sum(counts)} layers, the model has {n_layers}")
            c = dataclasses.replace(c, stage_layer_counts=tuple(counts))
        out.append(c)
    if counts and not any(c.pp > 1 for c in out):
        fail(f"--stage-layers {stage_layers}: no pipelined layout has {len(counts)} stages")
    if virtual_stages is not None and not took_v and any(c.pp > 1 for c in cands):
        fail(f"--virtual-stages {virtual_stages}: no pipelined layout takes it (the schedules "
             f"asked for run a fixed number of stages a rank, or the model has too few "
             f"layers); add --schedules interleaved-1f1b")
    return out


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
    training = _training(framework, style, precision, optimizer, recompute, attention, block,
                         offload, fp32_grads, model_json, from_runs, fp8_ops, fp8_recipe,
                         fp8_params, optimizer_states, overlap, fsdp_prefetch,
                         allocator_reserve, capacity_factor, fused, ep_dispatcher,
                         moe_routing)
    job = training.framework != "runner"
    if job:
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
    base_comm = baseline_model(baseline)
    notes: list[str] = []
    explicit_model = model_json or given("model") or any(
        given(x) for x in ("layers", "moe_experts", "moe_top_k", "moe_every"))
    spec = _spec(model, model_json, seq_len, model_overrides(layers, moe_experts, moe_top_k,
                                                        moe_every), notes,
                 block if job else None) if explicit_model or not from_runs else None
    rates = comm = None
    dev = topo = None
    overhead_us = 0.0
    if job:
        dev, topo, overhead_us = _job_setup(
            training, device, device_file,
            {"bf16_tflops": bf16_tflops, "fp8_tflops": fp8_tflops,
             "device_memory_gb": device_memory_gb, "memory_tbps": memory_tbps,
             "gemm_efficiency": gemm_efficiency}, tflops, gpus_per_node, intra_gbps,
            inter_gbps, intra_latency_us, inter_latency_us, base_comm, from_runs, notes)
        if from_runs and spec is None:
            fail("--from with a GPU framework calibrates the device; name the model to plan "
                 "with --model-json (or --model)")
    else:
        rates, comm, runner_notes = assumed_rates(tflops, peak_tflops, devices, device,
                                                   bandwidth_gbps, latency_us)
        notes += runner_notes
        if base_comm is not None:
            comm = base_comm
            notes = [n for n in notes if not n.startswith("communication")]
    if from_runs and not job:
        # imported only with --from (pandas, 0.4 s; see _calibrated_device)
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
            notes.append(f"calibrated on {first.spec.name} ({first.spec.n_params() / 1e6:,.1f} "
                         f"M parameters) and applied to {spec.name} "
                         f"({spec.n_params() / 1e6:,.1f} M): the per-layer, per-parameter and "
                         f"per-byte costs carry over; collectives larger than the run's are "
                         f"extrapolated along its measured sizes")
        world = world or first.candidate.layout.world_size
        if not given("global_batch"):
            global_batch = first.candidate.global_batch
        used = {d for r in runs for d in PARALLEL_DIMS if r.candidate.layout.size(d) > 1}
        dims = ",".join(sorted(set(csv_values(dims)) | used, key=PARALLEL_DIMS.index))
        rates, comm = cal.rates, cal.comm
        notes = [n for n in notes if n.startswith("CPU") is False] + cal.notes
        notes.append(f"calibrated from {', '.join(r.name for r in runs)}")
    if world is None:
        fail("plan needs --world N (or --from RUN)")

    def kv_check(c):
        tp = c.layout.size("tp")
        if spec.kv_heads % tp:
            return f"tp={tp} does not divide the model's {spec.kv_heads} key/value heads"
        if micro_batch_size and c.microbatches * micro_batch_size * c.layout.size("dp") \
                != c.global_batch:
            return f"not {micro_batch_size} sequences a microbatch"
        return None

    mb_choices = csv_values(microbatches, int)
    if micro_batch_size:
        if micro_batch_size < 1 or global_batch % micro_batch_size:
            fail(f"--micro-batch-size {micro_batch_size}: must divide the global batch "
                 f"{global_batch}")
        per = global_batch // micro_batch_size
        mb_choices = tuple(per // d for d in range(1, per + 1) if per % d == 0)

    def enumerate_for(layout_texts, mbs):
        if job:
            return job_candidates(world, spec, dims=csv_values(dims),
                                  schedules=csv_values(schedules), microbatches=mbs, dp_modes=csv_values(dp_modes),
                                  global_batch=global_batch, sp=not no_sp,
                                  layouts=layout_texts, extra_check=kv_check)
        return enumerate_candidates(world, spec.as_config(), dims=csv_values(dims),
                                    schedules=csv_values(schedules), microbatches=mbs,
                                    dp_modes=csv_values(dp_modes), global_batch=global_batch,
                                    sp=not no_sp, layouts=layout_texts,
                                    runner_only=False, extra_check=kv_check)

    try:
        if micro_batch_size and layouts_of(layouts):
            # an explicit layout's microbatches follow from its own dp
            cands = []
            for text in layouts_of(layouts):
                try:
                    dp = parse_layout(text).size("dp")
                except LayoutError as e:
                    raise ChoiceError(f"--layouts {text!r}: {e}") from None
                if global_batch % (dp * micro_batch_size):
                    raise ChoiceError(f"--layouts {text}: global batch {global_batch} is not "
                                     f"divisible by dp={dp} × {micro_batch_size} sequences")
                cands += enumerate_for((text,), (global_batch // (dp * micro_batch_size),))
        else:
            cands = enumerate_for(layouts_of(layouts), mb_choices)
    except ChoiceError as e:
        fail(str(e))
    cands = _apply_pipeline_options(cands, virtual_stages, stage_layers, spec.n_layers)
    if training.offload == "all" and not any(c.zero_stage == 3 for c in cands):
        fail("--offload all moves the weights to the host, which needs --dp-modes fsdp")
    if training.offload == "all":
        cands = [c for c in cands if c.zero_stage == 3]
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
