"""Agreement between the ranks of a job without a collective.

The collectors sometimes need every rank to wait for the others, or to share one value, at a
moment that is not the training's. A collective (``dist.barrier``, ``broadcast_object_list``)
would do it, but it would also become part of what is measured: it enters the profiler trace,
the Flight Recorder and the sequence numbers of the default group (which hang diagnosis
compares across ranks), and on NCCL it creates the default group's communicator in a job that
may never use it. These helpers go through the key-value store the job's ranks met at
(``init_process_group``'s rendezvous store) instead.

Every rank must make the same calls in the same order: the n-th meeting of a process uses the
same keys as the n-th meeting of every other rank.
"""
from __future__ import annotations

import itertools

import torch.distributed as dist

_meetings = itertools.count()


def _store():
    """The job's store, or None without torch.distributed or with a single rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.distributed_c10d._get_default_store()


def meet_all_ranks() -> None:
    """Return once every rank of the job has called this (its n-th call meets their n-th)."""
    store = _store()
    if store is None:
        return
    key = f"meshscope/meeting{next(_meetings)}"
    if store.add(f"{key}/arrived", 1) == dist.get_world_size():
        store.set(f"{key}/all", "1")
    store.wait([f"{key}/all"])


def shared_value(name: str, mine: str, *, publisher: bool) -> str:
    """The ``mine`` of the one rank that calls this with ``publisher`` true, on every rank
    (the others wait for it to publish). With several launchers (``--nnodes``) the process
    ranks are handed out in the order the launchers joined the rendezvous, so "node 0's
    value" is not rank 0's: the publisher is the first local rank of the launcher given
    ``--node-rank 0``."""
    store = _store()
    if store is None:
        return mine
    key = f"meshscope/value/{name}"
    if publisher:
        store.set(key, mine)
    return store.get(key).decode()
