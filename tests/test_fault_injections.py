"""``--inject``'s ``loader-sleep`` and ``dp-all-reduce`` (issue 52, parallel/faults.py): what
they parse to, and bad input refused with one line naming the flag, exit 2, before anything
starts. (What they do to a run: tests/test_compare_run_oracle.py.)"""
from __future__ import annotations

import pathlib

import pytest

from conftest import meshscope
from meshscope.parallel.config import PRESETS
from meshscope.parallel.faults import Fault, parse_fault
from meshscope.parallel.layout import LayoutError, parse_layout
from meshscope.parallel.options import RunOptions, check


def test_the_two_parse_to_their_rank_and_amount():
    assert parse_fault("loader-sleep=3:45") == Fault("loader-sleep", 3, 45)
    assert parse_fault("dp-all-reduce=2:4096") == Fault("dp-all-reduce", 2, 4096)


@pytest.mark.parametrize("text,needle", [
    ("loader-sleep=0:0", "a loader sleep lasts at least 1 ms a step"),
    ("loader-sleep=0:-5", "a loader sleep lasts at least 1 ms a step"),
    ("dp-all-reduce=0:0", "the extra all-reduce holds at least 1 KiB"),
    ("loader-sleep=0:1.5", "rank and value must be integers"),
    ("dp-all-reduce=0", "expected slow-rank=R:MS"),
    ("loader_sleep=0:5", "loader-sleep=R:MS or dp-all-reduce=R:KIB"),
])
def test_bad_values_are_refused_naming_the_flag(text, needle):
    with pytest.raises(ValueError) as e:
        parse_fault(text)
    assert str(e.value).startswith(f"--inject {text!r}: ") and needle in str(e.value)


def _options(layout: str, *faults: str) -> RunOptions:
    return RunOptions(layout=parse_layout(layout), model=PRESETS["tiny"],
                      out=pathlib.Path("/nonexistent/run"),
                      faults=[parse_fault(f) for f in faults])


def test_a_dp_all_reduce_needs_data_parallelism_and_a_rank_of_the_job():
    check(_options("dp=2,pp=2", "dp-all-reduce=0:64", "dp-all-reduce=2:64",
                   "loader-sleep=3:10"))                       # healthy: accepted
    with pytest.raises(LayoutError, match=r"--inject dp-all-reduce=0:64: layout pp=2 has no "
                                          r"data parallelism \(dp=1\)"):
        check(_options("pp=2", "dp-all-reduce=0:64"))
    with pytest.raises(LayoutError, match=r"--inject loader-sleep=4:10: rank 4 is not in 0..3"):
        check(_options("dp=2,pp=2", "loader-sleep=4:10"))


@pytest.mark.parametrize("args,needle", [
    (["--layout", "pp=2", "--inject", "dp-all-reduce=0:64"],
     "--inject dp-all-reduce=0:64: layout pp=2 has no data parallelism"),
    (["--inject", "loader-sleep=1:0"],
     "--inject 'loader-sleep=1:0': a loader sleep lasts at least 1 ms a step"),
])
def test_the_command_exits_2_with_one_line(tmp_path, args, needle):
    out = tmp_path / "run"
    proc = meshscope("run", *args, "--out", out)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"meshscope: error: {lines[0].removeprefix('meshscope: error: ')}"]
    assert needle in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists()
