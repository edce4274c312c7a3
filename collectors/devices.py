"""Peak dense throughput and memory bandwidth of common accelerators, keyed by device name.

Values are the vendors' published dense (no sparsity) BF16 tensor-core peaks and HBM
bandwidths: NVIDIA A100 SXM (312 TFLOP/s, 2.0 TB/s for 80 GB), H100 SXM (989 TFLOP/s,
3.35 TB/s), H200 (989 TFLOP/s, 4.8 TB/s), B200 (2.25 PFLOP/s, 8 TB/s); AMD MI300X (1307
TFLOP/s, 5.3 TB/s). A name matches the first entry whose key it contains (case-insensitive).
"""
from __future__ import annotations

# key: (peak bf16 FLOP/s, memory bandwidth bytes/s)
DEVICES: dict[str, tuple[float, float]] = {
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
    "A100": (312e12, 2.0e12),
    "B200": (2250e12, 8.0e12),
    "MI300X": (1307e12, 5.3e12),
}


def lookup(name: str) -> tuple[float, float] | None:
    upper = (name or "").upper()
    for key, value in DEVICES.items():
        if key in upper:
            return value
    return None


# key: (dense FLOP/s of a float32 matrix multiplication, dense FP16/BF16 tensor-core FLOP/s),
# from the vendors' data sheets. For float32 the TF32 tensor-core peak where the device has one
# (A100 156, H100/H200 495, B200 1100, MI300X 653.7 TFLOP/s): PyTorch runs float32 matmuls in
# TF32 when allowed (the default before 1.12; ``torch.backends.cuda.matmul.allow_tf32``), and
# a trace does not say whether it was, so the upper bound keeps every efficiency at most 1.
# Without TF32: V100 15.7, MI250X 95.7, MI250 90.5 (FP32 matrix). FP16/BF16: V100 125, A100
# 312, H100/H200 989, B200 2250, MI250X 383, MI250 362, MI300X 1307.
PEAKS_BY_TYPE: dict[str, tuple[float, float]] = {
    "H200": (495e12, 989e12), "H100": (495e12, 989e12), "A100": (156e12, 312e12),
    "B200": (1100e12, 2250e12), "V100": (15.7e12, 125e12), "MI300X": (653.7e12, 1307e12),
    "MI250X": (95.7e12, 383e12), "MI250": (90.5e12, 362e12),
}
_HALF = ("half", "bfloat16", "float16", "c10::half", "c10::bfloat16")
_SINGLE = ("float", "float32")


def peak_flops(name: str | None, dtype: str | None) -> float | None:
    """The device's dense peak FLOP/s for matrix multiplications in ``dtype`` (a trace's
    ``Input type``: ``float``, ``c10::Half``, ``c10::BFloat16``…); None when the device or the
    type is not known."""
    upper = (name or "").upper()
    t = (dtype or "").lower()
    for key, (single, half) in PEAKS_BY_TYPE.items():
        if key in upper:
            if t in _HALF:
                return half
            if t in _SINGLE:
                return single
            return None
    return None
