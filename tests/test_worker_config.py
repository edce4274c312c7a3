"""The runner's per-rank configuration is one typed record (parallel/options.WorkerConfig):
written by the launcher, read back by every rank, the same value on both sides."""
import json
import pathlib

from meshscope.parallel.config import ModelConfig
from meshscope.parallel.faults import Fault
from meshscope.parallel.layout import Layout
from meshscope.parallel.options import RunOptions, WorkerConfig


def _options(tmp_path) -> RunOptions:
    return RunOptions(layout=Layout({"dp": 2, "pp": 2}), model=ModelConfig(), out=tmp_path,
                      schedule="interleaved-1f1b", virtual_stages=2, microbatches=4, steps=5,
                      profile_steps=(1, 2), faults=[Fault("slow", 1, 30)], dp_mode="ddp",
                      timeout_s=60, nccl_debug=True)


def test_written_config_reads_back_as_the_same_record(tmp_path):
    conf = WorkerConfig.of(_options(tmp_path), tmp_path, "abc123")
    path = tmp_path / ".meta" / "config-node0.json"
    conf.write(path)
    back = WorkerConfig.read(path)
    assert back == conf
    assert back.layout.size("pp") == 2 and back.virtual_stages == 2
    assert back.faults == (Fault("slow", 1, 30),)
    assert back.profile_steps == (1, 2) and isinstance(back.run_dir, pathlib.Path)


def test_the_file_holds_plain_json_with_every_key_the_ranks_read(tmp_path):
    """The file's keys are those the launcher wrote by hand before the record existed, and
    the memory recording's two (issue 33)."""
    conf = WorkerConfig.of(_options(tmp_path), tmp_path, "abc123")
    conf.write(tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    assert set(data) == {"run_dir", "run_id", "node_rank", "layout", "model", "schedule",
                         "virtual_stages", "stage_layers", "microbatches", "steps", "seed",
                         "global_batch", "lr", "dp_mode", "sp", "faults", "timeout_s",
                         "profile_steps", "always_on", "nccl_debug", "memory_snapshot",
                         "profile_memory"}
    assert data["layout"] == {"dp": 2, "pp": 2}
    assert data["faults"] == [{"kind": "slow", "rank": 1, "value": 30}]
    assert data["profile_steps"] == [1, 2] and data["run_dir"] == str(tmp_path)
