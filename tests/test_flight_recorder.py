"""Flight Recorder dumps: PyTorch's own pickles read as plain data only, and a crashed run's
records still readable."""
import json
import os
import pickle
import subprocess
import sys

import pandas as pd
import pytest

from meshscope.collectors.flight_recorder import (FR_SCHEMA_VERSION, UnsafePickleError,
                                        load_pickle_dump, read_dump)
from conftest import meshscope

DUMP_SCRIPT = r'''
import sys, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
dist.init_process_group("gloo")
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
dist.broadcast(t, 0)
with open(f"{sys.argv[1]}/fr-rank{dist.get_rank()}.pkl", "wb") as f:
    f.write(c10d._dump_fr_trace())
dist.destroy_process_group()
'''


class _Exploit:
    """Unpickling this would run a shell command."""
    def __reduce__(self):
        return (os.system, ("touch /tmp/meshscope-pwned",))


def test_pickle_reader_refuses_code(tmp_path):
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(pickle.dumps({"entries": [_Exploit()]}))
    with pytest.raises(UnsafePickleError) as err:
        load_pickle_dump(bad)
    assert str(bad) in str(err.value) and "posix.system" in str(err.value)
    assert not os.path.exists("/tmp/meshscope-pwned")


def test_pickle_reader_refuses_non_plain_builtins(tmp_path):
    odd = tmp_path / "set.pkl"
    odd.write_bytes(pickle.dumps({"entries": {1, 2}}))
    with pytest.raises(UnsafePickleError, match="set"):
        load_pickle_dump(odd)



@pytest.mark.parametrize("rank", ["missing", None, "two"])
def test_dump_without_a_rank_is_named(tmp_path, rank):
    """A dump whose rank is absent or not a number cannot be placed in any group's comparison:
    read_dump refuses it, naming the file."""
    dump = {"schema_version": FR_SCHEMA_VERSION, "flight_recorder": {"entries": []}}
    if rank != "missing":
        dump["rank"] = rank
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(dump))
    with pytest.raises(ValueError, match=f"{path}: Flight Recorder dump without a rank"):
        read_dump(path)
    dump["rank"] = "3"
    path.write_text(json.dumps(dump))
    assert read_dump(path)["rank"] == 3

@pytest.mark.slow
def test_pickle_reader_reads_a_real_pytorch_dump(tmp_path):
    script = tmp_path / "dump.py"
    script.write_text(DUMP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "100"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", str(script), str(tmp_path)], env=env, check=True,
                   capture_output=True, timeout=120)
    for rank in (0, 1):
        dump = load_pickle_dump(tmp_path / f"fr-rank{rank}.pkl")
        ops = [e["profiling_name"] for e in dump["entries"]]
        assert ops == ["gloo:all_reduce"] * 3 + ["gloo:broadcast"]
        assert [e["collective_seq_id"] for e in dump["entries"]] == [1, 2, 3, 4]


@pytest.mark.slow
def test_crashed_run_keeps_the_other_ranks_records(tmp_path):
    run = tmp_path / "crash3"
    proc = meshscope("run", "--layout", "dp=2,pp=2", "--inject", "crash=1:3", "--out", run,
                     timeout=120)
    assert proc.returncode != 0
    for rank in range(4):
        steps = pd.read_parquet(run / "steps" / f"rank{rank}.parquet")
        # Steps 0-2 finished everywhere; rank 1 crashed at the start of step 3.
        assert steps["step"].tolist()[:3] == [0, 1, 2]
        dump = json.loads((run / "comms" / f"rank{rank}.json").read_text())
        assert dump["flight_recorder"]["entries"]
        assert dump["reason"] in ("exception", "terminated")
