"""The published reference jobs (``jobs.csv``, one line per job) as the planner sees them.

Each row of ``jobs.csv`` is one training job someone published with its throughput (and,
where published, its memory per GPU): where it was published (``source``, ``ref``), the
model (``models/NAME.json``: the model's Hugging Face config.json, or its sizes in
meshscope's field names), the sequence, the device (a catalogue name, or ``file:NAME`` for
``devices/NAME.toml``), GPUs, the framework and its style, precision, tp/pp/cp/ep, virtual
stages, the data-parallel mode, global and micro batch, recomputation, further settings in
``extra`` (``key=value;…``: block, attention, overlap, schedule, fp8 recipe, link
bandwidths, MoE dispatcher and routing, model overrides), the published figure (``metric``, ``value``), ``memory_gib``,
whether the model's constants were fitted on the row (``fit``) and whether the layout is the
publisher's chosen recipe (``choice``, for the ranking check).

``job(row)`` builds the planner's inputs; ``published_tokens_per_s(row, spec)`` turns the
published figure into tokens/s per GPU with the source's own FLOP definition (``METRICS``).
"""
from __future__ import annotations

import csv
import dataclasses
import pathlib

from meshscope.layouts.plan import Candidate, ModelSpec
from meshscope.layouts.plan.devices import DeviceSpec, lookup
from meshscope.layouts.plan.job_step import JobOptions
from meshscope.layouts.plan.topology import Topology
from meshscope.layouts.plan.training import Training
from meshscope.parallel.layout import parse_layout

HERE = pathlib.Path(__file__).resolve().parent
JOBS_CSV = HERE / "jobs.csv"


@dataclasses.dataclass(frozen=True)
class Reference:
    id: str
    source: str
    ref: str
    families: tuple[str, ...]
    model: str
    seq: int
    device: str
    gpus: int
    framework: str
    style: str
    precision: str
    tp: int
    pp: int
    cp: int
    ep: int
    vp: int
    dp_mode: str
    gbs: int
    mbs: int
    recompute: str
    extra: dict
    metric: str
    value: float
    memory_gib: float | None
    fit: bool
    choice: bool
    notes: str

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)


def _extra(text: str) -> dict:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip()
    return out


def load(path: pathlib.Path = JOBS_CSV) -> list[Reference]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.append(Reference(
                id=r["id"], source=r["source"], ref=r["ref"],
                families=tuple(x for x in r["families"].split(",") if x), model=r["model"],
                seq=int(r["seq"]), device=r["device"], gpus=int(r["gpus"]),
                framework=r["framework"], style=r["style"], precision=r["precision"],
                tp=int(r["tp"]), pp=int(r["pp"]), cp=int(r["cp"]), ep=int(r["ep"]),
                vp=int(r["vp"]), dp_mode=r["dp_mode"], gbs=int(r["gbs"]), mbs=int(r["mbs"]),
                recompute=r["recompute"], extra=_extra(r["extra"]), metric=r["metric"],
                value=float(r["value"]),
                memory_gib=float(r["memory_gib"]) if r["memory_gib"] else None,
                fit=r["fit"] == "yes", choice=r["choice"] == "yes", notes=r["notes"]))
    return rows


def device_of(name: str) -> DeviceSpec:
    if name.startswith("file:"):
        return DeviceSpec.from_toml(HERE / "devices" / f"{name[5:]}.toml")
    dev = lookup(name)
    if dev is None:
        raise ValueError(f"device {name!r} is not in the catalogue")
    return dev


def spec_of(row: Reference) -> ModelSpec:
    spec = ModelSpec.from_json(HERE / "models" / f"{row.model}.json", seq_len=row.seq)
    changes = {k: int(row.extra[k]) for k in ("position_embeddings", "mtp_layers")
               if k in row.extra}
    return dataclasses.replace(spec, **changes) if changes else spec


def training_of(row: Reference) -> Training:
    x = row.extra
    overlap = tuple((d, float(v)) for d, _, v in (p.partition("=") for p in
                                                 x["overlap"].split(",")) ) \
        if "overlap" in x else ()
    fp32 = {"0": False, "1": True}.get(x.get("fp32_grads"))
    kw = {}
    if "compile" in x:
        kw["fused"] = x["compile"] == "1"
    if "fp8_ops" in x:
        kw["fp8_ops"] = tuple(x["fp8_ops"].split(","))
    if "states" in x:
        kw["optimizer_states"] = x["states"]
    if x.get("fp8_params") == "1":
        kw["fp8_params"] = True
    if "dispatcher" in x:
        kw["ep_dispatcher"] = x["dispatcher"]
    if "routing" in x:
        kw["moe_routing"] = x["routing"]
    return Training(framework=row.framework, style=row.style, precision=row.precision,
                    recompute=row.recompute, flash_attention=x.get("attention") != "eager",
                    block=x.get("block", "llama"), fp32_grads=fp32,
                    fp8_recipe=x.get("recipe", "delayed"), overlap=overlap, **kw)


def candidate_of(row: Reference) -> Candidate:
    sizes = {"dp": row.dp, "tp": row.tp, "pp": row.pp, "cp": row.cp, "ep": row.ep}
    layout = parse_layout(",".join(f"{d}={n}" for d, n in sizes.items() if n > 1) or "dp=1")
    schedule = row.extra.get("schedule") or ("interleaved-1f1b" if row.vp > 1 else "1f1b")
    virtual = int(row.extra.get("v", row.vp)) if row.pp > 1 and schedule != "1f1b" else None
    m = row.gbs // (row.dp * row.mbs)
    return Candidate(layout=layout, schedule=schedule, microbatches=m, dp_mode=row.dp_mode,
                     sp=row.tp > 1 and row.extra.get("sp") != "0", global_batch=row.gbs,
                     virtual=virtual)


def job(row: Reference):
    """(spec, candidate, training, device, topology, options) of a reference row."""
    dev = device_of(row.device)
    topo = Topology.for_device(dev, None,
                               inter_gbps=float(row.extra["inter_gbps"])
                               if "inter_gbps" in row.extra else None,
                               intra_gbps=float(row.extra["intra_gbps"])
                               if "intra_gbps" in row.extra else None)
    return spec_of(row), candidate_of(row), training_of(row), dev, topo, JobOptions()


def _megatron_flops_per_token(spec: ModelSpec, passes: int) -> float:
    """Narayanan et al. 2021 eq. 3 per token: passes × (24lh² + 4slh) + 6hV (a GPT block)."""
    h, L, s, V = spec.dim, spec.n_layers, spec.seq_len, spec.vocab_size
    return passes * (24 * L * h * h + 4 * s * L * h) + 6 * h * V


def published_tokens_per_s(row: Reference, spec: ModelSpec, dev: DeviceSpec) -> float:
    """The published figure as tokens/s per GPU (``METRICS`` names each definition)."""
    v = row.value
    if row.metric == "tokens_per_s_gpu":
        return v
    if row.metric == "tflops_gpu_hw_megatron":
        return v * 1e12 / _megatron_flops_per_token(spec, 4 if row.recompute == "full" else 3)
    if row.metric == "mfu_megatron":
        return v / 100 * dev.peak_bf16 / _megatron_flops_per_token(spec, 3)
    if row.metric == "tflops_gpu_model":
        return v * 1e12 / spec.flops_per_token()
    if row.metric == "tflops_gpu_nanogpt":
        return v * 1e12 / (6 * spec.n_params() + 12 * spec.n_layers * spec.dim * spec.seq_len)
    if row.metric == "gpu_hours_per_trillion_tokens":
        return 1e12 / (v * 3600)
    raise ValueError(f"{row.id}: unknown metric {row.metric!r}")


METRICS = {
    "tokens_per_s_gpu": "tokens a second per GPU, as published",
    "tflops_gpu_hw_megatron": "TFLOP/s per GPU with Megatron's eq. 3 (recomputation "
                              "counted): 96lh² + 16slh + 6hV a token",
    "mfu_megatron": "model FLOPs utilization of the A100's 312 TFLOP/s with 72lh² + 12slh + "
                    "6hV a token",
    "tflops_gpu_model": "TFLOP/s per GPU with 6N + 12Lhs a token (assumed definition)",
    "tflops_gpu_nanogpt": "TFLOP/s per GPU with 6 × all parameters + 12Lhs a token",
    "gpu_hours_per_trillion_tokens": "GPU hours per 10¹² tokens",
}
