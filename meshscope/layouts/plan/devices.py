"""The device catalogue: what one accelerator can do, every value with its source.

A ``DeviceSpec`` holds a device's dense peak FLOP/s per precision (vendors' data sheets, no
sparsity), its memory and memory bandwidth (the data sheet's, and the achieved one where a
published STREAM-style measurement exists), a **GEMM efficiency curve** per precision, the
efficiency of flash attention, and its two link levels (in a node, between nodes).

**GEMM curves.** A matrix product of M × K by K × N runs at η(I) of the precision's peak, with
I = M·N·K / (M·N + N·K + M·K) — the product's arithmetic intensity in elements (FLOPs over
2·elements moved), n/3 for an n³ product — and a fixed cost t₀ per product::

    t = 2·M·N·K / (peak · η(I)) + t₀,     η(I) = η_max · I / (I + I½)

η_max, I½ and t₀ are fitted (least squares on the relative error of TFLOP/s) to published GEMM
sweeps where one exists (their square products and the skinny ones that fix I½); otherwise the
values say which device's curve they borrow. A sweep measures a lone
kernel; a training step runs slower than that (clocks under sustained power, kernels of other
streams beside it) — ``job_compute.TRAINING_DERATE`` is that factor, fitted once on named
published rows (docs/layouts.md). ``plan --from GPU_RUN`` and ``--gemm-efficiency`` rescale a
curve through a measured rate.

Custom devices: ``DeviceSpec.from_toml`` (``plan --device-file FILE.toml``: any field, or
``base = "H100"`` and the fields that differ) and the plan's flags (``--bf16-tflops``,
``--fp8-tflops``, ``--device-memory-gb``, ``--memory-tbps``, ``--intra-gbps``,
``--inter-gbps``); each value then says it came from there.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class GemmCurve:
    """η(I) = η_max · I / (I + I½), and a fixed t₀ per product (µs)."""
    eta_max: float
    half_intensity: float
    t0_us: float
    source: str

    def efficiency(self, intensity: float) -> float:
        if intensity <= 0:
            return 0.0
        return self.eta_max * intensity / (intensity + self.half_intensity)

    def time_us(self, m: float, n: float, k: float, peak_flops: float,
                derate: float = 1.0) -> float:
        """One M × N × K product at ``peak_flops`` × η(I) × ``derate``, plus t₀."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        flops = 2.0 * m * n * k
        eta = self.efficiency(intensity(m, n, k)) * derate
        return flops / (peak_flops * eta) * 1e6 + self.t0_us

    def scaled(self, factor: float, source: str) -> "GemmCurve":
        return dataclasses.replace(self, eta_max=self.eta_max * factor, source=source)


def intensity(m: float, n: float, k: float) -> float:
    """M·N·K / (M·N + N·K + M·K): FLOPs per element moved, halved."""
    return m * n * k / (m * n + n * k + m * k)


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_flops: dict            # precision (bf16, fp8, fp32) -> dense FLOP/s
    memory_bytes: float
    memory_bytes_s: float       # the data sheet's HBM bandwidth
    memory_achieved_bytes_s: float   # what a copy kernel reaches (STREAM-style)
    curves: dict                # precision -> GemmCurve
    attention_efficiency: float # flash attention (forward and backward) of the bf16 peak
    intra_gbps: float           # bus bandwidth in a node (nccl-tests busbw), GB/s
    inter_gbps: float           # between nodes, per GPU
    intra_us: float = 8.0
    inter_us: float = 15.0
    gpus_per_node: int = 8
    sources: dict = dataclasses.field(default_factory=dict)   # field -> where it came from

    @property
    def peak_bf16(self) -> float:
        return self.peak_flops["bf16"]

    def supports(self, precision: str) -> bool:
        return precision in self.peak_flops

    def curve(self, precision: str) -> GemmCurve:
        return self.curves.get(precision) or self.curves["bf16"]

    def source(self, field: str) -> str:
        return self.sources.get(field, "catalogue")

    def values(self) -> list[tuple[str, str, str]]:
        """(field, value, source) of every value — what ``plan --detail`` prints."""
        out = []
        for p, f in sorted(self.peak_flops.items()):
            out.append((f"peak {p}", f"{f / 1e12:g} TFLOP/s", self.source(f"peak_{p}")))
        out += [("memory", f"{self.memory_bytes / GIB:.0f} GiB", self.source("memory")),
                ("memory bandwidth", f"{self.memory_bytes_s / 1e12:g} TB/s (achieved "
                 f"{self.memory_achieved_bytes_s / 1e12:g})", self.source("memory_bw"))]
        for p, c in sorted(self.curves.items()):
            out.append((f"GEMM curve {p}", f"η_max {c.eta_max:.3f}, I½ {c.half_intensity:g}, "
                        f"t₀ {c.t0_us:g} µs", c.source))
        out += [("flash attention", f"{self.attention_efficiency:.2f} of the bf16 peak",
                 self.source("attention")),
                ("in a node", f"{self.intra_gbps:g} GB/s busbw, {self.intra_us:g} µs",
                 self.source("intra")),
                ("between nodes", f"{self.inter_gbps:g} GB/s busbw per GPU, "
                 f"{self.inter_us:g} µs", self.source("inter"))]
        return out

    def with_values(self, source: str, **changes) -> "DeviceSpec":
        """This device with some values replaced (a flag, a TOML file), each recorded as
        coming from ``source``."""
        sources = dict(self.sources)
        peaks, curves = dict(self.peak_flops), dict(self.curves)
        fields = {}
        for key, value in changes.items():
            if value is None:
                continue
            if key.startswith("peak_"):
                peaks[key[5:]] = value
                sources[key] = source
                if key[5:] not in curves:
                    curves[key[5:]] = curves["bf16"]
            elif key == "gemm_efficiency":
                curves = {p: c.scaled(value / c.efficiency(8192 / 3),
                                      f"{source}: η = {value:g} at 8192-sized products")
                          for p, c in curves.items()}
            elif key == "clock_fraction":
                # a power or clock limit slows every tensor-core kernel alike — the GEMMs and
                # flash attention — but not the memory-bound ones (HBM keeps its clock)
                note = f"{source}: × {value:g} (the clock it sustains)"
                curves = {p: c.scaled(value, f"{c.source}; {note}") for p, c in curves.items()}
                fields["attention_efficiency"] = fields.get(
                    "attention_efficiency", self.attention_efficiency) * value
                sources["attention"] = f"{sources.get('attention', 'catalogue')}; {note}"
            else:
                fields[key] = value
                sources[{"memory_bytes": "memory", "memory_bytes_s": "memory_bw",
                         "memory_achieved_bytes_s": "memory_bw",
                         "attention_efficiency": "attention", "intra_gbps": "intra",
                         "intra_us": "intra", "inter_gbps": "inter", "inter_us": "inter",
                         "gpus_per_node": "gpus_per_node", "name": "name"}.get(key, key)] = source
        if "memory_bytes_s" in fields and "memory_achieved_bytes_s" not in fields:
            ratio = self.memory_achieved_bytes_s / self.memory_bytes_s
            fields["memory_achieved_bytes_s"] = fields["memory_bytes_s"] * ratio
        return dataclasses.replace(self, peak_flops=peaks, curves=curves, sources=sources,
                                   **fields)

    @classmethod
    def from_toml(cls, path: pathlib.Path) -> "DeviceSpec":
        """A custom device from a small TOML file (``DeviceError`` naming the field)::

            name = "H100 at 500 W"
            base = "H100"            # start from a catalogue device (optional)
            bf16_tflops = 800
            fp8_tflops = 1600
            memory_gb = 96           # GiB
            memory_tbps = 2.4
            intra_gbps = 360
            inter_gbps = 45
            clock_fraction = 0.8     # a power limit: every tensor-core rate × 0.8

        ``gemm_efficiency`` rescales the GEMM curves alone (η at 8192-sized products);
        ``clock_fraction`` the GEMM curves and flash attention together, as a power or clock
        limit does (memory-bound kernels keep the memory bandwidth given).
        """
        import tomllib
        path = pathlib.Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise DeviceError(f"{path}: not a readable TOML device description ({e})") \
                from None
        known = {"name", "base", "bf16_tflops", "fp8_tflops", "fp32_tflops", "memory_gb",
                 "memory_tbps", "intra_gbps", "inter_gbps", "intra_latency_us",
                 "inter_latency_us", "gpus_per_node", "gemm_efficiency",
                 "attention_efficiency", "clock_fraction"}
        for key, value in data.items():
            if key not in known:
                raise DeviceError(f"{path}: field {key}: not a device field (known: "
                                  f"{', '.join(sorted(known))})")
            if key not in ("name", "base") and (
                    not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value) or value <= 0):
                raise DeviceError(f"{path}: field {key}: expected a positive number, got "
                                  f"{value!r}")
        if "base" in data:
            base = lookup(str(data["base"]))
            if base is None:
                raise DeviceError(f"{path}: field base: {data['base']!r} is not in the "
                                  f"catalogue ({', '.join(CATALOGUE)})")
        else:
            missing = [k for k in ("bf16_tflops", "memory_gb", "memory_tbps") if k not in data]
            if missing:
                raise DeviceError(f"{path}: field {missing[0]}: needed without a base device")
            base = CUSTOM_BASE
        return base.with_values(
            str(path), name=str(data.get("name", base.name if "base" in data else path.stem)),
            **_values_of(data))


class DeviceError(ValueError):
    """A device description that cannot be used; the message names the field."""


def _values_of(d: dict) -> dict:
    """Catalogue field values from the TOML / flag spellings (units in the names)."""
    out = {}
    for key, scale, field in (("bf16_tflops", 1e12, "peak_bf16"), ("fp8_tflops", 1e12,
                                                                    "peak_fp8"),
                              ("fp32_tflops", 1e12, "peak_fp32"),
                              ("memory_gb", GIB, "memory_bytes"),
                              ("memory_tbps", 1e12, "memory_bytes_s"),
                              ("intra_gbps", 1, "intra_gbps"), ("inter_gbps", 1, "inter_gbps"),
                              ("intra_latency_us", 1, "intra_us"),
                              ("inter_latency_us", 1, "inter_us"),
                              ("gpus_per_node", 1, "gpus_per_node"),
                              ("gemm_efficiency", 1, "gemm_efficiency"),
                              ("attention_efficiency", 1, "attention_efficiency"),
                              ("clock_fraction", 1, "clock_fraction")):
        if d.get(key) is not None:
            out[field] = d[key] * scale if scale != 1 else d[key]
    if "gpus_per_node" in out:
        out["gpus_per_node"] = int(out["gpus_per_node"])
    return out


# -- the catalogue ---------------------------------------------------------------------------

_AZURE = ("Azure AI-benchmarking-guide (github.com/Azure/AI-benchmarking-guide, "
          "Azure_Results/{}): its {} cuBLASLt/hipBLASLt products, 1024³ to 32768³ and three "
          "non-square, fitted jointly")
_H100_BF16 = GemmCurve(0.856, 170, 8.0, "torch.matmul bf16 on an H100 80GB HBM3 "
                       "(github.com/zzc0721/torch-performance-test-data issue 79): η_max on "
                       "4096³–8192³, t₀ on 1024³; I½ from the H100's FP8 sweep (square sizes "
                       "alone do not fix it)")
_H100_FP8 = GemmCurve(0.722, 170, 5.5, _AZURE.format("ND_H100_v5_results.md", "FP8"))
_H200_FP8 = GemmCurve(0.710, 140, 5.5, _AZURE.format("ND_H200_v5_results.md", "FP8"))
_A100_FP16 = GemmCurve(0.830, 100, 8.5, _AZURE.format("ND_A100_v4_results.md", "FP16"))
_MI300X_FP8 = GemmCurve(0.450, 110, 34.5, _AZURE.format("ND_MI300X_v5_results.md", "FP8"))
# No B200 sweep is public; the GB200's GPU is the same Blackwell die at a higher power limit
# (its FP8 peak 5 PFLOP/s against the B200's 4.5). Its sweep fitted as a fraction of the
# GB200's own peak, applied to the B200's: the same share of each part's data-sheet rate.
_B200_FP8 = GemmCurve(0.624, 145, 3.0, _AZURE.format("ND_GB200_v6_results.md", "FP8")
                      + ", as a fraction of the GB200's 5 PFLOP/s FP8 peak (the B200's own: "
                      "no public sweep)")

_NV = "NVIDIA data sheet"
_AMD = "AMD data sheet"
_LINKS = ("vendor link rate derated to a typical nccl-tests busbw (assumed); measured: "
          "--intra-gbps/--inter-gbps or --baseline")


def _dev(name, bf16, fp8, mem_gib, bw, achieved, curves, attn, intra, inter, sheet, *,
         achieved_src, attn_src, fp32=None, gpus=8, extra_sources=None):
    peaks = {"bf16": bf16 * 1e12}
    if fp8:
        peaks["fp8"] = fp8 * 1e12
    if fp32:
        peaks["fp32"] = fp32 * 1e12
    sources = {f"peak_{p}": sheet for p in peaks}
    sources.update(memory=sheet, memory_bw=f"{sheet}; achieved: {achieved_src}",
                   attention=attn_src, intra=_LINKS, inter=_LINKS)
    sources.update(extra_sources or {})
    return DeviceSpec(name=name, peak_flops=peaks, memory_bytes=mem_gib * GIB,
                      memory_bytes_s=bw * 1e12, memory_achieved_bytes_s=achieved * 1e12,
                      curves=curves, attention_efficiency=attn, intra_gbps=intra,
                      inter_gbps=inter, gpus_per_node=gpus, sources=sources)


_FA2_H100 = "FlashAttention-2, head dim 128, seq 8192: 327.9 TFLOP/s on H100 (Azure guide)"
_FA2_A100 = "FlashAttention-2, head dim 64, seq 8192: 179.5 TFLOP/s on A100 (Azure guide)"
_FA2_MI300X = "FlashAttention-2, head dim 64, seq 8192: 328.6 TFLOP/s on MI300X (Azure guide)"
_STREAM = "Azure guide's HBM copy test"

CATALOGUE: dict[str, DeviceSpec] = {
    "H100-SXM": _dev("H100-SXM", 989.4, 1978.9, 80, 3.35, 2.90,
                     {"bf16": _H100_BF16, "fp8": _H100_FP8}, 0.33, 360, 45, _NV,
                     achieved_src=_STREAM, attn_src=_FA2_H100, fp32=494.7),
    "H100-PCIe": _dev("H100-PCIe", 756.0, 1513.0, 80, 2.0, 2.0 * 0.87,
                      {"bf16": _H100_BF16, "fp8": _H100_FP8}, 0.33, 50, 25, _NV,
                      achieved_src="the SXM part's 87% of the data sheet (assumed)",
                      attn_src=_FA2_H100 + " (the SXM's, assumed)", fp32=378.0,
                      extra_sources={"intra": "PCIe Gen5 x16 (no NVSwitch), assumed busbw"}),
    "H800": _dev("H800", 989.4, 1978.9, 80, 3.35, 2.90,
                 {"bf16": _H100_BF16, "fp8": _H100_FP8}, 0.33, 160, 40, _NV,
                 achieved_src=_STREAM + " (the H100's)", attn_src=_FA2_H100,
                 fp32=494.7, extra_sources={
                     "intra": "NVLink 400 GB/s bidirectional (the H100's 900 cut for export), "
                              "derated to a busbw (assumed)",
                     "inter": "DeepSeek-V3 report §3.1: 8 × 400 Gb/s InfiniBand per node"}),
    "H200": _dev("H200", 989.4, 1978.9, 141 * 1e9 / GIB, 4.8, 4.00,
                 {"bf16": _H100_BF16, "fp8": _H200_FP8}, 0.33, 360, 45, _NV,
                 achieved_src=_STREAM, attn_src="FlashAttention-2 on H200: 329.3 TFLOP/s "
                 "(Azure guide)", fp32=494.7),
    "B200": _dev("B200", 2250.0, 4500.0, 180 * 1e9 / GIB, 8.0, 8.0 * 0.85,
                 {"bf16": dataclasses.replace(_H100_BF16, source="no public B200 or GB200 bf16 "
                                              "GEMM sweep found: the H100's curve (assumed)"),
                  "fp8": _B200_FP8},
                 0.33, 720, 45, _NV, achieved_src="85% of the data sheet (assumed)",
                 attn_src="the H100's FlashAttention-2 fraction (assumed)", fp32=1100.0),
    "A100-80GB": _dev("A100-80GB", 312.0, None, 80, 2.039, 1.61, {"bf16": _A100_FP16},
                      0.575, 230, 22, _NV, achieved_src=_STREAM, attn_src=_FA2_A100,
                      fp32=156.0),
    "A100-40GB": _dev("A100-40GB", 312.0, None, 40, 1.555, 1.555 * 0.79,
                      {"bf16": _A100_FP16}, 0.575, 230, 22, _NV,
                      achieved_src="the 80GB part's 79% of the data sheet (assumed)",
                      attn_src=_FA2_A100, fp32=156.0),
    "MI300X": _dev("MI300X", 1307.4, 2614.9, 192, 5.3, 4.11,
                   {"bf16": dataclasses.replace(_MI300X_FP8, source="no public MI300X bf16 "
                                                "sweep found: its FP8 curve (assumed)"),
                    "fp8": _MI300X_FP8}, 0.25, 300, 45, _AMD, achieved_src=_STREAM,
                   attn_src=_FA2_MI300X, fp32=653.7,
                   extra_sources={"intra": "RCCL all-reduce busbw 316.8 GB/s at 8 GB on 8 "
                                           "MI300X (Azure guide), rounded down"}),
    "MI250": _dev("MI250", 181.0, None, 64, 1.6, 1.6 * 0.8,
                  {"bf16": dataclasses.replace(_A100_FP16, source="no public MI250 GEMM sweep "
                                               "found: the A100's curve (assumed)")},
                  0.4, 100, 22, _AMD + " (one GCD, as frameworks see it: a module holds two)",
                  achieved_src="80% of the data sheet (assumed)",
                  attn_src="assumed (no public flash-attention figure found)", fp32=45.3),
}

ALIASES = {"H100": "H100-SXM", "H100 SXM": "H100-SXM", "H100 PCIE": "H100-PCIe",
           "A100": "A100-80GB", "A100 80GB": "A100-80GB", "A100 40GB": "A100-40GB",
           "MI250X": "MI250", "MI300": "MI300X"}

# The starting point of a device described from scratch (its curves: the H100's shape).
CUSTOM_BASE = dataclasses.replace(
    CATALOGUE["H100-SXM"], name="custom", sources={
        k: "custom device: the H100's value (not given)" for k in
        ("peak_bf16", "peak_fp8", "peak_fp32", "memory", "memory_bw", "attention", "intra",
         "inter")})


def lookup(name: str | None) -> DeviceSpec | None:
    """A catalogue device by name: exact (any case), an alias, or the first name contained in
    ``name`` (a driver's "NVIDIA H100 80GB HBM3"), PCIe and 40GB parts recognised."""
    if not name:
        return None
    upper = name.upper().replace("_", " ")
    for key, dev in CATALOGUE.items():
        if upper == key.upper():
            return dev
    if upper in ALIASES:
        return CATALOGUE[ALIASES[upper]]
    compact = upper.replace("-", " ")
    if "H100" in compact:
        return CATALOGUE["H100-PCIe" if "PCIE" in compact else "H100-SXM"]
    if "A100" in compact:
        return CATALOGUE["A100-40GB" if "40GB" in compact.replace(" ", "") else "A100-80GB"]
    for key in ("H800", "H200", "B200", "MI300X", "MI250"):
        if key in compact.replace(" ", ""):
            return CATALOGUE[key]
    return None
