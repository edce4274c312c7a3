"""What ``meshscope plan`` takes from its flags, as the planner's records: the model
(``model_spec``: a preset or a model file), the training setup (``training_setup``: framework,
precision, optimizer, recomputation, overlap…), the device and topology of a GPU job
(``job_setup``: the catalogue, a TOML file or flags, calibrated on a measured GPU run with
``--from``), and the pipeline options applied to every candidate layout
(``apply_pipeline_options``). Each refuses what it cannot honour with a one-line error (exit 2).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from meshscope.collectors.run_json import read_run_info
from meshscope.layouts.plan import CommModel, ModelSpec, SpecError
from meshscope.layouts.plan.cost import rank_flops
from meshscope.layouts.plan.devices import CATALOGUE, CUSTOM_BASE, DeviceError, DeviceSpec, \
    intensity, lookup
from meshscope.layouts.plan.job_step import scale_device
from meshscope.layouts.plan.trace_gemms import TraceError, gemm_rate_factor, read_trace
from meshscope.layouts.plan.model_file import MODEL_TYPES
from meshscope.layouts.plan.topology import Topology
from meshscope.layouts.plan.training import ALLOCATOR_RESERVE, DEFAULT_FP8_OPS, Training, \
    TrainingError
from meshscope.parallel.config import PRESETS
from meshscope.parallel.layout import LayoutError
from meshscope.theory.schedules import SCHEDULES

from .common import fail
from .layout_choices import csv_values


def split_from(from_runs) -> tuple[list[str], list[str]]:
    """``--from`` values as (run folders, trace files): a file is anyone's Kineto trace (it
    calibrates a GPU job's GEMMs), anything else a run of the runner."""
    traces = [r for r in from_runs if pathlib.Path(r).is_file()]
    return [r for r in from_runs if r not in traces], traces


def model_spec(model, model_json, seq_len, overrides, notes, block=None):
    """The model: ``--model-json`` (a Hugging Face config.json or meshscope's fields) or a
    preset with ``overrides``; ``--block gpt`` makes its MLP a plain two-matrix one."""
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


def training_setup(framework, style, precision, optimizer, recompute, attention, block,
                   offload, fp32_grads, model_json, from_runs, fp8_ops, fp8_recipe, fp8_params,
                   optimizer_states, overlap, fsdp_prefetch, allocator_reserve,
                   capacity_factor, fused=None, ep_dispatcher="alltoall", moe_routing="model"):
    """The training setup (``layouts.plan.training.Training``). Without ``--framework``: the
    style's (fsdp → torch, deepspeed → deepspeed, else megatron), else Megatron for a model
    file planned without ``--from`` and the runner otherwise; the precision defaults to mixed
    (fp32 for the runner)."""
    if framework is None:
        if style:
            framework = {"fsdp": "torch", "deepspeed": "deepspeed"}.get(style, "megatron")
        else:
            runs, _ = split_from(from_runs)
            framework = "megatron" if model_json and not runs else "runner"
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


def job_setup(training, device, device_file, device_flags, tflops, gpus_per_node,
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
    if run.is_file():
        return _trace_calibrated_device(run, dev, notes), None, 1, 0.0
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


def _trace_calibrated_device(path: pathlib.Path, dev: DeviceSpec | None,
                             notes: list[str]) -> DeviceSpec:
    """The device with its GEMM curves scaled through the achieved rate of the 16-bit GEMMs
    in anyone's Kineto trace (``plan --from TRACE``, ``layouts.plan.trace_gemms``); the notes
    say which term was replaced and by what, and what was measured but has no term."""
    try:
        t = read_trace(path)
    except TraceError as e:
        fail(str(e))
    traced = lookup(t.device_name)
    if dev is not None and traced is not None and traced.name != dev.name:
        fail(f"--from {path}: the trace ran on {t.device_name}, the plan is for {dev.name}; "
             f"a GEMM rate does not carry across devices (drop --device or give a trace "
             f"of {dev.name})")
    base = dev or traced
    if base is None:
        fail(f"--from {path}: the trace's device ({t.device_name or 'not recorded'}) is not "
             f"in the device catalogue; name it with --device")
    try:
        factor, measured_eta, expected_eta = gemm_rate_factor(t, base)
    except TraceError as e:
        fail(str(e))
    curves = {p: c.scaled(factor, f"{c.source}; × {factor:.3f} through the GEMMs of "
                                  f"{path.name}") for p, c in base.curves.items()}
    notes.append(f"replaced from {path.name} ({t.device_name or base.name}): the GEMM rate — "
                 f"every GEMM curve × {factor:.3f}: its {t.gemm_calls} 16-bit GEMMs ran at "
                 f"{t.gemm_flops / (t.gemm_kernel_us * 1e-6) / 1e12:.0f} TFLOP/s (η "
                 f"{measured_eta:.3f} of the bf16 peak) where the curve expects η "
                 f"{expected_eta:.3f} at their shapes; the training derate still applies")
    if t.launches:
        notes.append(f"measured in {path.name}, not used: {t.launch_host_us:.1f} µs of host "
                     f"time a kernel launch ({t.launches} launches) — the planner has no "
                     f"host-launch term yet, so a MoE job's range stays")
    return dataclasses.replace(base, curves=curves)


def apply_pipeline_options(cands, virtual_stages, stage_layers, n_layers):
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
