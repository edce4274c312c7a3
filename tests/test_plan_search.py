"""`meshscope plan` as the decision a team makes (issue 49): given only a model, a world, a
sequence length, a global batch and a device, the plan searches micro-batch size,
recomputation and the data-parallel mode within every layout and answers with layouts that
fit; --style narrows the search; when nothing fits it names the changes that make a layout
fit — and applying one does (the independent check). Memory is printed in binary units."""
import dataclasses
import json
import re

import pytest

from conftest import ROOT, meshscope
from meshscope.layouts.plan import Candidate, ModelSpec
from meshscope.layouts.plan.candidate import DP_MODES
from meshscope.layouts.plan.devices import lookup
from meshscope.layouts.plan.job_memory import job_memory
from meshscope.layouts.plan.job_step import JobOptions, predict_job
from meshscope.layouts.plan.search import step_lower_bound_us
from meshscope.layouts.plan.topology import Topology
from meshscope.layouts.plan.traffic import transfers
from meshscope.layouts.plan.training import Training
from meshscope.parallel.layout import parse_layout

MODELS = ROOT / "bench" / "plan_references" / "models"
LLAMA70B = MODELS / "llama-3-70b.json"
LLAMA8B = MODELS / "llama-3-8b.json"
H100 = lookup("H100")
GIB = 2 ** 30
# The four things a team knows before choosing a layout, and nothing else.
ONLY_THE_JOB = ("--model-json", LLAMA70B, "--world", 64, "--seq-len", 8192, "--global-batch",
                512, "--device", "H100")


@pytest.fixture(scope="module")
def seventy_b():
    """(the plan as JSON, the plan as text) of Llama 3 70B on 64 H100s with no other flag."""
    p = json.loads(meshscope("plan", *ONLY_THE_JOB, "--json", check=True).stdout)
    text = meshscope("plan", *ONLY_THE_JOB, "--top", 5, check=True).stdout
    return p, text


def test_70b_on_64_h100s_with_no_other_flag_answers_with_layouts_that_fit(seventy_b):
    """The issue's first case: the old defaults (DDP, 4 microbatches, no recomputation)
    fitted nothing (528 GiB a GPU at best); searched, the top five fit H100's 80 GiB, each
    with its micro-batch size, recomputation and data-parallel mode."""
    p, text = seventy_b
    assert not p["warnings"] and p["searched"] == ["micro-batch size", "recompute",
                                                    "dp mode"]
    top = p["rows"][:5]
    assert len(top) == 5
    for r in top:
        c = r["candidate"]
        assert r["fits"] is True and r["peak_memory_bytes"] <= 80 * GIB
        assert c["micro_batch_size"] * c["microbatches"] * c["sizes"]["dp"] == 512
        assert c["recompute"] in ("none", "selective", "full") and c["dp_mode"] in DP_MODES
    steps = [r["estimate"]["step_time_us"] for r in p["rows"]]
    assert steps == sorted(steps)
    # the text: the three knobs as columns, memory in GiB only, the ties marked
    head = next(line for line in text.splitlines() if "peak mem" in line)
    assert re.search(r"\bmbs\b.*\brecompute\b.*\bdp mode\b.*peak mem", head)
    rows = [line for line in text.splitlines() if re.match(r"^\s*\d+[≈ ] ", line)]
    assert len(rows) == 5
    for line, r in zip(rows, top):
        c = r["candidate"]
        assert f" {r['name']} " in line and f" {c['micro_batch_size']} " in line
        assert f" {c['recompute']} " in line and f" {c['dp_mode']} " in line
        assert f"{r['peak_memory_bytes'] / GIB:.1f} GiB" in line
    assert not re.search(r"\d (GB|MB|KB)(?!/)", text)      # one unit family (GB/s aside)
    assert "≈ marks" in text and "WARNING" not in text


def test_the_old_defaults_pinned_still_fit_nothing_and_say_what_would():
    """Pinning what used to be the defaults (DDP, 4 microbatches, no recomputation) is the
    issue's no-fit case again (528.4 GiB a GPU at best): a warning, no tie legend among
    layouts none of which fit, and the change that makes one fit: with 4 microbatches a
    data-parallel rank's microbatch is 2 to 128 sequences of 8,192 tokens — one sequence
    a microbatch fits."""
    text = meshscope("plan", *ONLY_THE_JOB, "--dp-modes", "ddp", "--microbatches", 4,
                     "--recompute", "none", "--top", 3, check=True).stdout
    assert "WARNING: no layout fits the device's memory: the smallest needs 528.4 GiB" in text
    assert "≈" not in text and "--micro-batch-size 1 " in text


def test_style_fsdp_plans_fsdp_sharding_first():
    """Llama 3 8B on 8 H100s with --style fsdp: the layouts are FSDP's (resharding after
    forward or keeping the stage gathered); --style megatron plans none of them."""
    args = ("--model-json", LLAMA8B, "--world", 8, "--seq-len", 8192, "--global-batch", 32,
            "--device", "H100", "--top", 5)
    fsdp = json.loads(meshscope("plan", *args, "--style", "fsdp", "--json",
                                check=True).stdout)
    assert fsdp["rows"] and all(r["fits"] for r in fsdp["rows"])
    assert {r["candidate"]["dp_mode"] for r in fsdp["rows"]} <= {"fsdp", "fsdp_noreshard"}
    assert fsdp["training"]["framework"] == "torch"
    mega = json.loads(meshscope("plan", *args, "--style", "megatron", "--json",
                                check=True).stdout)
    assert mega["rows"] and not any(r["candidate"]["dp_mode"].startswith("fsdp")
                                    for r in mega["rows"])


def test_when_nothing_fits_each_printed_change_makes_a_layout_fit():
    """70B on 8 H100s (4,096 tokens, 8 sequences): nothing fits even searched. The plan
    names single changes with the memory each frees — and each, applied, plans layouts that
    fit (the check is the planner run again with the change, not the advice's own
    figure)."""
    args = ("--model-json", LLAMA70B, "--world", 8, "--seq-len", 4096, "--global-batch", 8,
            "--device", "H100")
    p = json.loads(meshscope("plan", *args, "--json", check=True).stdout)
    assert all(r["fits"] is False for r in p["rows"]) and not any(r["tie"] for r in p["rows"])
    changes = p["fit_changes"]
    assert changes
    flags = [c["flag"] for c in changes]
    assert len(flags) == len(set(flags))            # one world, one device: the first
    for c in changes:
        assert c["peak_bytes"] <= c["memory_bytes"]
        after = json.loads(meshscope("plan", *args, c["flag"], c["value"], "--top", 1,
                                     "--json", check=True).stdout)
        assert not after["warnings"] and after["rows"][0]["fits"] is True, c["text"]


L8 = ModelSpec.from_json(LLAMA8B, seq_len=8192)


def test_fsdp_without_resharding_gathers_once_a_step_and_holds_the_stage():
    """FSDP2 under gradient accumulation (4 microbatches): resharding after forward gathers
    every unit before each microbatch's forward and again before its backward (8 a step)
    and reduce-scatters each microbatch; kept gathered (``fsdp_noreshard``) it gathers
    once and reduces once a step, and holds Llama 3 8B's 8,030,261,248 parameters whole in
    bf16 (its published count) where resharding holds its two largest units."""
    t = Training(framework="torch", precision="mixed", style="fsdp")
    cand = Candidate(parse_layout("dp=8"), microbatches=4, dp_mode="fsdp", global_batch=32)
    keep = dataclasses.replace(cand, dp_mode="fsdp_noreshard")

    def counts(c):
        rows = [x for x in transfers(L8, c, training=t) if x.dim == "dp"]
        return ({x.count for x in rows if x.op == "all_gather"},
                {x.count for x in rows if x.op == "reduce_scatter"})

    assert counts(cand) == ({8}, {4})
    assert counts(keep) == ({1}, {1})
    held = job_memory(L8, keep, t)[0].terms["fsdp_unsharded_params"]
    assert held == 8_030_261_248 * 2
    assert job_memory(L8, cand, t)[0].terms["fsdp_unsharded_params"] < held / 5
    step = {c.dp_mode: predict_job(L8, c, t, H100, Topology.for_device(H100, None)
                                   ).step_time_us for c in (cand, keep)}
    assert step["fsdp_noreshard"] < step["fsdp"]      # a fourth of the gathers


@pytest.mark.parametrize("layout,mode,m,rc", [
    ("dp=8", "fsdp", 4, "none"), ("dp=2,tp=4", "zero1", 16, "full"),
    ("dp=2,pp=4", "ddp", 16, "selective"), ("dp=4,pp=2", "fsdp_noreshard", 8, "none")])
def test_the_search_bound_never_exceeds_the_predicted_step(layout, mode, m, rc):
    """The branch and bound times layouts in the order of a compute-only bound and skips
    those whose bound exceeds what it keeps: sound only if the bound is never above the
    step it bounds."""
    t = Training(framework="megatron", precision="mixed")
    topo = Topology.for_device(H100, None)
    c = Candidate(parse_layout(layout), microbatches=m, dp_mode=mode, global_batch=64,
                  recompute=rc, schedule="1f1b")
    est = predict_job(L8, c, dataclasses.replace(t, recompute=rc), H100, topo)
    bound = step_lower_bound_us(L8, c, t, H100, JobOptions())
    assert 0.5 * est.step_time_us < bound <= est.step_time_us
