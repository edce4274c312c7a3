"""A step's time in the categories of the former TensorBoard profiler plugin (torch-tb-profiler).

The plugin's "Step Time Breakdown" splits each step window into what was happening at each
instant, the first category that holds winning:

================ ==================================================================
column           time in which…
================ ==================================================================
kernel_us        a compute kernel runs (on any stream)
memcpy_us        else a memcpy runs
memset_us        else a memset runs
communication_us else a communication kernel runs
runtime_us       else the host is in a runtime or driver call (any thread)
dataloader_us    else the host is in the data loader (``enumerate(DataLoader)#…__next__``)
cpu_exec_us      else the host runs an operator, Python or a user range (not the step range)
other_us         else: nothing traced
================ ==================================================================

They add up to the step window (``window_us``, the device-side window of
``step_windows.device_step_windows``, which is the plugin's own definition of a step on a GPU).
Those are the plugin's categories for every GPU trace, PyTorch 1.8's included; the plugin's own
parser (``torch_tb_profiler``) is the reference the tests hold this table against.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.gpu import host_activity as ha
from meshscope.analysis.ingest import classify
from meshscope.analysis import intervals as iv

CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader",
              "cpu_exec", "other")
COLUMNS = ["rank", "step", "window_us"] + [f"{c}_us" for c in CATEGORIES]
_HOST_WORK_CATS = ("cpu_op", "python_function", "user_annotation")


def role_sets(events: pd.DataFrame) -> dict[str, np.ndarray]:
    """category → interval set over the whole trace (before the priority is applied). Reads
    the event table's columns as arrays, without copying its rows; names are matched once
    per distinct name."""
    ts, end = events["ts_us"].to_numpy(), events["end_us"].to_numpy()
    device = events["device"].to_numpy()
    cat = events["cat"]
    kind = events["kind"].to_numpy()
    codes, names = pd.factorize(events["name"])
    dl = np.array([bool(ha.DATALOADER_RE.search(n)) for n in names] + [False])[codes]
    step = np.array([bool(ha.STEP_RANGE_RE.match(n)) for n in names] + [False])[codes]

    def u(mask):
        return iv.union(ts[mask], end[mask])

    is_cat = {c: (cat == c).to_numpy() for c in ("kernel", "gpu_memcpy", "gpu_memset")}
    return {
        "kernel": u(device & is_cat["kernel"] & (kind == classify.COMPUTE)),
        "memcpy": u(device & is_cat["gpu_memcpy"]),
        "memset": u(device & is_cat["gpu_memset"]),
        "communication": u(device & (kind == classify.COMMUNICATION)),
        "runtime": u(~device & cat.isin(ha.RUNTIME_CATS).to_numpy()),
        "dataloader": u(~device & dl),
        "cpu_exec": u(~device & cat.isin(_HOST_WORK_CATS).to_numpy() & ~dl & ~step),
    }


def step_rows(rank: int, steps: dict[int, tuple[float, float]],
              roles: dict[str, np.ndarray]) -> list[dict]:
    """One row per step (``COLUMNS``): the window split by the categories' priority."""
    rows = []
    for step, (start, end) in sorted(steps.items()):
        rest = np.array([[start, end]], dtype=np.float64)
        row = {"rank": rank, "step": step, "window_us": end - start}
        for cat in CATEGORIES[:-1]:
            part = iv.intersect(rest, roles.get(cat, iv.EMPTY))
            row[f"{cat}_us"] = iv.length(part)
            rest = iv.subtract(rest, part)
        row["other_us"] = iv.length(rest)
        rows.append(row)
    return rows
