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
