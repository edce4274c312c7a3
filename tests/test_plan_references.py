"""The planner against the published reference jobs (bench/plan_references/jobs.csv): the set
is what the issue asks of it, and the accuracy measured on it does not fall behind what
docs/layouts.md reports. The figures are the publications' (each row names its source); the
bounds below are the measured levels of this version, rounded up — not the issue's targets,
which docs/layouts.md compares them with."""
import statistics
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT))
from bench import plan_accuracy  # noqa: E402
from bench.plan_references import jobs as references  # noqa: E402
from meshscope.layouts.plan.job_step import MOE_ERROR_PERCENTILES  # noqa: E402

ROWS = references.load()


@pytest.fixture(scope="module")
def evaluated():
    return plan_accuracy.evaluate(ROWS)


def test_the_reference_set_is_what_the_issue_asks():
    """At least 50 published jobs from at least 10 sources, every one with its source, exact
    settings and a model file; dense BF16, FP8, MoE and FSDP jobs; B200, H200 and MI300X."""
    assert len(ROWS) >= 50 and len({r.source for r in ROWS}) >= 10
    assert len({r.id for r in ROWS}) == len(ROWS)
    for r in ROWS:
        assert r.ref and r.notes and r.metric in references.METRICS, r.id
        assert (references.HERE / "models" / f"{r.model}.json").is_file(), r.id
        assert r.gpus == r.dp * r.tp * r.pp * r.cp and r.gbs % (r.dp * r.mbs) == 0, r.id
        references.job(r)            # every row builds (model, layout, device, training)
    families = {f for r in ROWS for f in r.families}
    assert {"dense_bf16", "fp8", "moe", "fsdp", "small_model_dp", "scaling"} <= families
    devices = {references.device_of(r.device).name for r in ROWS}
    assert {"B200", "H200", "MI300X", "H100-SXM", "A100-80GB", "H800"} <= devices
    assert sum(1 for r in ROWS if r.memory_gib) >= 10
    assert sum(1 for r in ROWS if r.choice) >= 20


def test_published_figures_convert_by_their_own_definitions():
    """The Megatron table's TFLOP/s a GPU, with eq. 3's 96lh² + 16slh + 6hV a token, is the
    tokens/s the table's own step implies: 1.7B on 32 GPUs at 137 TFLOP/s."""
    row = next(r for r in ROWS if r.id == "megatron-1.7b")
    spec = references.spec_of(row)
    per_token = 96 * 24 * 2304 ** 2 + 16 * 2048 * 24 * 2304 + 6 * 2304 * 51200
    assert references.published_tokens_per_s(row, spec, references.device_of(row.device)) \
        == pytest.approx(137e12 / per_token)
    ds = next(r for r in ROWS if r.id == "deepseek-v3-h800")
    # 180K H800 GPU hours per trillion tokens
    assert references.published_tokens_per_s(ds, None, None) == pytest.approx(
        1e12 / 180e3 / 3600)


def test_accuracy_on_the_rows_no_constant_was_fitted_on(evaluated):
    held = [(r, err) for r, _, _, err, _, _ in evaluated if not r.fit]

    def median(family=None):
        return statistics.median(abs(e) for r, e in held if family is None
                                 or family in r.families)

    assert median() <= 0.10
    assert median("dense_bf16") <= 0.09
    assert median("fp8") <= 0.10
    assert median("fsdp") <= 0.10
    assert median("small_model_dp") <= 0.09
    assert median("scaling") <= 0.13
    assert median("moe") <= 0.26
    dense = [abs(e) for r, e in held if "dense_bf16" in r.families]
    assert max(dense) <= 0.25             # every dense BF16 row within 25%
    assert sum(abs(e) <= 0.25 for _, e in held) >= 0.9 * len(held)
    # the range a MoE plan prints is the spread of these rows' errors
    assert plan_accuracy.moe_error_percentiles(held) == pytest.approx(
        MOE_ERROR_PERCENTILES, abs=0.001)
    mem = [abs(m / r.memory_gib - 1) for r, _, _, _, m, _ in evaluated if r.memory_gib]
    assert statistics.median(mem) <= 0.07
    assert sum(e <= 0.15 for e in mem) >= 16


def test_the_published_layout_is_within_the_tie_band(capsys):
    """For the jobs whose publisher chose the layout (recipes, papers), every layout of the same
    job is planned: the published one is within the predicted tie band (the family's median
    error) of the fastest that fits. Measured: 41 of 45 (issue 49 asks 90%) since Megatron-LM's
    Table 1 rows run as their script runs them and Transformer Engine's fp8 weights keep their
    transposed copy; docs/layouts.md names the four others (published layouts the memory model
    says run out of memory)."""
    result = plan_accuracy.ranking_checks([r for r in ROWS if r.choice])
    assert result["rows"] >= 40
    assert result["within"] >= 0.9 * result["rows"]
