"""What each trace event is: compute, communication, memory, annotation or other.

Device events (GPU kernels, memcpy, memset) are classified by name: a kernel is communication
when it is an NCCL/RCCL kernel of any generation (``ncclKernel_*``, ``ncclDevKernel_*``,
``ncclSymDevKernel_*``, ``ncclDevKernel_Generic``), one of the communication kernels other
libraries launch (``OTHER_COMM_KERNELS``: DeepEP's expert dispatch / combine / notify kernels,
NVSHMEM, PyTorch's symmetric-memory all-reduce — ``multimem_all_reduce``, one-shot and
two-shot —, vLLM's custom all-reduce), or matches a user pattern (``--comm-kernel-regex``);
else compute. ``comm_kernel_op`` and ``comm_kernel_dim`` say what such a kernel does and the
parallel dimension it most likely serves (DeepEP: expert parallelism; the all-reduce kernels:
tensor parallelism), for kernels whose host call does not say.
Host events matter on CPU-only runs, where the threads are the lanes: ``gloo:*`` ranges (on the
gloo worker threads for asynchronous collectives, on the calling thread for send/recv) and the
``c10d::*`` / ``_c10d_functional::*`` / ``record_param_comms`` calls that enqueue or wait for
them are communication;
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
# (pattern, op, likely dimension) of communication kernels that are not NCCL's.
OTHER_COMM_KERNELS: tuple[tuple[re.Pattern, str, str | None], ...] = (
    (re.compile(r"deep_?ep.*(dispatch|combine)|(intranode|internode)::(dispatch|combine)",
                re.IGNORECASE), "all_to_all", "ep"),
    (re.compile(r"deep_?ep.*notify|notify_dispatch|notify_combine", re.IGNORECASE),
     "all_to_all", "ep"),
    (re.compile(r"multimem_(all_)?reduce|one_shot_all_reduce|two_shot_all_reduce|"
                r"multimem_all_gather|symm_mem", re.IGNORECASE), "all_reduce", "tp"),
    (re.compile(r"cross_device_reduce_(1|2)stage|custom_?all_?reduce", re.IGNORECASE),
     "all_reduce", "tp"),
    (re.compile(r"nvshmem", re.IGNORECASE), "send_recv", None),
)
# ``_c10d_functional::`` ops are the functional collectives DTensor issues (all_gather_into_tensor,
# reduce_scatter_tensor, and wait_tensor, where the thread blocks until the collective is done).
HOST_COMM_RE = re.compile(r"^(gloo:|c10d::|nccl:|_?c10d_functional::)|^record_param_comms$")
# Matrix-multiplication operators: ingest keeps their recorded shapes, from which the kernel
# table computes their FLOPs (``analysis/gpu/kernels.py``).
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                      "aten::linear"})
P2P_RE = re.compile(r"(^|[:_])(send|recv)|SendRecv|^ncclDevKernel_SendRecv", re.IGNORECASE)


def classify(name: str, cat: str, *, comm_kernel_re: re.Pattern | None = None) -> str:
    if cat in DEVICE_CATS:
        if cat != "kernel":
            return MEMORY
        if COMM_KERNEL_RE.search(name) or _other(name) is not None or \
                (comm_kernel_re and comm_kernel_re.search(name)):
            return COMMUNICATION
        return COMPUTE
    if HOST_COMM_RE.search(name):
        return COMMUNICATION
    if cat == "cpu_op":
        return COMPUTE
    if cat in ("user_annotation", "gpu_user_annotation"):
        return ANNOTATION
    return OTHER


def _other(name: str) -> tuple[str, str | None] | None:
    for pattern, op, dim in OTHER_COMM_KERNELS:
        if pattern.search(name):
            return op, dim
    return None


def comm_kernel_op(name: str) -> str | None:
    """The op of a non-NCCL communication kernel (``OTHER_COMM_KERNELS``), None otherwise."""
    found = _other(name)
    return found[0] if found else None


def comm_kernel_dim(name: str) -> str | None:
    """The parallel dimension a non-NCCL communication kernel most likely serves, or None."""
    found = _other(name)
    return found[1] if found else None


def is_p2p(name: str) -> bool:
    """Point-to-point transfer (send/recv), as opposed to a collective."""
    return bool(P2P_RE.search(name))
