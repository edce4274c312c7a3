"""What each trace event is: compute, communication, memory, annotation or other.

Device events (GPU kernels, memcpy, memset) are classified by name: a kernel is communication
when it is an NCCL/RCCL kernel of any generation (``ncclKernel_*``, ``ncclDevKernel_*``,
``ncclSymDevKernel_*``, ``ncclDevKernel_Generic``) or matches a user pattern, else compute.
Host events matter on CPU-only runs, where the threads are the lanes: ``gloo:*`` ranges (on the
gloo worker threads for asynchronous collectives, on the calling thread for send/recv) and the
``c10d::*`` / ``record_param_comms`` calls that enqueue or wait for them are communication;
every other ``cpu_op`` is compute; profiler and user ranges (``ProfilerStep#N``,
``meshscope/…``) are annotations that mark time but are not work.
"""
from __future__ import annotations

import re

COMPUTE = "compute"
COMMUNICATION = "communication"
MEMORY = "memory"
ANNOTATION = "annotation"
OTHER = "other"
KINDS = (COMPUTE, COMMUNICATION, MEMORY, ANNOTATION, OTHER)

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
COMM_KERNEL_RE = re.compile(r"^(nccl|rccl)|ncclKernel|ncclDevKernel|ncclSymDevKernel")
HOST_COMM_RE = re.compile(r"^(gloo:|c10d::|nccl:)|^record_param_comms$")
P2P_RE = re.compile(r"(^|[:_])(send|recv)|SendRecv|^ncclDevKernel_SendRecv", re.IGNORECASE)


def classify(name: str, cat: str, *, comm_kernel_re: re.Pattern | None = None) -> str:
    if cat in DEVICE_CATS:
        if cat != "kernel":
            return MEMORY
        if COMM_KERNEL_RE.search(name) or (comm_kernel_re and comm_kernel_re.search(name)):
            return COMMUNICATION
        return COMPUTE
    if HOST_COMM_RE.search(name):
        return COMMUNICATION
    if cat == "cpu_op":
        return COMPUTE
    if cat in ("user_annotation", "gpu_user_annotation"):
        return ANNOTATION
    return OTHER


def is_p2p(name: str) -> bool:
    """Point-to-point transfer (send/recv), as opposed to a collective."""
    return bool(P2P_RE.search(name))
