"""Findings from hand-made inputs: which finding a cause becomes, what it costs, and what does
not become a finding at all."""
import pandas as pd
import pytest

from meshscope.analysis.report import findings as fm


def _breakdown(per_rank: dict[int, dict]) -> pd.DataFrame:
    rows = []
    for r, vals in per_rank.items():
        rows.append({"rank": r, "step": 0, "window_us": 100_000.0, "compute_us": 60_000.0,
                     "idle_us": 1_000.0, "overlap_pct": 10.0, "exposed_comm_dp_us": 5_000.0,
                     **vals})
    return pd.DataFrame(rows)


def _inputs(**kw) -> fm.FindingInputs:
    base = dict(step_us=100_000.0, noise_us=1_000.0, breakdown=_breakdown({0: {}, 1: {}}),
                bubbles=pd.DataFrame(), schedule=None, stages=1, microbatches=4,
                virtual_stages=1, straggler=None, savings=pd.DataFrame(), imbalance=None,
                dim_savings={}, hangs=None, slow_steps=[], warmup_steps=[],
                step_times=pd.Series(dtype=float), median_step_us=100_000.0)
    base.update(kw)
    return fm.FindingInputs(**base)


def _straggler(rank=1, saving=40_000.0):
    return {"rank": rank, "saving_us": saving, "saving_pct": saving / 1000.0,
            "reference": "stage peers [0]", "peers": [0], "noise_us": 500.0, "stage": 0,
            "critical_path_share": 0.8, "wait_caused_us": saving}


def test_a_gpu_that_idles_while_its_peers_wait_is_host_bound():
    bd = _breakdown({0: {"idle_us": 2_000.0}, 1: {"idle_us": 32_000.0}})
    found = fm.findings(_inputs(breakdown=bd, straggler=_straggler(), on_gpu=True))
    assert [f.id for f in found] == ["host-bound"]
    assert "host does not launch work" in found[0].remedy
    assert found[0].cost_us == 40_000.0 and found[0].severity == "high"
    # The same on a CPU trace (no device to idle), or with the time in compute: a straggler.
    assert fm.findings(_inputs(breakdown=bd, straggler=_straggler()))[0].id == "straggler"
    busy = _breakdown({0: {"compute_us": 40_000.0}, 1: {"compute_us": 80_000.0}})
    assert fm.findings(_inputs(breakdown=busy, straggler=_straggler(), on_gpu=True))[0].id == \
        "straggler"


def test_the_bubble_costs_its_closed_form_and_its_remedy_doubles_the_microbatches():
    bub = pd.DataFrame({"rank": [0, 1], "stage": [0, 1], "step": [0, 0],
                        "pipeline_window_us": [90_000.0, 90_000.0], "busy_us": [50_000.0] * 2,
                        "bubble_fraction": [0.45, 0.45], "theory_fraction": [0.2, 0.2],
                        "replayed_bubble_fraction": [0.3, 0.3]})
    (f,) = fm.findings(_inputs(bubbles=bub, schedule="1f1b", stages=2))
    assert f.id == "pipeline-bubble" and f.cost_us == pytest.approx(0.2 * 90_000.0)
    assert "8 microbatches" in f.remedy and "11%" in f.remedy     # 1/(8+1)
    # ZB1P with 2 stages and 4 microbatches: 12 busy chunk slots (F, B, W of 4), 1 idle: 1/13
    assert "an interleaved schedule, or a zero-bubble schedule (ZB1P" in f.remedy
    assert "8%)" in f.remedy
    assert f.evidence["excess_explained_by"].startswith("transfer time")
    # a zero-bubble run's bubble (2 stages, 4 microbatches, 2 chunks each: 1/(3·2·4+1) = 4%)
    # is its finding too, and its remedy names no other schedule — only more microbatches
    (zb,) = fm.findings(_inputs(bubbles=bub, schedule="zero-bubble", stages=2,
                                virtual_stages=2))
    assert zb.cost_us == pytest.approx(90_000.0 / 25)
    assert zb.remedy == "8 microbatches would bring the closed form to 2%"      # 1/49


def test_what_the_noise_explains_is_no_finding():
    inp = _inputs(dim_savings={"dp": 600.0, "tp": 4_000.0}, noise_us=1_500.0)
    ids = [f.id for f in fm.findings(inp)]
    assert ids == ["exposed-comm-tp"]                    # dp's 0.6 ms is below the noise
    (f,) = fm.findings(inp)
    assert f.severity == "low"                           # 4 ms < 3 × 1.5 ms: capped
    assert fm.findings(_inputs(dim_savings={"tp": 15_000.0}, noise_us=1_500.0))[0].severity \
        == "high"


def test_hangs_and_desyncs_come_first_without_a_cost():
    hangs = pd.DataFrame([{"process_group": "0", "group_desc": "default_pg", "seq": 7,
                           "kind": "collective", "op": "gloo:all_reduce", "verdict": "missing",
                           "ranks_present": [0, 1], "ranks_missing": [2],
                           "last_seq_of_missing": {2: 6}, "detail": "ranks [2] never …"}])
    found = fm.findings(_inputs(hangs=hangs, straggler=_straggler()))
    assert [f.id for f in found] == ["hang", "straggler"]
    assert found[0].cost_us is None and found[0].severity == "high"


def _idle(per_rank: dict[int, dict]) -> pd.DataFrame:
    causes = ("dataloader", "sync", "wait_rank", "launch", "cpu", "queued", "other")
    rows = []
    for r, vals in per_rank.items():
        row = {"rank": r, "step": 0, **{f"idle_{c}_us": 0.0 for c in causes}, **vals}
        row["idle_us"] = sum(row[f"idle_{c}_us"] for c in causes)
        rows.append(row)
    return pd.DataFrame(rows)


def test_a_stall_on_the_stragglers_own_host_is_its_evidence_not_a_second_finding():
    """Rank 1 idles 30 ms a step in its data loader and is the (host-bound) straggler: one
    finding, the stall among its symptoms. The same stall on both ranks is a finding of its
    own (every rank waits for its loader: no rank is the cause)."""
    bd = _breakdown({0: {"idle_us": 2_000.0}, 1: {"idle_us": 32_000.0}})
    idle = _idle({0: {"idle_other_us": 2_000.0}, 1: {"idle_dataloader_us": 30_000.0,
                                                   "idle_other_us": 2_000.0}})
    found = fm.findings(_inputs(breakdown=bd, straggler=_straggler(), on_gpu=True, idle=idle))
    assert [f.id for f in found] == ["host-bound"]
    assert any("data loader" in s for s in found[0].symptoms)
    both = _idle({0: {"idle_dataloader_us": 30_000.0}, 1: {"idle_dataloader_us": 30_000.0}})
    bd2 = _breakdown({0: {"idle_us": 30_000.0}, 1: {"idle_us": 30_000.0}})
    found = fm.findings(_inputs(breakdown=bd2, on_gpu=True, idle=both))
    assert found[0].id == "data-loading-stall"
    assert found[0].cost_us == pytest.approx(30_000.0)
    assert found[0].evidence["ranks"] == [0, 1]


def test_one_finding_record_from_analyser_to_reader():
    """analysis/report/model.Finding is made by the analysers, written into summary.json and
    read back by every reader (``codec``): the same fields round trip; an id the vocabulary
    lacks cannot be made, but a newer report's is still read."""
    import json

    from meshscope.analysis.report import codec
    from meshscope.analysis.report.model import Finding
    from meshscope.vocabulary import FindingId

    f = Finding("straggler", "high", "all", 63.1e3, 31.1, "Rank 1 is the straggler",
                {"rank": 1}, "find what slows it", {"step_time_us": 1.0}, ["waits"])
    assert f.id is FindingId.STRAGGLER
    doc = json.loads(json.dumps(codec.encode(f)))
    assert doc["id"] == "straggler" and list(doc)[0] == "id"
    assert codec.decode(Finding, doc) == f
    assert codec.decode(Finding, doc, strict=True) == f
    with pytest.raises(ValueError, match="not-a-finding"):
        Finding("not-a-finding", "low", None, None, None, "", {}, "")
    newer = codec.decode(Finding, {**doc, "id": "some-future-finding"})
    assert newer.id == "some-future-finding" and newer.title == f.title
    with pytest.raises(codec.CodecError, match="some-future-finding"):
        codec.decode(Finding, {**doc, "id": "some-future-finding"}, strict=True)
    with pytest.raises(codec.CodecError, match=r"^\$\.id: 3 is not one of hang"):
        codec.decode(Finding, {**doc, "id": 3})


def _jitter_inputs(caused: dict[int, float], last: list[int], ranks: int = 8
                   ) -> fm.FindingInputs:
    """Collectives of a dp group of ``ranks`` ranks, ``last`` the last arriver of each; each
    rank's waits suffered (9.6 ms a step each) and ``caused`` (charged by the dependency
    graph); no straggler (the what-if saving stays within the noise)."""
    colls = pd.DataFrame({"last_rank": last, "dim": ["dp"] * len(last),
                          "skew_us": [1_000.0] * len(last)})
    savings = pd.DataFrame({"rank": list(range(ranks)), "stage": [0] * ranks,
                            "saving_us": [100.0] * ranks, "saving_pct": [0.1] * ranks,
                            "reference": ["stage peers"] * ranks,
                            "critical_path_share": [1 / ranks] * ranks,
                            "wait_us": [9_600.0] * ranks,
                            "wait_caused_us": [caused.get(r, 0.0) for r in range(ranks)]})
    bd = _breakdown({r: {"exposed_comm_us": 20_000.0} for r in range(ranks)})
    return _inputs(breakdown=bd, savings=savings, collectives=colls)


def test_arrival_jitter_names_the_rank_that_causes_most_of_the_waiting():
    """Issue 45: on an 8-rank DLRM job one rank arrived last at 5 of 8 collectives and caused
    32.2 of the 38.4 ms of waiting, yet the finding said no straggler was behind the waits.
    Built here: rank 2 last at 5 of 8, charged 32.2 of 38.4 ms."""
    f = next(f for f in fm.findings(_jitter_inputs({2: 32_200.0, 0: 3_100.0, 1: 3_100.0},
                                                   [2, 2, 0, 2, 1, 2, 3, 2]))
             if f.id == "arrival-jitter")
    assert "84% of it for rank 2 (last to arrive at 5 of 8 collectives)" in f.title
    assert "no straggler behind it" not in f.title
    assert f.evidence["causing_rank"] == 2
    assert f.evidence["waits_caused_us"] == {0: 3_100.0, 1: 3_100.0, 2: 32_200.0}


def test_arrival_jitter_without_one_cause_says_no_straggler_is_behind_it():
    """The healthy twin: the waits are charged to every rank alike and the last arriver
    changes — noise in arrival times, and the finding says so."""
    f = next(f for f in fm.findings(_jitter_inputs({r: 9_600.0 for r in range(4)},
                                                   [0, 1, 2, 3, 0, 1, 2, 3], ranks=4))
             if f.id == "arrival-jitter")
    assert "with no straggler behind it (the last to arrive changes" in f.title
    assert "causing_rank" not in f.evidence
    # one rank charged with all the waiting, but over two collectives of four ranks: chance
    # alone makes one rank last at both 4 × (1/4)² = 25% of the time — too little to name it
    few = _jitter_inputs({1: 9_600.0}, [1, 1], ranks=4)
    f = next(f for f in fm.findings(few) if f.id == "arrival-jitter")
    assert "causing_rank" not in f.evidence and "100% of it for rank 1" in f.title
    assert "as chance alone would make one of 4 ranks 25% of the time" in f.title
    # last at 4 of 8 among 8 ranks, 72% of the waiting: 8 · P(B(8, 1/8) ≥ 4) ≈ 9% — chance
    noisy = _jitter_inputs({5: 7_200.0, 0: 2_800.0}, [5, 5, 0, 1, 5, 2, 5, 3])
    f = next(f for f in fm.findings(noisy) if f.id == "arrival-jitter")
    assert "causing_rank" not in f.evidence and "72% of it for rank 5" in f.title
