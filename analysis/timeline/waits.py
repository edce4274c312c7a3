"""Wait regions: the stretches in which a rank could not go on because it was waiting for one
of its communication operations to complete.

On a CPU (gloo) trace the rank's program runs on its *issuing thread* (the one that runs the
``ProfilerStep`` ranges). Two kinds of stretches of that thread can be waits:

- where the innermost range is a communication range — a ``gloo:recv`` the thread waits in, a
  ``c10d::`` call that blocks;
- where no range but a runner annotation covers it, or none at all (DDP waits for its last
  all-reduce at the end of the backward inside autograd, with no operator running).

They are judged separately, each with the completions that can end it: a receive of the issuing
thread itself ends exactly when the thread goes on, so it ends only the first kind, within
``SAME_THREAD_US``; an operation run by another thread (a collective on a gloo worker) ends
only the second. On a GPU trace the device is the program: a stretch where a communication
kernel runs and no compute kernel does (an NCCL kernel spins until every rank has arrived);
idle device time is not waiting (the host did not launch work: the rank's own slowness).

A stretch [a, b] of at least ``MIN_WAIT_US`` is a **wait** when one of the rank's operations
completes at its end: within ``RESUME_US`` or ``RESUME_SHARE`` of the stretch before b (the
thread took that long to be scheduled again: 5.8 ms after a 104 ms wait, with four ranks on two
cores) or up to ``LATE_US`` (or 5% of the stretch) after b — gloo's worker thread closes its range after it
has woken the waiting thread (measured: 1.7 ms after, on this 2-core machine, for a 70 ms wait
at the end of a backward). ``until`` is that completion. A completion in the middle of a
stretch does not make it a wait: a rank that sleeps or runs Python while an operation finishes
elsewhere was not waiting for it; nor does the completion of an operation that began only
after the stretch ended (the rank woke up by itself, then called it). Each completion ends at
most one wait.

The completions are those of operations a rank can wait for: collectives and receives. A
send's ``gloo:send`` range ends when the program waits for the send's handle — on a pipeline
at the end of the step, long after the receiver took the data — so its end is no completion.

``wait_regions(...)`` returns (waits: (n, 2) interval set, until: (n,) completion times).
"""
from __future__ import annotations


import numpy as np

from meshscope.analysis import intervals as iv

MIN_WAIT_US = 20.0
RESUME_US = 2000.0
RESUME_SHARE = 0.10
LATE_US = 3000.0
SAME_THREAD_US = 50.0


def wait_regions(blocked: np.ndarray, completions: np.ndarray, *, late_us: float | None = None,
                 begun: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Waits among the stretches ``blocked`` ((n, 2), disjoint; stretches may touch — they are
    judged one by one), ended by ``completions``; ``begun``: when each of those operations began
    (a stretch can only be waiting for an operation that had begun before it ended); ``late_us``
    replaces both ``RESUME_US`` and the late window (``SAME_THREAD_US`` for the thread's own
    ranges). A completion that could end
    several stretches ends the longest (a rank that waits is blocked long; a short gap that
    happens to end near an unrelated completion is not the wait)."""
    comp = np.asarray(completions, dtype=np.float64)
    order_c = np.argsort(comp, kind="stable")
    comp = comp[order_c]
    began = (np.asarray(begun, dtype=np.float64)[order_c] if begun is not None
             else np.full(len(comp), -np.inf))
    if len(blocked):
        blocked = blocked[np.argsort(blocked[:, 0], kind="stable")]
        blocked = blocked[blocked[:, 1] - blocked[:, 0] >= MIN_WAIT_US]
    if not len(blocked) or not len(comp):
        return iv.EMPTY.copy(), np.zeros(0)
    starts, ends = blocked[:, 0], blocked[:, 1]
    length = ends - starts
    resume = np.maximum(RESUME_US, RESUME_SHARE * length) if late_us is None else \
        np.full(len(length), late_us)
    late = np.maximum(LATE_US, 0.05 * length) if late_us is None else np.full(len(length),
                                                                               late_us)
    order = np.argsort(ends)
    sorted_ends = ends[order]
    # Every (completion, stretch) pair whose end lies in the completion's window [c − the
    # largest late, c + the largest resume], in the stretches' end order — what a loop over
    # the completions would look at —, taken a bounded number of pairs at a time.
    lo = np.searchsorted(sorted_ends, comp - late.max(), side="left")
    hi = np.searchsorted(sorted_ends, comp + resume.max(), side="right")
    counts = np.maximum(hi - lo, 0)
    best_c, best_k = [], []
    for a, b in _blocks(counts, PAIRS_PER_BLOCK):
        ci, at = iv.pairs(lo[a:b], counts[a:b])
        if not ci.size:
            continue
        ci += a
        k = order[at]
        c, c0 = comp[ci], began[ci]
        ok = (ends[k] - resume[k] <= c) & (c <= ends[k] + late[k]) & \
            ~(c - starts[k] < MIN_WAIT_US) & ~(c0 >= ends[k])
        ci, at, k = ci[ok], at[ok], k[ok]
        # Per completion, the longest stretch (of equal ones, the first in end order).
        pick = np.lexsort((at, -length[k], ci))
        ci, k = ci[pick], k[pick]
        first = np.ones(ci.size, dtype=bool)
        first[1:] = ci[1:] != ci[:-1]
        best_c.append(ci[first])
        best_k.append(k[first])
    if not best_c or not sum(x.size for x in best_c):
        return iv.EMPTY.copy(), np.zeros(0)
    ci, k = np.concatenate(best_c), np.concatenate(best_k)
    # Per stretch, the completion nearest its end (of equally near ones, the first).
    pick = np.lexsort((ci, np.abs(comp[ci] - ends[k]), k))
    ci, k = ci[pick], k[pick]
    first = np.ones(k.size, dtype=bool)
    first[1:] = k[1:] != k[:-1]
    keys, until = k[first], comp[ci[first]]
    return blocked[keys].copy(), until.astype(np.float64)


# (completion, stretch) pairs looked at in one pass of ``wait_regions``.
PAIRS_PER_BLOCK = 1 << 20


def _blocks(counts: np.ndarray, most: int):
    """Consecutive ranges [a, b) of ``counts`` whose sums are at most ``most`` (or a single
    element larger than that)."""
    a, n = 0, len(counts)
    total = np.cumsum(counts)
    while a < n:
        base = total[a - 1] if a else 0
        b = int(np.searchsorted(total, base + most, side="right"))
        b = max(b, a + 1)
        yield a, min(b, n)
        a = b


def cpu_blocked(main_owned: dict, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stretches a receive of the issuing thread owns, the other stretches where no operator
    runs) within the step ``windows``; ``main_owned``: label → interval set from
    ``intervals.innermost`` with the labels ``op``, ``ann``, ``recv`` and ``comm``."""
    recv = iv.intersect(main_owned.get("recv", iv.EMPTY), windows)
    rest = iv.subtract(iv.subtract(windows, main_owned.get("op", iv.EMPTY)), recv)
    return recv, rest


def gpu_blocked(compute: np.ndarray, comm: np.ndarray) -> np.ndarray:
    """Device time in communication kernels with no compute kernel running."""
    return iv.subtract(comm, compute)
