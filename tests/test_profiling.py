"""The profiler as the collectors set it up must not change what it measures.

The reference is torch's own profiler: with its default ``record_shapes=True`` it also records
every op's "Concrete Inputs", and the same training steps under it grow the process by about a
step's activations per profiled step (pytorch/pytorch#133444 describes the inputs as held until
the profiler stops); with ``record_shapes=False`` it records no inputs at all. The second
reference is the kernel's count of page faults: the profiled steps must not fault in fresh
pages (collectors/heap.py says why that matters).
"""
import gzip
import json
import resource
import subprocess
import sys

import pytest

from conftest import ROOT

# One process, one thread: five steps of the "balanced" model, each 8 microbatches of 4 sequences
# (forward and backward, gradients accumulated, as the runner's pipeline steps do), the last four
# profiled; prints the resident-memory growth and the minor page faults over the profiled steps
# and writes the trace. MODE "collectors" uses collectors.profiling.make_profiler and calls
# at_step_start at each step as the runner does; "no-reserve" the same profiler without
# at_step_start (so without the heap reserve); "torch-default" a plain
# torch.profiler.profile(record_shapes=True) with torch's default input recording; "no-shapes"
# the same with record_shapes=False, which records no inputs at all. All record the allocator's
# [memory] events, as make_profiler does (profile_memory, issue 33): over these four steps they
# grow a profiler's storage by about 60 MiB whatever it records of the inputs.
SCRIPT = r"""
import json, pathlib, resource, sys
import psutil, torch
from torch.profiler import ProfilerActivity, profile, schedule
from meshscope.collectors.profiling import at_step_start, make_profiler
from meshscope.parallel.model import PRESETS, build_model, lm_loss

mode, out = sys.argv[1], pathlib.Path(sys.argv[2])
torch.set_num_threads(1)
cfg = PRESETS["balanced"]
model = build_model(cfg, seed=0)
x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
if mode in ("collectors", "no-reserve"):
    prof = make_profiler(out, 0, (1, 4), torch.device("cpu"), {"test": True})
else:
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=mode == "torch-default",
                   profile_memory=True,    # as make_profiler does: only the inputs differ
                   schedule=schedule(wait=0, warmup=1, active=4, repeat=1),
                   on_trace_ready=lambda p: None)
rss, faults = [], []
with prof:
    for step in range(5):
        if mode == "collectors":
            at_step_start(prof, step, (1, 4))
        for microbatch in range(8):
            lm_loss(model(x), x).backward()
        prof.step()
        rss.append(psutil.Process().memory_info().rss)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
print(json.dumps({"growth_bytes": rss[-1] - rss[0], "faults": faults[-1] - faults[0]}))
"""


def _start_script(script: str, *args) -> subprocess.Popen:
    """Start ``script`` in a fresh one-thread process."""
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def _printed(proc: subprocess.Popen) -> dict:
    """The JSON a script started by ``_start_script`` printed last."""
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    return json.loads(stdout.strip().splitlines()[-1])


def _run_script(script: str, *args) -> dict:
    return _printed(_start_script(script, *args))


MODES = ("collectors", "no-reserve", "torch-default", "no-shapes")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """MODE → what SCRIPT printed for it. Every mode runs once per module, each in its own
    process, all at once: what they print is their own process' resident growth and page
    faults, which other processes beside them do not change (one thread each)."""
    base, results = tmp_path_factory.mktemp("profiled"), {}

    def run(mode: str) -> dict:
        if not results:
            started = {m: _start_script(SCRIPT, m, base / m) for m in MODES}
            for m, proc in started.items():
                results[m] = {**_printed(proc), "dir": base / m}
        return results[mode]
    return run


@pytest.mark.slow
def test_profiled_steps_keep_memory_flat_and_shapes(profiled):
    ours = profiled("no-reserve")["growth_bytes"]
    default = profiled("torch-default")["growth_bytes"]
    bare = profiled("no-shapes")["growth_bytes"]
    print(f"resident growth over 4 profiled steps: collectors (no reserve) "
          f"{ours / 2**20:.0f} MiB, torch default {default / 2**20:.0f} MiB, "
          f"no shapes {bare / 2**20:.0f} MiB")
    # Recording input values costs this model about 1 GB over four steps here ...
    assert default - bare > 200 * 2**20, (default, bare)
    # ... and the collectors' profiler grows no more than one that records no inputs at all.
    assert ours - bare < (default - bare) / 10, (ours, default, bare)
    # ... while the shapes analysis needs are still recorded.
    trace_file = profiled("no-reserve")["dir"] / "traces" / "rank0.json.gz"
    trace = json.loads(gzip.decompress(trace_file.read_bytes()))
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
    assert mm and all(e["args"].get("Input Dims") for e in mm)


@pytest.mark.slow
def test_profiled_steps_fault_in_no_fresh_pages(profiled):
    """Without the heap reserve the profiled steps fault in their memory growth page by page;
    with it (at_step_start, as the runner and the Recorder call it) they fault in almost none."""
    page = resource.getpagesize()
    bare, ours = profiled("no-reserve"), profiled("collectors")
    print(f"minor faults over 4 profiled steps: no reserve {bare['faults']} "
          f"(growth {bare['growth_bytes'] / 2**20:.0f} MiB), with it {ours['faults']}")
    # The kernel's count agrees that the growth was fresh memory ...
    assert bare["faults"] >= bare["growth_bytes"] // page // 2, bare
    # ... and with the reserve a twentieth of those faults remain at most.
    assert ours["faults"] * 20 <= bare["faults"], (ours, bare)


# Calls at_step_start for step 0 of a window that starts at step FIRST, inside the profiler as
# the runner does; prints the resident growth and the reserve heap_reserve_bytes asks for.
WINDOW_SCRIPT = r"""
import json, pathlib, sys
import psutil, torch
from meshscope.collectors.profiling import at_step_start, heap_reserve_bytes, make_profiler

first = int(sys.argv[1])
window = (first, first + 1)
prof = make_profiler(pathlib.Path(sys.argv[2]), 0, window, torch.device("cpu"), {})
with prof:
    before = psutil.Process().memory_info().rss
    at_step_start(prof, 0, window)
    grown = psutil.Process().memory_info().rss - before
print(json.dumps({"growth_bytes": grown, "reserve_bytes": heap_reserve_bytes(window)}))
"""


@pytest.mark.parametrize("first", [0, 1])
def test_heap_reserve_goes_in_the_step_before_the_window(tmp_path, first):
    """The reserve is written in the step before the profiled window; a window that starts at
    step 0 has no such step, and a reserve there would land in its first profiled step."""
    got = _run_script(WINDOW_SCRIPT, first, tmp_path)
    if first == 1:
        assert got["growth_bytes"] >= 0.9 * got["reserve_bytes"] > 0, got
    else:
        assert got["growth_bytes"] < 0.1 * got["reserve_bytes"], got
