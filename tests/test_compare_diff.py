"""`meshscope compare BEFORE AFTER`: what changed, why, and the regression gate (issue 32).

- Hand-made reports whose answer is known by construction: the parts add up to the window's
  change, the noise rule (a change inside the step-to-step noise never fails the gate, one
  outside it does), levels and changes, units, every exit code through the command.
- HTA's own trace-diff pair (../shared/traces/gpu/hta/trace_diff): the kernel differences equal
  an independent scan of the two raw traces, and HTA's TraceDiff.compare_traces agrees on the
  kernel counts and durations.
- The shipped samples: the healthy dp2·pp2 run against the same layout with rank 1 slowed —
  the slowed rank and the dimension that waits are named, and the gate fails on it at 5%.
"""
from __future__ import annotations

import gzip
import json
import pathlib
import math
import re
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from conftest import ROOT, meshscope, runs_side_by_side, shared_trace
from meshscope.analysis.compare import diff, open_side
from meshscope.analysis.compare import gate
from meshscope.analysis.compare.names import kernel_key
from meshscope.analysis.report import tables
from meshscope.analysis.report.model import REPORT_SCHEMA_VERSION

SAMPLES = ROOT / "samples"


# -- hand-made reports ---------------------------------------------------------------------

def _report(folder, steps: dict[int, dict[str, float]], *, step_time_us=None, ranks=(0,),
            timer=None, noise_us=None):
    """A report directory holding summary.json and a breakdown of ``steps`` (step → column
    values in ms for every rank; idle fills the window). ``timer``: per-step step-timer times
    (ms), making the headline the timer's median."""
    folder.mkdir(parents=True)
    rows = []
    for step, v in steps.items():
        for r in ranks:
            row = {c: 0.0 for c in tables.COLUMNS["breakdown"]}
            row.update({"rank": r, "step": step, "overlap_pct": math.nan})
            for k, ms in v.items():
                row[k] = ms * 1e3
            row["exposed_comm_us"] = sum(row[f"exposed_comm_{d}_us"]
                                         for d in ("pp", "tp", "cp", "ep", "dp", "unknown"))
            row["idle_us"] = row["window_us"] - row["compute_us"] - row["exposed_comm_us"] \
                - row["bubble_us"] - row["other_us"]
            rows.append(row)
    pd.DataFrame(rows, columns=tables.COLUMNS["breakdown"]).to_parquet(
        folder / "breakdown.parquet")
    window = float(pd.DataFrame(rows).groupby("step")["window_us"].max().mean())
    source = "window"
    if timer is not None:
        pd.DataFrame({"step": list(range(len(timer))), "loss": math.nan,
                      "step_time_us": [t * 1e3 for t in timer], "tokens_per_s": math.nan,
                      "mfu_pct": math.nan, "peak_memory_bytes": pd.array(
                          [1 << 30] * len(timer), dtype="Int64")}).to_parquet(
            folder / "throughput.parquet")
        source = "timer"
    head = step_time_us if step_time_us is not None else (
        float(pd.Series(timer).median()) * 1e3 if timer is not None else window)
    (folder / "summary.json").write_text(json.dumps({
        "schema_version": 3, "device": "cpu", "ranks": list(ranks), "steps": list(steps),
        "step_time_us": head, "step_time_source": source,
        "step_time_timer_us": head if timer is not None else None,
        "step_time_replayed_us": None, "window_us": window,
        "throughput": {"step_time_us": head if timer is not None else None,
                       "tokens_per_s": None, "mfu_pct": None, "steps": []},
        "cross_rank": {"noise_us": noise_us}, "warmup_steps": [], "findings": []}))
    return folder


def _steps(compute: list[float], window: list[float], **more) -> dict[int, dict[str, float]]:
    return {i: {"compute_us": c, "window_us": w, **{k: v[i] for k, v in more.items()}}
            for i, (c, w) in enumerate(zip(compute, window))}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Three hand-made runs: ``base``; ``slower``, whose compute is 10 ms longer on every step
    (noise 1.48 ms: 1.4826 × the median absolute deviation of 10, 11, 12 ms, i.e. 1 ms, on
    each side); ``jitter``, 0.5 ms longer — inside that noise."""
    root = tmp_path_factory.mktemp("made")
    base = _report(root / "base", _steps([10, 11, 12], [20, 21, 22],
                                         exposed_comm_dp_us=[2, 2, 2]))
    slower = _report(root / "slower", _steps([20, 21, 22], [30, 31, 32],
                                             exposed_comm_dp_us=[2, 2, 2]))
    jitter = _report(root / "jitter", _steps([10.5, 11.5, 12.5], [20.5, 21.5, 22.5],
                                             exposed_comm_dp_us=[2, 2, 2]))
    return {"base": base, "slower": slower, "jitter": jitter}


def test_the_parts_add_up_to_the_change_and_carry_its_noise(made):
    d = diff(open_side(made["base"]), open_side(made["slower"]))
    parts = {p.name: p for p in d.parts}
    assert parts["compute"].delta_us == pytest.approx(10_000.0)
    assert parts["exposed_comm.dp"].delta_us == 0.0 and parts["idle"].delta_us == 0.0
    assert d.parts_total_us == pytest.approx(d.window.delta) == pytest.approx(10_000.0)
    assert d.residual_us == pytest.approx(0.0)
    # noise: 1.4826 × MAD (1 ms) on each side, added in quadrature
    assert parts["compute"].change.noise == pytest.approx(math.hypot(1482.6, 1482.6))
    assert d.sentences[0].startswith("Step time rose from 21.00 ms (base) to 31.00 ms")
    assert "beyond the step-to-step noise" in d.sentences[0]
    assert d.sentences[1].startswith("Compute grew 10.00 ms a step (100% of the change)")


def test_a_change_inside_the_noise_never_fails_the_gate(made):
    base, jitter, slower = (open_side(made[k]) for k in ("base", "jitter", "slower"))
    cond = gate.parse("compute>+0.2ms")
    held = gate.evaluate(cond, base, jitter)          # +0.5 ms: holds, but inside ±2.1 ms
    assert held.holds and not held.failed and "within the noise" in held.message
    assert gate.evaluate(cond, base, slower).failed    # +10 ms: outside it
    assert "within the step-to-step noise" in diff(base, jitter).sentences[0]
    # a relative change, and a level of the candidate
    assert gate.evaluate(gate.parse("step_time>+40%"), base, slower).failed   # +47.6%
    assert not gate.evaluate(gate.parse("step_time>+50%"), base, slower).holds
    assert gate.evaluate(gate.parse("window>25ms"), base, slower).failed      # 31 ms
    assert not gate.evaluate(gate.parse("window<25ms"), base, slower).holds


def test_the_noise_of_the_timers_step_time_is_the_runs_own(tmp_path):
    """Where the headline is the step timer, its noise is the report's noise_us (the run's
    unprofiled steps), not the profiled steps'."""
    a = _report(tmp_path / "a", _steps([10, 11, 12], [20, 21, 22]), timer=[20, 21, 22, 21],
                noise_us=3000.0)
    b = _report(tmp_path / "b", _steps([10, 11, 12], [20, 21, 22]), timer=[22, 23, 24, 23],
                noise_us=4000.0)
    c = diff(open_side(a), open_side(b)).step_time
    assert c.delta == pytest.approx(2000.0) and c.noise == pytest.approx(5000.0)
    assert c.within_noise


@pytest.mark.parametrize("text,quantity,threshold,relative,is_change", [
    ("step_time>+5%", "step_time", 0.05, True, True),
    ("exposed_comm.dp > +2ms", "exposed_comm.dp", 2000.0, False, True),
    ("peak_memory>+1GiB", "peak_memory", float(1 << 30), False, True),
    ("peak_memory>70GB", "peak_memory", 70e9, False, False),
    ("mfu_pct<-3", "mfu_pct", -3.0, False, True),
    ("mfu_pct<40", "mfu_pct", 40.0, False, False),
    ("idle.sync>=500us", "idle.sync", 500.0, False, False),
    ("busbw.dp.all_reduce<-10%", "busbw.dp.all_reduce", -0.1, True, True),
    ("exposed_comm.tp.all_gather>+1.5ms", "exposed_comm.tp.all_gather", 1500.0, False, True),
])
def test_conditions_read_as_documented(text, quantity, threshold, relative, is_change):
    c = gate.parse(text)
    assert (c.quantity, c.relative, c.is_change) == (quantity, relative, is_change)
    assert c.threshold == pytest.approx(threshold)


@pytest.mark.parametrize("text,words", [
    ("step_tme>+5%", ["no quantity 'step_tme'", "did you mean 'step_time'", "exposed_comm.<dim>",
                      "idle.<cause>"]),
    ("step_time>+5", ["needs a unit", "ms"]),
    ("peak_memory>+2ms", ["'ms' is not a unit of peak_memory", "GiB"]),
    ("step_time=5%", ["not QUANTITY OP THRESHOLD"]),
])
def test_a_bad_condition_is_refused_clearly(text, words):
    with pytest.raises(gate.GateError) as e:
        gate.parse(text)
    for w in words:
        assert w in str(e.value)


def test_every_exit_code_of_the_gate(made, tmp_path):
    base, slower, jitter = made["base"], made["slower"], made["jitter"]
    ok = meshscope("compare", base, jitter, "--fail-if", "compute>+0.2ms")
    assert ok.returncode == 0, ok.stderr
    assert "pass (holds, but within the noise)" in ok.stdout
    bad = meshscope("compare", base, slower, "--fail-if", "compute>+0.2ms",
                    "--fail-if", "step_time>+60%", "--junit", tmp_path / "j.xml",
                    "--markdown", tmp_path / "m.md")
    assert bad.returncode == 1, bad.stderr
    assert "FAIL: compute>+0.2ms" in bad.stdout and "pass: step_time>+60%" in bad.stdout
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    failed = [c.get("name") for c in suite.findall("testcase") if c.find("failure") is not None]
    assert failed == ["compute>+0.2ms"]
    md = (tmp_path / "m.md").read_text()
    assert "**Gate: failed** (1 of 2 condition(s) failed)" in md
    assert "| compute | 11.00 | 21.00 | +10.00 | 100% |" in md
    for args, words in [
        (("--fail-if", "stp_time>+5%"), ["no quantity 'stp_time'", "the quantities are"]),
        (("--fail-if", "tokens_per_s<-5%"), ["does not measure tokens_per_s"]),
    ]:
        proc = meshscope("compare", base, slower, *args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr and all(w in proc.stderr for w in words)
    proc = meshscope("compare", base, tmp_path / "nope", "--fail-if", "step_time>+5%")
    assert proc.returncode == 2 and "nope" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    proc = meshscope("compare", base, tmp_path / "broken")
    assert proc.returncode == 2 and "summary.json" in proc.stderr and "not readable JSON" \
        in proc.stderr


def test_a_change_relative_to_zero_is_bad_input_never_a_failed_gate(tmp_path):
    """Issue 45 item 3 / 46: ``exposed_comm.pp>+10%`` on a baseline without a pipeline (0 ms)
    raised ZeroDivisionError, exit 1 — the "gate failed" code. It is exit 2, naming why."""
    proc = meshscope("compare", SAMPLES / "dp4-ddp", SAMPLES / "dp2-pp2-1f1b",
                     "--fail-if", "exposed_comm.pp>+10%")
    assert proc.returncode == 2, proc.stderr
    assert "exposed_comm.pp is 0 in dp4-ddp: a change relative to it has no meaning" in \
        proc.stderr and "Traceback" not in proc.stderr


def test_the_gates_files_are_replaced_whole_not_written_through_a_link(made, tmp_path):
    """Issue 46, case 11: --junit and --markdown wrote in place (a kill left the file
    truncated) and followed a symbolic link onto its target. They are written beside and
    renamed over: the link is replaced, its target untouched."""
    base, slower = made["base"], made["slower"]
    target = tmp_path / "theirs.txt"
    target.write_text("keep me")
    (tmp_path / "j.xml").symlink_to(target)
    (tmp_path / "m.md").write_text("old " * 10_000)
    proc = meshscope("compare", base, slower, "--fail-if", "compute>+0.2ms",
                     "--junit", tmp_path / "j.xml", "--markdown", tmp_path / "m.md")
    assert proc.returncode == 1, proc.stderr
    assert target.read_text() == "keep me" and not (tmp_path / "j.xml").is_symlink()
    assert ET.parse(tmp_path / "j.xml").getroot().find("testsuite").get("failures") == "1"
    md = (tmp_path / "m.md").read_text()
    assert "**Gate: failed** (1 of 1 condition(s) failed)" in md and "old old" not in md
    assert not list(tmp_path.glob(".*.tmp"))


def test_hollow_newer_and_foreign_reports_are_refused_not_compared(tmp_path):
    """Issue 46, case 11: a report holding nothing ({"schema_version": 4}, {}) or one of a
    newer schema (99) was compared as if real ("Compute shrank 81.65 ms"). Each is exit 2
    naming why."""
    cases = {"newer": ({"schema_version": 99}, "schema version 99, newer than this meshscope "
                                               f"reads (up to {REPORT_SCHEMA_VERSION})"),
             "none": ({}, "no schema_version: not a meshscope summary"),
             "hollow": ({"schema_version": 4}, "holds no step time and no per-rank breakdown")}
    for name, (doc, words) in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(doc))
        proc = meshscope("compare", SAMPLES / "dp4-ddp", tmp_path / name)
        assert proc.returncode == 2 and words in proc.stderr, (name, proc.stderr)
        assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_a_condition_with_a_lookalike_character_is_pointed_at():
    for text, words in (("step_time>\u22125%", "character 11 is '\u2212' (U+2212 MINUS SIGN): "
                                                "write '-'"),
                        ("step_time\uff1e5%", "character 10 is '\uff1e' (U+FF1E FULLWIDTH "
                                               "GREATER-THAN SIGN): write '>'")):
        with pytest.raises(gate.GateError) as e:
            gate.parse(text)
        assert words in str(e.value)


def test_a_runs_own_report_folder_is_named_by_its_run_and_a_run_against_itself_once():
    proc = meshscope("compare", SAMPLES / "dp4-ddp", SAMPLES / "dp2-pp2-1f1b" / "report")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "meshscope compare — dp4-ddp → dp2-pp2-1f1b"
    proc = meshscope("compare", SAMPLES / "dp4-ddp", SAMPLES / "dp4-ddp")
    assert proc.returncode == 0, proc.stderr
    notes = [l for l in proc.stdout.splitlines() if l.startswith("note:")]
    assert notes == ["note: samples/dp4-ddp: 2 profiled step(s): the noise of its "
                     "profiled-step figures is unknown (it needs three)"]


# -- kernel names --------------------------------------------------------------------------

@pytest.mark.parametrize("raw,key", [
    # one NCCL collective, three generations of its kernel's name
    ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "nccl:all_reduce"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "nccl:all_reduce"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "nccl:all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "nccl:send_recv"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "nccl:send_recv"),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "nccl:generic"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, "
     "at::detail::Array<char*, 1>)", "at::native::vectorized_elementwise_kernel"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 9, true>(float*, "
     "float const*, int, int, int)", "anonymous::softmax_warp_forward"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x256_16x3_nt_align4>("
     "cutlass_80_tensorop_s1688gemm_128x256_16x3_nt_align4::Params)",
     "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x256_16x3_nt_align4>"),
    ("Memcpy HtoD (Pinned -> Device)", "Memcpy HtoD (Pinned -> Device)"),
    ("ampere_sgemm_128x128_tn", "ampere_sgemm_128x128_tn"),
])
def test_kernel_names_fold_to_what_stays_the_same(raw, key):
    assert kernel_key(raw) == key


# -- HTA's trace-diff pair -----------------------------------------------------------------

_OPS = {"allreduce": "all_reduce", "sendrecv": "send_recv", "allgather": "all_gather",
        "reducescatter": "reduce_scatter", "broadcast": "broadcast", "reduce": "reduce"}


def _fold(name: str) -> str:
    """An independent folding for this test: innermost <…> and (…) removed until none is
    left, the last word kept; NCCL kernels by the word after Kernel_; CUTLASS's launcher
    with the kernel it launches."""
    m = re.match(r"(?:void )?nccl(?:Dev)?Kernel_([A-Za-z]+)", name)
    if m:
        return "nccl:" + _OPS.get(m.group(1).lower(), "generic")
    if name.startswith(("Memcpy", "Memset")):
        return name
    m = re.match(r"(?:void )?(cutlass::Kernel2?)<([^<>,]+)", name)   # a launcher: its kernel
    if m:
        return f"{m.group(1)}<{m.group(2)}>"
    s = name.replace("(anonymous namespace)", "anonymous")
    while True:
        t = re.sub(r"<[^<>]*>", "", s)
        t = re.sub(r"\([^()]*\)", "", t)
        if t == s:
            break
        s = t
    return s.split()[-1]


def _raw_kernels_per_step(path) -> pd.DataFrame:
    """Straight from the JSON: every kernel, copy and fill whose launching runtime call
    (same correlation id) starts inside a ProfilerStep range, with its folded name."""
    events = json.loads(gzip.open(path).read())["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X"
             and str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") in ("user_annotation", "cpu_op")]
    launch = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") \
                and "correlation" in e.get("args", {}):
            launch[e["args"]["correlation"]] = e["ts"]
    rows = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            t = launch.get(e.get("args", {}).get("correlation"))
            if t is not None and any(a <= t < b for a, b in steps):
                rows.append((_fold(e["name"]), e["name"], e["dur"]))
    df = pd.DataFrame(rows, columns=["key", "name", "dur"])
    df.attrs["steps"] = len(steps)
    return df


@pytest.fixture(scope="module")
def hta_pair(tmp_path_factory):
    control = shared_trace("gpu/hta/trace_diff/control")
    test = shared_trace("gpu/hta/trace_diff/test")
    reports = tmp_path_factory.mktemp("reports")
    proc = meshscope("compare", control, test, "--reports", reports, "--json", check=True)
    return control, test, reports, json.loads(proc.stdout)


def test_a_dimension_the_traces_cannot_attribute_is_unmeasured_not_a_pass(hta_pair,
                                                                          tmp_path):
    """Issue 45, item 3: docs/compare.md's own CI example, `--fail-if 'exposed_comm.dp>+2ms'`,
    read 0.000 → 0.000 ms and passed on HTA's trace-diff pair, whose communication carries no
    mesh names (filed under 'unknown'). It is unmeasured: exit 2 naming why; with
    --allow-unmeasured it is "not checked" in the text, the JUnit (skipped) and the Markdown,
    and the other conditions are judged as before."""
    control, test, reports, _ = hta_pair
    proc = meshscope("compare", control, test, "--reports", reports,
                     "--fail-if", "exposed_comm.dp>+2ms")
    assert proc.returncode == 2, proc.stderr
    assert "control does not measure exposed_comm.dp (its communication carries no mesh " \
           "names" in proc.stderr and "--allow-unmeasured" in proc.stderr
    proc = meshscope("compare", control, test, "--reports", reports, "--allow-unmeasured",
                     "--fail-if", "exposed_comm.dp>+2ms", "--fail-if", "step_time>+500%",
                     "--junit", tmp_path / "j.xml", "--markdown", tmp_path / "m.md")
    assert proc.returncode == 0, proc.stderr
    assert "gate [test] not checked: exposed_comm.dp>+2ms — control does not measure" in \
        proc.stdout and "gate [test] pass: step_time>+500%" in proc.stdout
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "0", "1")
    assert "1 not checked: not measured" in (tmp_path / "m.md").read_text()


def test_a_dimension_the_run_measures_or_does_not_have_is_judged():
    """The healthy twins: the runner's own runs name every group's dimension (dp4-ddp: dp is
    measured); tp2-pp2-interleaved has some communication filed under 'unknown' but no dp in
    its layout (run.json: dp=1), so its dp is a measured 0."""
    proc = meshscope("compare", SAMPLES / "dp4-ddp", SAMPLES / "dp2-pp2-1f1b",
                     "--fail-if", "exposed_comm.dp>+1000ms")
    assert proc.returncode == 0 and "pass: exposed_comm.dp>+1000ms" in proc.stdout, proc.stderr
    proc = meshscope("compare", SAMPLES / "tp2-pp2-interleaved", SAMPLES / "dp2-pp2-1f1b",
                     "--fail-if", "exposed_comm.dp>+1000ms")
    assert proc.returncode == 0, proc.stderr


def test_kernel_differences_equal_a_scan_of_the_raw_traces(hta_pair):
    control, test, _, doc = hta_pair
    (d,) = doc["diffs"]
    raw = [_raw_kernels_per_step(next(p.glob("*.json.gz"))) for p in (control, test)]
    want = {}
    for side, df in zip(("before", "after"), raw):
        g = df.groupby("key")["dur"].agg(["size", "sum"]) / df.attrs["steps"]
        for key, row in g.iterrows():
            want.setdefault(key, {})[side] = (row["size"], row["sum"])
    got = {k["key"]: k for k in d["kernels"]}
    assert set(got) == set(want)
    for key, sides in want.items():
        k = got[key]
        cb, tb = sides.get("before", (0.0, 0.0))
        ca, ta = sides.get("after", (0.0, 0.0))
        assert (k["count_before"], k["count_after"]) == (pytest.approx(cb), pytest.approx(ca))
        assert k["total_before_us"] == pytest.approx(tb)
        assert k["total_after_us"] == pytest.approx(ta)
        assert k["status"] == ("new" if not cb else "gone" if not ca else "both")
    # NCCL's kernels pair up by collective, not by their full names
    assert got["nccl:all_reduce"]["status"] == "both"
    assert got["nccl:send_recv"]["count_before"] == pytest.approx(7.0)


def test_hta_trace_diff_agrees_on_kernel_counts_and_time(hta_pair):
    """HTA's TraceDiff.compare_traces over every iteration, GPU events: per raw kernel name
    the counts and durations of each trace, and their difference, equal the reports'
    kernel_totals (what the diff folds)."""
    from hta.trace_diff import DeviceType, LabeledTrace, TraceDiff

    control, test, reports, _ = hta_pair
    c = LabeledTrace(label="control", trace_dir=str(control))
    t = LabeledTrace(label="test", trace_dir=str(test))
    hta = TraceDiff.compare_traces(c, t, control_iteration=c.iterations(),
                                   test_iteration=t.iterations(), device_type=DeviceType.GPU)
    ours = {}
    for side, path in (("control", control), ("test", test)):
        side_report = next(p for p in reports.iterdir() if p.name.startswith(path.name + "-"))
        kt = pd.read_parquet(side_report / "kernel_totals.parquet")
        ours[side] = kt.groupby("name")[["count", "total_us"]].sum()
    kernels = hta[hta.index.isin(set(ours["control"].index) | set(ours["test"].index))]
    assert len(kernels) > 150        # every kernel HTA counts, not a handful
    for name, row in kernels.iterrows():
        for side in ("control", "test"):
            mine = ours[side].loc[name] if name in ours[side].index else None
            assert row[f"{side}_counts"] == (mine["count"] if mine is not None else 0), name
            assert row[f"{side}_total_duration"] == pytest.approx(
                mine["total_us"] if mine is not None else 0), name
        diff_counts = (ours["test"]["count"].get(name, 0) - ours["control"]["count"].get(name, 0))
        assert row["diff_counts"] == diff_counts
    # and HTA has no GPU kernel the reports lack
    missing = set(hta.index) - set(kernels.index)
    assert not [n for n in missing if not n.startswith("ProfilerStep")], sorted(missing)[:5]


def _raw_step_and_compute_ms(folder: pathlib.Path) -> tuple[float, float]:
    """A raw scan of one trace of ``folder``: the mean ProfilerStep#N span, and the time in
    compute kernels (any kernel but NCCL's, overlaps counted once) per step, in ms."""
    (path,) = folder.glob("*.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = [e["dur"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"
                   and "nccl" not in e["name"].lower())
    busy, end = 0.0, -math.inf
    for start, stop in spans:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return sum(steps) / len(steps) / 1e3, busy / len(steps) / 1e3


def test_the_text_names_the_top_causes(hta_pair):
    control, test, _, doc = hta_pair
    (d,) = doc["diffs"]
    s = d["sentences"]
    # first what makes the pair unlike (issue 45: an A100 job of 8 ranks against a V100 one
    # of 2, control's deviceProperties and distributedInfo against test's), then the causes
    assert s[0] == ("Not like for like — device: NVIDIA A100-PG509-200 → Tesla "
                    "V100-SXM2-16GB; devices per trace: 8 → 2; world size: 8 → 2; ranks "
                    "compared by position: [3] → [1] (no rank id in common): read every cause "
                    "below with that in mind.")
    assert d["like_for_like"] is False and d["hardware_changed"] is True
    # then that each side is one rank of a larger job (the trust checks' missing ranks)
    assert s[1].startswith("Evidence — control: usable with caveats — across ranks: "
                           "missing-ranks; test: usable with caveats")
    # The numbers against scans of the raw traces written here (not pasted from the output):
    # a step is a ProfilerStep#N span (the device's window differs from the host's range by the
    # GPU's lag at its edges: within 0.1 ms); compute, the union of the non-NCCL kernels' time.
    raw = {side: _raw_step_and_compute_ms(path) for side, path in (("control", control),
                                                                   ("test", test))}
    m = re.match(r"Step time rose from ([\d.]+) ms \(control\) to ([\d.]+) ms \(test\)", s[2])
    assert m, s[2]
    assert float(m[1]) == pytest.approx(raw["control"][0], abs=0.1)
    assert float(m[2]) == pytest.approx(raw["test"][0], abs=0.1)
    assert "beyond the step-to-step noise" in s[2]
    m = re.match(r"Compute grew ([\d.]+) ms a step \((\d+)% of the change\)", s[3])
    assert m, s[3]
    grew = raw["test"][1] - raw["control"][1]
    assert float(m[1]) == pytest.approx(grew, abs=0.1)
    assert int(m[2]) == pytest.approx(100 * grew / (raw["test"][0] - raw["control"][0]), abs=1)
    assert s[3].endswith("(on other hardware: the device changed).")
    assert any(x.startswith("Other device work (copies, fills) grew") for x in s)
    assert d["residual_us"] == pytest.approx(0.0, abs=1e-6)
    assert sum(p["delta"] for p in d["parts"]) == pytest.approx(d["window"]["delta"])
    assert d["rank_match"] == "position" and d["ranks"][0]["rank_before"] == 3 \
        and d["ranks"][0]["rank_after"] == 1


# -- the samples: a slowed rank ------------------------------------------------------------

def test_a_slowed_rank_is_named_and_fails_the_gate(tmp_path):
    """samples/dp2-pp2-1f1b against samples/dp2-pp2-slow-rank1 (rank 1 sleeps 20 ms in every
    microbatch's forward): rank 1 named, the others' waits in the pipeline bubble, the
    straggler finding gained, and the 5% gate fails."""
    proc = meshscope("compare", SAMPLES / "dp2-pp2-1f1b", SAMPLES / "dp2-pp2-slow-rank1",
                     "--fail-if", "step_time>+5%", "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    (d,) = doc["diffs"]
    text = " ".join(d["sentences"])
    assert re.search(r"Rank 1 computes [\d.]+ ms more a step", text)
    assert "the other ranks wait for it" in text and "pipeline bubble (pp)" in text
    gained = [f for f in d["findings"] if f["status"] == "new"]
    assert [f["id"] for f in gained] == ["straggler"] and "Rank 1" in gained[0]["title"]
    (verdict,) = doc["gate"]
    assert verdict["failed"] and verdict["condition"] == "step_time>+5%"
    ranks = {r["rank_after"]: r for r in d["ranks"]}
    compute = {r: ranks[r]["after"]["compute"] - ranks[r]["before"]["compute"] for r in ranks}
    assert max(compute, key=compute.get) == 1


def test_a_run_against_itself_changes_nothing(tmp_path):
    proc = meshscope("compare", SAMPLES / "dp4-ddp", SAMPLES / "dp4-ddp", "--fail-if",
                     "step_time>+0%", "--fail-if", "compute>+0ms")
    assert proc.returncode == 0, proc.stdout
    assert "stayed" in proc.stdout and "no measurable change" in proc.stdout


# -- own runs ------------------------------------------------------------------------------

# Every rank waits 150 ms in its one microbatch's forward and in its backward (--inject
# fixed-work), one sequence a rank (--global-batch 4): 300 ms of a step does not depend on what
# else the machine runs, beside some 50 ms of compute. With 40 ms a phase and four sequences a
# rank (320 ms of 400), two healthy repeats differed by 9.7% in a full suite beside a benchmark
# that started and stopped HTA runs — a load the two runs did not share.
FIXED = [a for r in range(4) for a in ("--inject", f"fixed-work={r}:150")] + \
    ["--global-batch", 4, "--microbatches", 1]


@pytest.fixture(scope="module")
def own_runs(tmp_path_factory):
    """dp=4 DDP twice (healthy repeats) and dp=4 FSDP, the same model and seed; 8 steps, the
    last three profiled (the timers' noise from the four unprofiled steps after warm-up).

    The three run side by side: their steps are mostly the fixed waits, and whatever load
    the machine puts on the two repeats, they now share it (one after the other they took
    30 s)."""
    root = tmp_path_factory.mktemp("own")
    runs = {name: root / name for name in ("ddp-a", "ddp-b", "fsdp")}
    runs_side_by_side(*[["--layout", "dp=4", "--steps", 8, "--profile-steps", "5-7", *FIXED,
                         *extra, "--out", runs[name]]
                        for name, extra in (("ddp-a", []), ("ddp-b", []),
                                            ("fsdp", ["--dp-mode", "fsdp"]))])
    return runs


@pytest.mark.slow
def test_two_healthy_repeats_pass_the_gate(own_runs):
    proc = meshscope("compare", own_runs["ddp-a"], own_runs["ddp-b"], "--fail-if",
                     "step_time>+5%", "--fail-if", "exposed_comm.dp>+20ms", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    doc = json.loads(proc.stdout)
    assert [g["failed"] for g in doc["gate"]] == [False, False]
    (d,) = doc["diffs"]
    # it passes because the change is under 5%, or — on a machine loaded enough to move two
    # identical runs apart by more (seen beside four busy test processes) — within the noise
    step = d["step_time"]
    assert abs(step["rel"]) < 0.05 or step["within_noise"], step
    # the same collectives, the same count, the same bytes
    assert all(c["status"] == "both" and c["count_before"] == c["count_after"]
               and c["bytes_before"] == c["bytes_after"] for c in d["collectives"])


@pytest.mark.slow
def test_ddp_against_fsdp_names_the_communication_that_changed(own_runs):
    proc = meshscope("compare", own_runs["ddp-a"], own_runs["fsdp"], "--json", check=True)
    (d,) = json.loads(proc.stdout)["diffs"]
    colls = {(c["dim"], c["op"]): c["status"] for c in d["collectives"]}
    # DDP all-reduces the gradients; FSDP gathers the parameters and reduce-scatters the
    # gradients (gloo runs the reduce-scatter as an all-reduce: the algorithm's op is kept)
    assert colls == {("dp", "all_reduce"): "gone", ("dp", "all_gather"): "new",
                     ("dp", "reduce_scatter"): "new"}
    text = " ".join(d["sentences"])
    assert re.search(r"Communication operations changed — new: dp all_gather \([\d.]+ a step\), "
                     r"dp reduce_scatter \([\d.]+ a step\); gone: dp all_reduce", text)
    exposed = next(p for p in d["parts"] if p["name"] == "exposed_comm.dp")
    assert {s["label"] for s in exposed["sub"]} == {"all_gather", "all_reduce",
                                                     "reduce_scatter"}
    assert sum(s["delta"] for s in exposed["sub"]) == pytest.approx(exposed["delta"])
    # memory, with the memory issue: each rank's allocator peak (the runner records [memory]
    # events), and the headline peak the largest of the report's own per-step peaks
    assert [m["rank_after"] for m in d["memory"]] == [0, 1, 2, 3]
    for side, run in (("before", "ddp-a"), ("after", "fsdp")):
        ms = pd.read_parquet(own_runs[run] / "report" / "memory_steps.parquet")
        assert d["quantities"]["peak_allocated"][side] == pytest.approx(
            float(ms["peak_allocated_bytes"].max()))
        per_rank = ms.groupby("rank")["peak_allocated_bytes"].max()
        assert [m[f"allocated_{side}_bytes"] for m in d["memory"]] == \
            pytest.approx(per_rank.tolist())


def _docs_ci_conditions() -> list[str]:
    """The --fail-if conditions of docs/compare.md's GitHub Actions example, as written."""
    text = (ROOT / "docs" / "compare.md").read_text()
    block = text.split("# .github/workflows/perf.yml", 1)[1].split("```", 1)[0]
    return re.findall(r"--fail-if '([^']+)'", block)


def test_the_documented_ci_gate_fails_and_passes_as_the_change_says(hta_pair):
    """Issue 45, item 3: docs/compare.md's CI example, run as written. On the runner's own
    runs it fails where the change is a regression (a rank slowed by a known amount) and
    passes where nothing changed (a run against itself); on HTA's trace-diff pair (no mesh
    names, no step timers) it exits 2 naming each unmeasured quantity."""
    conds = _docs_ci_conditions()
    assert conds == ["step_time>+5%", "exposed_comm.dp>+2ms", "peak_memory>+1GiB"]
    args = [a for c in conds for a in ("--fail-if", c)]
    slowed = meshscope("compare", SAMPLES / "dp2-pp2-1f1b", SAMPLES / "dp2-pp2-slow-rank1",
                       *args)
    assert slowed.returncode == 1, slowed.stderr
    assert "FAIL: step_time>+5%" in slowed.stdout
    same = meshscope("compare", SAMPLES / "dp2-pp2-1f1b", SAMPLES / "dp2-pp2-1f1b", *args)
    assert same.returncode == 0, same.stderr
    assert same.stdout.count("pass: ") == 3
    control, test, reports, _ = hta_pair
    foreign = meshscope("compare", control, test, "--reports", reports, *args)
    assert foreign.returncode == 2 and "does not measure" in foreign.stderr, foreign.stderr


def test_a_pair_that_is_not_alike_says_so_first_everywhere(hta_pair, tmp_path):
    """Issue 45, item 2: HTA's trace-diff pair (an A100 job of 8 ranks against a V100 job of
    2) says it is not like for like before any cause — in the Markdown, the JUnit file and the
    compare page — and its healthy twin, a run against itself, says nothing of the kind."""
    from meshscope.analysis.compare.sides import open_side
    from meshscope.dashboard.pages.compare import pair_sections

    control, test, reports, _ = hta_pair
    proc = meshscope("compare", control, test, "--reports", reports, "--fail-if",
                     "step_time>+500%", "--junit", tmp_path / "j.xml", "--markdown",
                     tmp_path / "m.md")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "m.md").read_text().splitlines()
    assert md[2].startswith("**Not like for like** (control → test): device: NVIDIA "
                            "A100-PG509-200 → Tesla V100-SXM2-16GB")
    assert md.index(md[2]) < next(i for i, ln in enumerate(md) if ln.startswith("**Gate"))
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert "world size: 8 → 2" in props["not_like_for_like.test"]
    # and what each side's numbers rest on: one rank of a larger job each
    assert props["evidence.control"].startswith("usable with caveats — across ranks: "
                                                "missing-ranks")
    assert props["evidence.test"].startswith("usable with caveats")
    assert suite.find("testcase/system-err").text.startswith("Not like for like — device")
    d = diff(open_side(control, reports_dir=reports), open_side(test, reports_dir=reports))
    first = pair_sections(d)[0].items[0]
    assert first.id == "compare-unlike" and first.warn
    same = diff(open_side(SAMPLES / "dp4-ddp"), open_side(SAMPLES / "dp4-ddp"))
    assert same.unlike == [] and not same.hardware_changed
    assert not same.sentences[0].startswith("Not like for like")
    # each side's evidence, then the sentences (both trusted: no evidence sentence)
    assert [i.id for i in pair_sections(same)[0].items[:3]] == [
        "compare-evidence-before", "compare-evidence-after", "compare-sentence-0"]


def test_what_makes_two_runs_unlike_is_named_field_by_field():
    """alike.differences on two hand-made summaries, each field known by construction."""
    from meshscope.analysis.compare import alike
    from meshscope.analysis.compare.sides import Side
    from meshscope.analysis.report import reader

    def side(name, env, device="gpu", ranks=(0, 1)):
        doc = {"schema_version": 4, "device": device, "ranks": list(ranks), "steps": [1],
               "step_time_us": 1000.0, "step_time_source": "window", "window_us": 1000.0,
               "environment": env}
        return Side(name=name, path=pathlib.Path(name), report_dir=pathlib.Path(name),
                    summary=reader.read_summary(doc), info=None)
    a = side("a", {"devices": ["NVIDIA H100"], "world_sizes": [2], "backends": ["nccl"],
                   "nccl_versions": ["2.21.5"], "cuda_runtime_versions": ["12.4"],
                   "profiler_settings": ["record_shapes"], "step_definitions": ["ProfilerStep"]})
    b = side("b", {"devices": ["NVIDIA H100"], "world_sizes": [2], "backends": ["nccl"],
                   "nccl_versions": ["2.25.1"], "cuda_runtime_versions": ["12.4"],
                   "profiler_settings": ["record_shapes with_stack"],
                   "step_definitions": ["ProfilerStep"]})
    assert alike.differences(a, b, "id") == [
        "NCCL version: 2.21.5 → 2.25.1",
        "profiler settings: record_shapes → record_shapes with_stack"]
    assert not alike.hardware_changed(a, b)
    c = side("c", {"devices": ["NVIDIA A100"], "world_sizes": [4]}, ranks=(0, 1, 2, 3))
    assert alike.differences(a, c, "none")[:2] == ["device: NVIDIA H100 → NVIDIA A100",
                                                   "backend: nccl → not recorded"]
    assert "world size: 2 → 4" in alike.differences(a, c, "none")
    assert alike.hardware_changed(a, c)
    assert alike.differences(a, a, "id") == []
