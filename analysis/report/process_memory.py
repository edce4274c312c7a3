"""How a process that analyses allocates Arrow memory.

pyarrow's default memory pool (mimalloc, in the wheels this project installs) keeps the memory
of freed buffers for reuse instead of giving it back. The analysis makes many short-lived Arrow
buffers — each trace's event table as it is converted to pandas, the string columns that pandas
stores as Arrow, the parquet writes — and through mimalloc a process' peak grew by what those
left behind: 40 MB on the reference trace of ``bench/report_vs_hta.py`` (270 → 228 MB) and
45 MB on 512 synthetic ranks (289 → 247 MB), with the C library's allocator measured side by
side (``ARROW_DEFAULT_MEMORY_POOL=system``), for the same report.

``use_system_allocator()`` makes the C library's allocator the Arrow pool of this process and
of the worker processes it starts (they inherit the environment, or, forked, the pool). Called
before pyarrow is imported, it only sets the environment, which pyarrow reads when it starts:
a pool set after pyarrow started left the process 12 MB larger on the reference trace (the
default pool had begun). The command line calls it before it imports the analysis; the Python
API leaves its caller's process as it is (ingest alone switches pools while it builds an event
table: ``analysis.ingest.events.parse_events``). A pool the user chose with
``ARROW_DEFAULT_MEMORY_POOL`` is left alone.

``return_large_blocks()`` (called with it) makes the C library map every block of
``MMAP_THRESHOLD_BYTES`` or more on its own and unmap it when it is freed. glibc raises that
threshold by itself each time a mapped block is freed (up to 32 MB), after which the cross-rank
stage's large, short-lived arrays (the instance table's columns as it is concatenated, matched,
sorted and aligned; each table as it is written) came from the heap and, freed, stayed in the
process in pieces among what is kept: at 48 ranks of the 216k-event reference trace the
analysing process held 119 MB that ``malloc_trim`` could give back after the write (issue 51,
docs/benchmarks.md).
"""
from __future__ import annotations

import os
import sys

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
# Blocks of this size or more are mapped on their own (glibc's ``M_MMAP_THRESHOLD``; set, it
# no longer rises by itself): an array of 32k float64 values and up.
MMAP_THRESHOLD_BYTES = 256 << 10
_M_MMAP_THRESHOLD = -3              # mallopt's parameter number (glibc's malloc.h)


def use_system_allocator() -> bool:
    """Arrow allocates through the C library in this process and its children; False (and
    nothing changed) when the user named a pool of their own."""
    if os.environ.get(POOL_VARIABLE, "system") != "system":
        return False
    os.environ[POOL_VARIABLE] = "system"
    return_large_blocks()
    if "pyarrow" in sys.modules:     # else pyarrow reads the variable when it starts
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    return True


def return_large_blocks() -> bool:
    """Blocks of ``MMAP_THRESHOLD_BYTES`` or more are mapped on their own by the C library of
    this process (and of the processes it forks) and given back when freed (module
    docstring); False where the C library has no ``mallopt`` (not glibc)."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
