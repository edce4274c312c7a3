"""The gate of ``meshscope compare --fail-if``, in-process, over a grid of conditions (issue 52
item 1: ``gate.parse`` and ``gate.evaluate`` kept 55% of their mutants alive — their units,
messages and unmeasured branches were held only by tests that run ``meshscope`` in a
subprocess, which a mutation of the imported package never reaches).

The runs are hand-made reports whose answer is known by construction (the helpers of
``test_compare_diff.py`` and ``test_compare_oracle_tables.py``): ``base`` compute 10, 11, 12
ms a step, ``slower`` 20, 21, 22 ms (each side's noise 1.4826 × MAD = 1.4826 ms, the change's
√2 × that = 2.097 ms); the expected text is written here from those numbers."""
from __future__ import annotations

import json

import pytest

from meshscope.analysis.compare import diff, gate, open_side
from test_compare_diff import _report, _steps
from test_compare_oracle_tables import GIB, _run

MS = 1e3


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    base = _report(root / "base", _steps([10, 11, 12], [20, 21, 22],
                                         exposed_comm_dp_us=[2, 2, 2]))
    slower = _report(root / "slower", _steps([20, 21, 22], [30, 31, 32],
                                             exposed_comm_dp_us=[2, 2, 2]))
    two = _report(root / "two", _steps([10, 12], [20, 22]))
    return open_side(base), open_side(slower), open_side(two)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate-gpu")
    return _run(root / "before", False), _run(root / "after", True)


@pytest.mark.parametrize("text,threshold", [
    ("step_time>+5us", 5.0), ("step_time>+5µs", 5.0), ("step_time>+5ms", 5e3),
    ("step_time>+5s", 5e6), ("step_time > + .5 ms", 500.0), ("step_time>+5.ms", 5e3),
    ("peak_memory>3B", 3.0), ("peak_memory>3KB", 3e3), ("peak_memory>3MB", 3e6),
    ("peak_memory>3GB", 3e9), ("peak_memory>3TB", 3e12), ("peak_memory>3KiB", 3 * 1024.0),
    ("peak_memory>3MiB", 3 * 1024.0 ** 2), ("peak_memory>3gib", 3 * 1024.0 ** 3),
    ("peak_memory>3TiB", 3 * 1024.0 ** 4), ("busbw.all_reduce<40gb/s", 40.0),
    ("tokens_per_s<900", 900.0), ("overlap_pct<-2", -2.0),
])
def test_every_unit_scales_as_documented(text, threshold):
    c = gate.parse(text)
    assert c.threshold == pytest.approx(threshold) and not c.relative
    assert c.text == text


@pytest.mark.parametrize("text,op", [("compute>1ms", ">"), ("compute>=1ms", ">="),
                                     ("compute<1ms", "<"), ("compute<=1ms", "<=")])
def test_each_comparison_is_read(text, op):
    assert gate.parse(text).op == op


@pytest.mark.parametrize("text,words", [
    ("step_time>+5MS", "'MS' is not a unit of step_time (its units: us, ms, s)"),
    ("mfu_pct<40pct", "'pct' is not a unit of mfu_pct (its units: none: a bare number)"),
    ("peak_memory>3", "peak_memory needs a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"),
    ("busbw.all_reduce<40", "needs a unit (GB/s)"),
    ("idle.nap>1ms", "no quantity 'idle.nap'"),
    ("", "not QUANTITY OP THRESHOLD"),
    ("step_time>>5ms", "not QUANTITY OP THRESHOLD"),
    ("step_time>5ms\x7f", "not QUANTITY OP THRESHOLD"),         # DEL is ASCII: not "pasted"
    ("step_time>+5", "step_time needs a unit (us, ms, s)"),
])
def test_a_bad_condition_names_its_problem(text, words):
    with pytest.raises(gate.GateError) as e:
        gate.parse(text)
    assert words in str(e.value)
    assert str(e.value).startswith(f"--fail-if {text!r}: ")


def test_a_misspelt_quantity_lists_what_the_runs_have():
    with pytest.raises(gate.GateError) as e:
        gate.parse("compte>+1ms", known=["compute", "window"])
    msg = str(e.value)
    assert "no quantity 'compte' (did you mean 'compute'?); the quantities are: compute, " \
           "window — <dim>: pp" in msg
    with pytest.raises(gate.GateError) as e:
        gate.parse("zzz>+1ms")
    assert "(did you mean" not in str(e.value)
    assert "<cause>: dataloader, sync" in str(e.value)


@pytest.mark.parametrize("text,char,hint", [
    ("step_time>+5\u2013", "U+2013 EN DASH", ": write '-'"),
    ("step_time\u2265+5ms", "U+2265 GREATER-THAN OR EQUAL TO", ": write '>='"),
    ("step_time>+5ms\u00e9", "U+00E9 LATIN SMALL LETTER E WITH ACUTE", ""),
    ("step_time>+5ms\ue000", "U+E000 unnamed", ""),                   # private use: no name
])
def test_a_non_ascii_character_is_named(text, char, hint):
    with pytest.raises(gate.GateError) as e:
        gate.parse(text)
    pos = next(i for i, ch in enumerate(text) if ord(ch) > 127) + 1
    assert f"character {pos} is {text[pos - 1]!r} ({char}){hint}" in str(e.value)
    assert str(e.value).endswith(f"({char}){hint}")


def test_the_messages_state_the_change_the_level_and_the_noise(cpu):
    base, slower, _ = cpu
    v = gate.evaluate(gate.parse("compute>+0.2ms"), base, slower)
    assert v.failed and v.holds and v.measured == pytest.approx(10 * MS)
    assert v.noise == pytest.approx(2096.7, abs=0.1)
    assert v.message == ("FAIL: compute>+0.2ms — compute changed +10.000 ms (11.000 ms → "
                         "21.000 ms); noise ±2.097 ms")
    v = gate.evaluate(gate.parse("compute>+11ms"), base, slower)
    assert not v.holds and not v.failed
    assert v.message.startswith("pass: compute>+11ms — compute changed +10.000 ms")
    v = gate.evaluate(gate.parse("compute>+9ms"), base, slower)     # holds by 1 ms < 2 × noise
    assert v.failed            # the noise rule judges the change (10 ms), not its margin
    v = gate.evaluate(gate.parse("compute<-1ms"), slower, base)
    assert v.failed and v.measured == pytest.approx(-10 * MS)
    assert "compute changed -10.000 ms (21.000 ms → 11.000 ms)" in v.message
    v = gate.evaluate(gate.parse("compute>+50%"), base, slower)      # +90.9%
    assert v.failed and v.measured == pytest.approx(10 / 11)
    assert "compute changed +90.9% (11.000 ms → 21.000 ms)" in v.message
    v = gate.evaluate(gate.parse("compute<-50%"), slower, base)      # −47.6%
    assert not v.holds and "compute changed -47.6%" in v.message
    # a level: the candidate's value against the threshold, by the candidate's noise
    v = gate.evaluate(gate.parse("compute>20ms"), base, slower)      # 21 ms, 1 ms over
    assert v.holds and not v.failed and v.noise == pytest.approx(1482.6)
    assert v.message == ("pass (holds, but within the noise): compute>20ms — compute is "
                         "21.000 ms in slower; noise ±1.483 ms")
    v = gate.evaluate(gate.parse("compute>17ms"), base, slower)      # 4 ms over: out of it
    assert v.failed and v.measured == pytest.approx(21 * MS)
    v = gate.evaluate(gate.parse("compute>=21ms"), base, slower)
    assert v.holds and not gate.evaluate(gate.parse("compute>21ms"), base, slower).holds


def test_two_steps_have_no_noise_and_say_so(cpu):
    base, _, two = cpu
    v = gate.evaluate(gate.parse("compute>+0.1ms"), base, two)       # 11 → 11 ms: no change
    assert v.noise is None and not v.holds
    v = gate.evaluate(gate.parse("compute>10ms"), base, two)         # 11 ms, 1 ms over
    assert v.failed and v.noise is None
    assert v.message.endswith("noise unknown: judged on the values alone")


def test_the_messages_of_the_other_units(gpu):
    before, after = gpu
    v = gate.evaluate(gate.parse("peak_reserved>1GiB"), before, after)
    assert v.message == ("FAIL: peak_reserved>1GiB — peak_reserved is 8192.0 MiB in after; "
                         "noise ±1518.2 MiB")
    v = gate.evaluate(gate.parse("peak_reserved>+0.5GiB"), before, after)   # +1 GiB, noise 2.1
    assert v.holds and not v.failed
    assert "peak_reserved changed +1024.0 MiB (7168.0 MiB → 8192.0 MiB)" in v.message
    v = gate.evaluate(gate.parse("busbw.dp.all_reduce>+2GB/s"), before, after)
    assert "busbw.dp.all_reduce changed +5.00 GB/s (21.50 GB/s → 26.50 GB/s); noise " \
           "±2.10 GB/s" in v.message
    v = gate.evaluate(gate.parse("mfu_pct<-0.5"), before, after)          # 36.5 → 35.5
    assert v.holds and "mfu_pct changed -1.00 (36.50 → 35.50)" in v.message
    v = gate.evaluate(gate.parse("tokens_per_s<1000"), before, after)
    assert "tokens_per_s is 995.0 in after" in v.message and v.holds


@pytest.mark.parametrize("cond,why", [
    ("tokens_per_s<-5%", "it has no step timers, or they did not record it"),
    ("mfu_pct<-1", "it has no step timers, or they did not record it"),
    ("peak_memory>+1GiB", "it has no step timers, or they did not record it"),
    ("idle.sync>+1ms", "it is not a GPU run"),
    ("kernels.gemm>+1ms", "it is not a GPU run"),
    ("busbw.all_reduce<-1GB/s", "no operation of that kind with known bytes and transfer time"),
])
def test_an_unmeasured_quantity_is_bad_input_or_not_checked(cpu, cond, why):
    base, slower, _ = cpu
    with pytest.raises(gate.GateError) as e:
        gate.evaluate(gate.parse(cond), base, slower)
    assert str(e.value) == (f"--fail-if {cond!r}: base does not measure "
                            f"{cond.split('<')[0].split('>')[0]} ({why}); --allow-unmeasured "
                            f"reports it as not checked")
    v = gate.evaluate(gate.parse(cond), base, slower, allow_unmeasured=True)
    assert (v.checked, v.failed, v.holds, v.measured) == (False, False, False, None)
    assert v.message.startswith(f"not checked: {cond} — base does not measure")


def test_a_level_needs_only_the_candidate(cpu, gpu):
    """``peak_memory>1GiB`` speaks of the candidate: a baseline without timers is no matter;
    a change needs both."""
    base, _, _ = cpu
    _, after = gpu
    assert gate.evaluate(gate.parse("peak_memory>1GiB"), base, after).holds
    with pytest.raises(gate.GateError) as e:
        gate.evaluate(gate.parse("peak_memory>+1GiB"), base, after)
    assert "base does not measure peak_memory" in str(e.value)
    with pytest.raises(gate.GateError) as e:
        gate.evaluate(gate.parse("peak_memory>1GiB"), after, base)
    assert "base does not measure peak_memory" in str(e.value)


def test_a_dimension_a_run_cannot_tell_apart_is_not_measured(tmp_path, cpu):
    """A run whose communication is all under ``unknown`` has not measured 0 ms of dp; one
    whose layout has no dp (size 1) has."""
    base, _, _ = cpu
    blind = _report(tmp_path / "blind", _steps([10, 11, 12], [20, 21, 22],
                                               exposed_comm_unknown_us=[2, 2, 2]))
    summary = json.loads((blind / "summary.json").read_text())
    fields = ("window", "compute", "comm", "overlapped_comm", "exposed_comm", "bubble", "other",
              "idle", "exposed_comm_pp", "exposed_comm_tp", "exposed_comm_cp", "exposed_comm_ep",
              "exposed_comm_dp")
    summary["per_rank_mean"] = [{"rank": 0, "overlap_pct": None, "exposed_comm_unknown_us": 2e3,
                                 **{f"{f}_us": None for f in fields}}]
    (blind / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(gate.GateError) as e:
        gate.evaluate(gate.parse("exposed_comm.dp>+1ms"), base, open_side(blind))
    assert "blind does not measure exposed_comm.dp (its communication carries no mesh names" \
        in str(e.value) and "analyze it with the job's --layout, and --rank-order" in str(e.value)
    # the operation form too, and the unknown dimension itself is measured
    with pytest.raises(gate.GateError):
        gate.evaluate(gate.parse("exposed_comm.dp.all_reduce>+1ms"), base, open_side(blind))
    assert not gate.evaluate(gate.parse("exposed_comm.unknown>+3ms"), base,
                             open_side(blind)).holds
    # run.json says dp is 1: its 0 ms of dp is a measurement
    summary["run"] = {"run_id": "x", "layout_str": "pp1", "layout": {"dp": 1}}
    (blind / "summary.json").write_text(json.dumps(summary))
    v = gate.evaluate(gate.parse("exposed_comm.dp<-1ms"), base, open_side(blind))
    assert v.failed and v.measured == pytest.approx(-2 * MS)


def test_a_change_relative_to_zero_is_refused(cpu, tmp_path):
    base, _, _ = cpu
    with pytest.raises(gate.GateError) as e:
        gate.evaluate(gate.parse("bubble>+10%"), base, base)
    assert str(e.value) == ("--fail-if 'bubble>+10%': bubble is 0 in base: a change relative "
                            "to it has no meaning")
    # an absolute change from zero is fine, and no change is shown with its sign
    v = gate.evaluate(gate.parse("bubble>+1ms"), base, base)
    assert not v.holds
    assert "bubble changed +0.000 ms (0.000 ms → 0.000 ms)" in v.message


def test_the_diffs_own_change_is_what_the_gate_judges(cpu):
    base, slower, _ = cpu
    d = diff(base, slower)
    v = gate.evaluate(gate.parse("compute>+0.2ms"), base, slower, diff=d)
    assert v.change is d.quantities["compute"] and v.failed
    # a quantity the diff did not state is measured on the sides
    v = gate.evaluate(gate.parse("exposed_comm.dp>+0.1ms"), base, slower, diff=d)
    assert v.change.name == "exposed_comm.dp" and not v.holds
    assert GIB == 1 << 30


def _with_summary(side_folder, tmp_path, name, *, unknown_us=None, bandwidth_dims=(),
                  layout=None):
    """A copy of a hand-made report whose summary.json says, per rank, ``unknown_us`` of
    communication filed under no dimension, bandwidth rows of ``bandwidth_dims`` and the
    run's ``layout``."""
    import shutil

    folder = tmp_path / name
    shutil.copytree(side_folder, folder)
    summary = json.loads((folder / "summary.json").read_text())
    fields = ("window", "compute", "comm", "overlapped_comm", "exposed_comm", "bubble", "other",
              "idle", "exposed_comm_pp", "exposed_comm_tp", "exposed_comm_cp", "exposed_comm_ep",
              "exposed_comm_dp")
    summary["per_rank_mean"] = [{"rank": r, "overlap_pct": None,
                                 "exposed_comm_unknown_us": unknown_us,
                                 **{f"{f}_us": None for f in fields}} for r in (0, 1)]
    summary["bandwidth"] = [{"dim": d, "op": "all_reduce", "group_size": 2, "size_bucket": 4096,
                             "instances": 3, "msg_bytes": 4096.0, "transfer_us": 10.0,
                             "busbw_gbps": 1.0, "busbw_max_gbps": 1.0,
                             "baseline_busbw_gbps": None, "efficiency": None}
                            for d in bandwidth_dims]
    if layout is not None:
        summary["run"] = {"run_id": name, "layout_str": name, "layout": layout}
    (folder / "summary.json").write_text(json.dumps(summary))
    return open_side(folder)


def test_only_communication_filed_under_no_dimension_makes_a_dimension_unmeasured(gpu,
                                                                                   tmp_path):
    """``quantities.unattributed`` on the GPU runs: a run whose communication all carries mesh
    names (0 ms unknown; bandwidth rows of dp) measures exposed_comm.dp — 2 ms more after;
    one with unknown bandwidth rows or unknown time does not; a quantity of another family is
    never refused for it; a layout with dp = 1 measures dp whatever else it says."""
    before, after = gpu
    src = after.report_dir
    named = _with_summary(src, tmp_path, "named", unknown_us=0.0, bandwidth_dims=("dp",))
    assert gate.evaluate(gate.parse("exposed_comm.dp.all_reduce>+1.5ms"), before, named).failed
    assert gate.evaluate(gate.parse("exposed_comm.dp>+1.5ms"), before, named).failed
    for name, kw in (("bw-unknown", {"bandwidth_dims": ("dp", "unknown")}),
                     ("time-unknown", {"unknown_us": 5.0})):
        blind = _with_summary(src, tmp_path, name, **kw)
        for cond in ("exposed_comm.dp>+1.5ms", "exposed_comm.dp.all_reduce>+1.5ms"):
            with pytest.raises(gate.GateError) as e:
                gate.evaluate(gate.parse(cond), before, blind)
            assert "so none of it can be told to be dp: it is filed under 'unknown'" in \
                str(e.value), (name, cond)
        # other families, and the unknown dimension itself, are measured
        assert gate.evaluate(gate.parse("idle.sync>+1.5ms"), before, blind).failed
        assert gate.evaluate(gate.parse("kernels.gemm>+1.5ms"), before, blind).failed
        assert not gate.evaluate(gate.parse("exposed_comm.unknown>+1ms"), before, blind).holds
    single = _with_summary(src, tmp_path, "dp1", unknown_us=5.0, bandwidth_dims=("unknown",),
                           layout={"dp": 1, "tp": 2})
    assert gate.evaluate(gate.parse("exposed_comm.dp.all_reduce>+1.5ms"), before,
                         single).failed
    with pytest.raises(gate.GateError):      # tp is 2: its time may be inside unknown
        gate.evaluate(gate.parse("exposed_comm.tp>+1ms"), before, single)
