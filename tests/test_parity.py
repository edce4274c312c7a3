"""Correct or worthless: every layout trains to the same losses as one process.

Each case runs the real runner (torchrun, gloo, one process per rank) for 5 steps and compares
the per-step loss — the mean over the ranks that compute it — with ``reference_losses``: the
same model, seed and global batch trained in this process. fp32, rtol 1e-4.
"""
import dataclasses
import functools

import pandas as pd
import pytest

from meshscope.collectors.schema import validate_run_json
from conftest import meshscope
from meshscope.parallel.model import PRESETS
from meshscope.parallel.reference import reference_losses

pytestmark = pytest.mark.slow

STEPS = 5

# (id, extra `meshscope run` arguments, model preset, layer override)
CASES = [
    ("dp2-ddp", ["--layout", "dp=2", "--dp-mode", "ddp"], "tiny", None),
    ("dp2-fsdp", ["--layout", "dp=2", "--dp-mode", "fsdp"], "tiny", None),
    ("dp2-zero2", ["--layout", "dp=2", "--dp-mode", "zero2"], "tiny", None),
    ("tp2-sp", ["--layout", "tp=2"], "tiny", None),
    ("tp2-nosp", ["--layout", "tp=2", "--no-sp"], "tiny", None),
    ("cp2", ["--layout", "cp=2"], "tiny", None),
    ("ep2-dp2", ["--layout", "dp=2,ep=2"], "tiny-moe", None),
    # dp2·tp2 and tp2·pp2 (and dp4, tp4, pp4, dp2·pp2) are checked on the world-4 sweep's
    # runs below, which other tests share.
    ("cp2-tp2", ["--layout", "cp=2,tp=2"], "tiny", None),
    ("dp2-tp2-pp2", ["--layout", "dp=2,tp=2,pp=2", "--schedule", "1f1b"], "tiny", None),
    # DDP under pipelining with as many microbatches as stages: stage 0 runs two backwards
    # with no forward between them (F0 F1 B0 B1), which failed DDP's bucket rebuild until
    # parallel/pipeline.py's dp_sync_left_to_stages.
    ("dp2-pp2-1f1b-mb2", ["--layout", "dp=2,pp=2", "--schedule", "1f1b", "--microbatches", 2],
     "tiny", None),
]
for _p in (2, 4):
    for _s in ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zero-bubble", "zbv",
               "dualpipev"):
        CASES.append((f"pp{_p}-{_s}", ["--layout", f"pp={_p}", "--schedule", _s,
                                        "--microbatches", 8], "tiny8", None))


@functools.lru_cache(maxsize=None)
def _reference(preset: str, layers: int | None, steps: int, seed: int, batch: int
               ) -> tuple[float, ...]:
    """``reference_losses`` of a preset, computed once per session for each configuration
    (about 3 s each; most cases share the tiny and tiny8 presets)."""
    cfg = PRESETS[preset] if layers is None else dataclasses.replace(PRESETS[preset],
                                                                     n_layers=layers)
    return tuple(reference_losses(cfg, steps=steps, seed=seed, batch=batch))


def _losses(run) -> list[float]:
    steps = pd.concat(pd.read_parquet(f) for f in sorted((run / "steps").glob("*.parquet")))
    return steps.dropna(subset=["loss"]).groupby("step")["loss"].mean().tolist()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_losses_equal_one_process(case, tmp_path):
    name, args, preset, layers = case
    run = tmp_path / name
    meshscope("run", *args, "--model", preset, "--steps", STEPS, "--global-batch", 16,
              "--profile-steps", "4-4", "--out", run, check=True)
    validate_run_json(run / "run.json")
    expected = _reference(preset, layers, STEPS, 0, 16)
    assert _losses(run) == pytest.approx(list(expected), rel=1e-4)


def test_ranks_started_as_torchrun_does_train_to_the_same_losses(tmp_path):
    """``MESHSCOPE_RANK_START=exec``: each rank a fresh interpreter (torchrun's own way), not
    forked from the fork server (parallel/rank_start.py). dp=2 with DDP and pp=2 in one run, so
    that both the data-parallel and the pipeline imports happen in the rank itself."""
    run = tmp_path / "exec"
    meshscope("run", "--layout", "dp=2,pp=2", "--schedule", "1f1b", "--microbatches", 4,
              "--model", "tiny", "--steps", STEPS, "--global-batch", 16, "--out", run,
              check=True, env={"MESHSCOPE_RANK_START": "exec"})
    validate_run_json(run / "run.json")
    assert _losses(run) == pytest.approx(list(_reference("tiny", None, STEPS, 0, 16)), rel=1e-4)


def test_every_layout_of_the_world4_sweep_equals_one_process(world4_sweep):
    """The six layouts ``meshscope sweep --world 4`` runs for the tiny model (dp4, tp4, pp4,
    dp2·tp2, dp2·pp2, tp2·pp2): each run's losses equal one process's with the sweep's
    global batch and seed."""
    import json

    desc = json.loads((world4_sweep / "sweep.json").read_text())
    spec = desc["spec"]
    expected = list(_reference(spec["model"], None, spec["steps"], spec["seed"],
                               spec["global_batch"]))
    done = [r for r in desc["runs"] if r["status"] == "completed"]
    assert {r["candidate"]["layout"] for r in done} >= {"dp=4", "tp=4", "pp=4", "dp=2,tp=2",
                                                        "dp=2,pp=2", "tp=2,pp=2"}
    for r in done:
        run = world4_sweep / r["name"]
        validate_run_json(run / "run.json")
        assert _losses(run) == pytest.approx(expected, rel=1e-4), r["name"]
