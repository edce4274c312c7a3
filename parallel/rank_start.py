"""How the launcher starts its ranks: forked from a server that has already imported torch.

torchrun's own way is a fresh ``python -m MODULE CONFIG`` per rank. Each of those spends about
3 s importing torch and the rank program before it trains: on the project's 2-core machine a
quarter of a small run, and with 4 ranks on 2 cores twice that in wall time. Here the ranks
are forked instead from Python's *fork server* (``multiprocessing``'s ``forkserver``): one
fresh interpreter, started by ``start_server`` as the command begins, imports torch and the
rank program once, in parallel with the launcher's own imports, and forks each rank from that
state. The server never runs anything else, so each fork is of a single-threaded process that
has touched no device: CUDA, gloo and NCCL start in the rank as they would in a fresh one.
(A fork of the launcher itself is not safe: its rendezvous threads may hold a lock of glibc's
resolver at the moment of the fork, and the forked rank then waits forever in its first
``getaddrinfo`` — seen on this machine.)

``MESHSCOPE_RANK_START=exec`` starts each rank as torchrun does; ``forkserver`` (the default)
as above. Both give the same run directory: the rank program and its environment are the same
(``forked_rank``)."""
from __future__ import annotations

import os

from .layout import LayoutError

RANK_START_ENV = "MESHSCOPE_RANK_START"
METHODS = ("forkserver", "exec")

# The environment this module was imported with. In the fork server (which imports it before
# any rank exists) that is the server's environment; a rank compares its own against it to
# tell the variables torchrun set for the rank from those the server was started with.
_SERVER_ENV = dict(os.environ)
_IMPORTED_BY = os.getpid()


def rank_start_method() -> str:
    """``forkserver`` or ``exec``: what ``MESHSCOPE_RANK_START`` says, ``forkserver`` if unset."""
    method = os.environ.get(RANK_START_ENV) or "forkserver"
    if method not in METHODS:
        raise LayoutError(f"{RANK_START_ENV}={method!r}: expected one of "
                          f"{', '.join(METHODS)}")
    return method


def rank_modules(layout, dp_mode: str = "ddp") -> list[str]:
    """The modules a rank of ``layout`` imports (the rank program, and what ``parallel.build``
    imports for the dimensions it uses), for the fork server to import once. A hint only: a
    module missing here is imported by each rank, as in a fresh interpreter."""
    modules = ["meshscope.parallel.worker"]
    if layout.size("pp") > 1:
        modules.append("meshscope.parallel.pipeline")  # torch.distributed.pipelining, dynamo
    if layout.size("tp") > 1:
        modules.append("meshscope.parallel.tensor_parallel")
    if layout.size("dp") * layout.size("cp") > 1:
        modules.append("meshscope.parallel.data_parallel")
        if dp_mode == "ddp":
            modules.append("torch._dynamo")  # DistributedDataParallel.__init__ imports it
    return modules


def start_server(modules: list[str]) -> None:
    """Start the fork server now, importing ``modules`` (and this module) before it forks any
    rank. Idempotent within a process: the first call decides what the server imports. Does
    nothing with ``MESHSCOPE_RANK_START=exec`` or an invalid value (the launcher refuses that
    one before it starts anything)."""
    if os.environ.get(RANK_START_ENV, "forkserver") != "forkserver":
        return
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload([__name__, *modules])
    forkserver.ensure_running()


def forked_rank(module: str, config_path: str, launcher_env: dict[str, str]) -> None:
    """One rank, forked from the server: what ``python -m MODULE CONFIG`` does in a fresh
    interpreter. torchrun's fork wrapper has set this rank's variables (RANK, MASTER_PORT, its
    error file …) and sent its output to its log files; the rest of the environment is put
    back to the launcher's at the moment it started the ranks (``launcher_env``), as a fresh
    process would inherit it — the server was started before the launcher set, for instance,
    ``TORCH_FR_BUFFER_SIZE``. torch's thread count is then set from ``OMP_NUM_THREADS`` (the
    server's torch read it at import).

    A failure prints its traceback to the rank's stderr log and leaves with exit code 1, after
    MODULE's ``main`` has written the error file (``worker._AtomicErrorFile``): torchrun's fork
    wrapper would write it again, truncating it first, which is the race that file's atomic
    write exists to avoid."""
    import importlib
    import traceback

    if _IMPORTED_BY != os.getpid():  # imported by the server, before torchrun's variables
        rank_vars = {k for k, v in os.environ.items() if _SERVER_ENV.get(k) != v}
        for key in set(os.environ) - rank_vars - set(launcher_env):
            del os.environ[key]
        os.environ.update({k: v for k, v in launcher_env.items() if k not in rank_vars})
    else:  # a server that did not import this module first: add what is missing, only
        for key, value in launcher_env.items():
            os.environ.setdefault(key, value)

    import torch

    from .process_exit import leave_now

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        importlib.import_module(module).main(config_path)
    except BaseException:  # noqa: BLE001 - recorded by main's error handler; the exit says so
        traceback.print_exc()  # into the rank's stderr log, as an uncaught error would be
        leave_now(1)
