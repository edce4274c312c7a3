"""The profiler as the collectors set it up must not change what it measures.

The reference is torch's own profiler: with its default ``record_shapes=True`` it also records
every op's "Concrete Inputs", and the same training steps under it grow the process by about a
step's activations per profiled step (pytorch/pytorch#133444 describes the inputs as held until
the profiler stops); with ``record_shapes=False`` it records no inputs at all.
"""
import gzip
import json
import subprocess
import sys

from conftest import ROOT

# One process, one thread: five steps of the "balanced" model, each 8 microbatches of 4 sequences
# (forward and backward, gradients accumulated, as the runner's pipeline steps do), the last four
# profiled; prints the resident-memory growth over the profiled steps and writes the trace. MODE
# "collectors" uses collectors.profiling.make_profiler; "torch-default" a plain
# torch.profiler.profile(record_shapes=True) with torch's default input recording; "no-shapes"
# the same with record_shapes=False, which records no inputs at all.
SCRIPT = r"""
import json, pathlib, sys
import psutil, torch
from torch.profiler import ProfilerActivity, profile, schedule
from collectors.profiling import make_profiler
from parallel.model import PRESETS, build_model, lm_loss

mode, out = sys.argv[1], pathlib.Path(sys.argv[2])
torch.set_num_threads(1)
cfg = PRESETS["balanced"]
model = build_model(cfg, seed=0)
x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
if mode == "collectors":
    prof = make_profiler(out, 0, (1, 4), torch.device("cpu"), {"test": True})
else:
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=mode == "torch-default",
                   schedule=schedule(wait=0, warmup=1, active=4, repeat=1),
                   on_trace_ready=lambda p: None)
rss = []
with prof:
    for step in range(5):
        for microbatch in range(8):
            lm_loss(model(x), x).backward()
        prof.step()
        rss.append(psutil.Process().memory_info().rss)
print(json.dumps({"growth_bytes": rss[-1] - rss[0]}))
"""


def _profiled_growth(mode, tmp_path) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(tmp_path / mode)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["growth_bytes"]


def test_profiled_steps_keep_memory_flat_and_shapes(tmp_path):
    ours = _profiled_growth("collectors", tmp_path)
    default = _profiled_growth("torch-default", tmp_path)
    bare = _profiled_growth("no-shapes", tmp_path)
    print(f"resident growth over 4 profiled steps: collectors {ours / 2**20:.0f} MiB, "
          f"torch default {default / 2**20:.0f} MiB, no shapes {bare / 2**20:.0f} MiB")
    # Recording input values costs this model about 1 GB over four steps here ...
    assert default - bare > 200 * 2**20, (default, bare)
    # ... and the collectors' profiler grows no more than one that records no inputs at all.
    assert ours - bare < (default - bare) / 10, (ours, default, bare)
    # ... while the shapes analysis needs are still recorded.
    trace = json.loads(gzip.decompress((tmp_path / "collectors" / "traces" / "rank0.json.gz")
                                       .read_bytes()))
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
    assert mm and all(e["args"].get("Input Dims") for e in mm)
