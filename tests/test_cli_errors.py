"""Bad input: one line naming the problem, exit code 2, and nothing started or written."""
import gzip
import pathlib
import json
import shutil

import pandas as pd
import pytest

from conftest import ROOT, meshscope


def _one_error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("meshscope: error: ")
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_more_stages_than_layers_is_refused_before_launch(tmp_path):
    out = tmp_path / "run"
    proc = meshscope("run", "--layout", "dp=2,pp=64", "--out", out)
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "pp=64" in line and "layers" in line
    assert not out.exists(), "nothing may be written before the layout is validated"


def test_unknown_schedule_is_refused_before_launch(tmp_path):
    out = tmp_path / "run"
    proc = meshscope("run", "--schedule", "zigzag", "--out", out)
    assert proc.returncode == 2
    assert "zigzag" in _one_error_line(proc)
    assert not out.exists()


def test_analyze_folder_without_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    proc = meshscope("analyze", tmp_path)
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert str(tmp_path) in line and "no trace files" in line


def test_analyze_only_broken_traces_names_each_file(tmp_path):
    (tmp_path / "rank0.json").write_text('{"traceEvents": [{"ph": "X", "na')
    (tmp_path / "rank1.json.gz").write_bytes(gzip.compress(b"")[:10])
    (tmp_path / "rank2.json").write_text("")
    proc = meshscope("analyze", tmp_path)
    assert proc.returncode == 2
    line = _one_error_line(proc)
    for name, problem in (("rank0.json", "truncated"), ("rank1.json.gz", "gzip"),
                          ("rank2.json", "empty")):
        assert name in line and problem in line


def _analyze_sample_with_half_of(tmp_path, damaged: str) -> dict:
    """Copy the dp2-pp2-1f1b sample without its report, cut the file ``damaged`` (relative to
    the run) in half as a killed writer would, analyse it: exit 0 and the summary."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run)
    shutil.rmtree(run / "report")
    victim = run / damaged
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    proc = meshscope("analyze", run, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_one_damaged_rank_leaves_the_others_analysed(tmp_path):
    """A truncated trace (a killed job): named in the report, the other ranks still analysed."""
    summary = _analyze_sample_with_half_of(tmp_path, "traces/rank1.json.gz")
    assert summary["ranks"] == [0, 2, 3]
    assert summary["missing_ranks"] == [1]
    assert len(summary["problems"]) == 1 and "rank1.json.gz" in summary["problems"][0]


@pytest.mark.parametrize("args,needle", [
    (["--layout", "tp=3"], "tp=3 does not divide"),
    (["--layout", "pp=5"], "pp=5 is larger than the model's 4 layers"),
    (["--layout", "cp=3"], "cp=3 needs the sequence length"),
    (["--layout", "dp=2,ep=2", "--moe-experts", "3"], "ep=2 does not divide the 3 experts"),
    (["--layout", "dp=2,ep=2"], "needs a mixture-of-experts model"),
    (["--layout", "pp=2", "--schedule", "1f1b", "--microbatches", 1], "at least 2 microbatches"),
    (["--layout", "pp=2", "--schedule", "zbv", "--virtual-stages", 3], "exactly 2 stage"),
    (["--layout", "dp=2,pp=2", "--nproc-per-node", 2], "needs 4 ranks"),
    (["--inject", "crash=9:1"], "rank 9 is not in 0..3"),
    (["--layout", "pp=2", "--stage-layers", "3,3"], "--stage-layers 3,3"),
])
def test_layout_constraints_refused_before_launch(tmp_path, args, needle):
    out = tmp_path / "run"
    proc = meshscope("run", *args, "--out", out)
    assert proc.returncode == 2, proc.stderr
    assert needle in _one_error_line(proc)
    assert not out.exists()


def test_each_kind_of_bad_file_is_named_and_the_good_rank_analysed(tmp_path):
    """A non-JSON file and JSON without traceEvents: one problem line each, naming the file;
    the usable rank is still analysed (exit 0)."""
    good = ROOT / "samples" / "dp2-pp2-1f1b" / "traces" / "rank0.json.gz"
    shutil.copy(good, tmp_path / "rank0.json.gz")
    (tmp_path / "rank1.json").write_text("this is not JSON at all")
    (tmp_path / "rank2.json").write_text(json.dumps({"schemaVersion": 1, "events": []}))
    proc = meshscope("analyze", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ranks"] == [0]
    problems = summary["problems"]
    assert len(problems) == 2, problems
    by_file = {p.split(":")[0].rsplit("/", 1)[-1]: p for p in problems}
    assert "not valid JSON" in by_file["rank1.json"]
    assert "traceEvents" in by_file["rank2.json"]


def test_two_files_claiming_one_rank_stop_the_analysis(tmp_path):
    """A second trace whose distributedInfo says rank 0 (a copy, here): both named, exit 2,
    and the message says how to settle it."""
    good = ROOT / "samples" / "dp2-pp2-1f1b" / "traces" / "rank0.json.gz"
    shutil.copy(good, tmp_path / "rank0.json.gz")
    shutil.copy(good, tmp_path / "copy-of-rank0.json.gz")
    proc = meshscope("analyze", tmp_path, "--json")
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "2 files claim rank 0" in line and "--rank-regex" in line
    assert "rank0.json.gz" in line and "copy-of-rank0.json.gz" in line


def test_damaged_flight_recorder_dump_is_named_and_the_others_diagnosed(tmp_path):
    """A truncated comms/rank1.json: named under problems; the other ranks' dumps are still
    compared, and rank 1 is not called missing from collectives it simply has no record of."""
    summary = _analyze_sample_with_half_of(tmp_path, "comms/rank1.json")
    assert summary["ranks"] == [0, 1, 2, 3]
    assert len(summary["problems"]) == 1, summary["problems"]
    assert "rank1.json" in summary["problems"][0]
    assert "Flight Recorder" in summary["problems"][0]
    assert not any(1 in h["ranks_missing"] for h in summary["hangs"]), summary["hangs"]


def test_damaged_step_timer_file_is_named_and_the_other_ranks_kept(tmp_path):
    """A truncated steps/rank2.parquet: named under problems; the other ranks' step timers
    still make the step heatmap."""
    summary = _analyze_sample_with_half_of(tmp_path, "steps/rank2.parquet")
    assert len(summary["problems"]) == 1, summary["problems"]
    assert "rank2.parquet" in summary["problems"][0]
    heatmap = pd.read_parquet(tmp_path / "run" / "report" / "step_heatmap.parquet")
    assert sorted(heatmap["rank"].unique()) == [0, 1, 3]


@pytest.mark.parametrize("flag,pattern,said", [
    ("--comm-kernel-regex", "nccl(", "--comm-kernel-regex 'nccl(' is not a regular expression"),
    ("--step-annotation", "step[", "--step-annotation 'step[' is not a regular expression"),
    ("--rank-regex", r"rank\d+", r"--rank-regex 'rank\\d+' must have exactly one group"),
])
def test_a_bad_pattern_is_one_line_in_the_command_and_an_input_error_in_the_api(
        tmp_path, flag, pattern, said):
    """Each flag's regular expression is checked in one place (``AnalysisOptions.patterns``):
    the command exits 2 with one line before reading a trace and writes no report; the API
    raises InputError naming the run folder (an unchecked --comm-kernel-regex used to reach
    the API's caller as re.error)."""
    from meshscope.analysis import api
    from meshscope.analysis.errors import InputError

    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp4-ddp", run, ignore=shutil.ignore_patterns("report"))
    proc = meshscope("analyze", run, flag, pattern)
    assert proc.returncode == 2 and said in _one_error_line(proc)
    assert not (run / "report" / "summary.json").exists()
    field = {"--comm-kernel-regex": "comm_kernel_re", "--step-annotation": "step_annotation",
             "--rank-regex": "rank_regex"}[flag]
    with pytest.raises(InputError) as raised:
        api.open(run, **{field: pattern}, cache_dir=None)
    assert str(raised.value).startswith(f"{run}: ") and said in str(raised.value)


def test_each_analysis_option_is_declared_once_with_its_flag_and_key():
    """Issue 37: an option's flag, help and place in the reuse key are declared with it
    (``AnalysisOptions`` field metadata); ``analyze`` and ``compare`` offer exactly those flags
    (and the budgets', and --no-cache), and the reuse key holds exactly the options that change
    numbers."""
    import dataclasses

    from click.testing import CliRunner

    from meshscope.analysis.ingest import budgets
    from meshscope.analysis.report.options import AnalysisOptions
    from meshscope.cli import main

    declared = {flag.flag for _, flag, _ in AnalysisOptions.flags()}
    expected = declared | set(budgets.FLAGS.values()) | {"--no-cache"}
    for command in ("analyze", "compare"):
        text = CliRunner().invoke(main, [command, "--help"], terminal_width=200).output
        shown = {w for w in text.split() if w.startswith("--")}
        assert expected <= shown, (command, expected - shown)
    keyed = {flag.key for _, flag, _ in AnalysisOptions.flags() if flag.key}
    opts = AnalysisOptions(snapshots=(pathlib.Path(__file__),), device_memory=1 << 30,
                           fr_groups=("default_pg",), fr_ranks=(0,))
    assert set(opts.key_fields("b")) == keyed
    # where and how fast the work runs changes no number: not in the key
    assert {"workers", "engine", "scheduler"} & set(opts.key_fields()) == set()
    assert dataclasses.replace(opts, workers=7, engine="dask").key_fields("b") == \
        opts.key_fields("b")
