"""DDP or FSDP under a split-backward pipeline schedule (zero-bubble, ZB-V, DualPipeV) is
refused before launch: torch 2.13 computes those schedules' weight gradients with
``torch.autograd.grad``, which DDP's gradient hooks never see (pytorch/pytorch#144530), so the
replicas would silently train apart (parallel/options.py). Nothing here starts a rank."""
from __future__ import annotations

import pathlib

import pytest

from conftest import meshscope
from meshscope.parallel.config import PRESETS
from meshscope.parallel.layout import LayoutError, parse_layout
from meshscope.parallel.options import RunOptions, check


def _options(layout: str, schedule: str, dp_mode: str = "ddp") -> RunOptions:
    return RunOptions(layout=parse_layout(layout), model=PRESETS["tiny"],
                      out=pathlib.Path("/nonexistent/run"), schedule=schedule,
                      microbatches=4, dp_mode=dp_mode)


@pytest.mark.parametrize("dp_mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("schedule", ["zero-bubble", "zbv", "dualpipev"])
def test_ddp_replicas_under_a_split_backward_are_refused(schedule, dp_mode):
    # data-parallel replicas from dp, and from cp (which also holds replicas of the weights)
    for layout in ("dp=2,pp=2", "cp=2,pp=2"):
        with pytest.raises(LayoutError) as e:
            check(_options(layout, schedule, dp_mode))
        named = f"--schedule {schedule} with --dp-mode {dp_mode} (layout {parse_layout(layout)})"
        assert named in str(e.value)
        assert "pytorch/pytorch#144530" in str(e.value)


@pytest.mark.parametrize("layout,schedule", [
    ("pp=2", "zbv"),                        # no data parallelism: nothing to average
    ("pp=2", "dualpipev"),
    ("dp=2,pp=2", "gpipe"),                 # whole backwards: DDP's hooks see every gradient
    ("dp=2,pp=2", "1f1b"),
    ("dp=2,pp=2", "interleaved-1f1b"),
    ("dp=2,pp=2", "looped-bfs"),
    ("dp=4", "zero-bubble"),                # no pipeline: the schedule is not used
])
def test_the_layouts_ddp_trains_correctly_are_accepted(layout, schedule):
    check(_options(layout, schedule))


def test_zero2_under_a_split_backward_is_accepted():
    # dp=2,pp=2 zero-bubble with zero2 trained to 1F1B's losses (5.734315, 5.701813, 5.660112)
    check(_options("dp=2,pp=2", "zero-bubble", "zero2"))


def test_the_command_exits_2_with_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    proc = meshscope("run", "--layout", "dp=2,pp=2", "--schedule", "zbv", "--microbatches", 2,
                     "--out", out)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("meshscope: error: --schedule zbv with --dp-mode ddp")
    assert not out.exists()
