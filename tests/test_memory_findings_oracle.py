"""The memory findings (``analysis/report/memory_findings.py``) said whole — title, evidence,
remedy, the peak left, the rows cited — on hand-made ``memory_devices`` rows whose numbers are
chosen so each answer is known by construction, and each threshold at its edge (issue 52 item 1:
the module had not been mutation-scored; ``test_memory_units.py`` checks which finding fires).

Sizes are whole MiB or GiB, so ``human_bytes`` writes them as ``75.00 GiB``."""
from __future__ import annotations

import pandas as pd
import pytest

from meshscope.analysis.memory import rank_memory
from meshscope.analysis.report import memory_findings as mf
from meshscope.analysis.report.finding_rules import cite

from test_memory_units import DEVICE_ROW

MiB, GiB = 1 << 20, 1 << 30
NO_LIVE = pd.DataFrame(columns=rank_memory.LIVE_COLUMNS)


def _devices(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame([{**DEVICE_ROW, "rank": r, **kw} for r, kw in enumerate(rows)])


def _live(rank: int, operator: str, nbytes: float, phase=None, module=None, annotation=None,
          device="cuda:0", step=2) -> dict:
    return {"rank": rank, "device": device, "step": step, "operator": operator,
            "module": module, "annotation": annotation, "phase": phase,
            "bytes": float(nbytes), "blocks": 3, "share": 0.0}


def _one(fid: str, devices, live=None, snapshots=(), stage_of=None, replicas=None):
    found = [f for f in mf.memory_findings(devices, NO_LIVE if live is None else live,
                                           list(snapshots), stage_of or {}, replicas=replicas)
             if f.id == fid]
    return found[0] if found else None


# -- near-oom ---------------------------------------------------------------------------------

def test_near_oom_names_the_fullest_rank_and_what_would_shed_its_excess():
    """Rank 0 reserves 75 of 80 GiB (93.75%), rank 1 73 (91.25%): both within the 10% margin,
    rank 0 the fuller. Below 72 GiB (90%) it must shed 3 GiB; its allocator holds 2 GiB free,
    it grows 1 GiB a step, and its largest live group is 20 GiB of gradients, which sharded
    over the 4 data-parallel ranks would keep a quarter."""
    d = _devices({"peak_allocated_bytes": 70 * GiB, "peak_reserved_bytes": 75 * GiB,
                  "device_total_bytes": 80 * GiB, "device_total_source": "trace",
                  "fragmentation_bytes": 2 * GiB, "growth_per_step_bytes": 1 * GiB,
                  "growth_monotone": True},
                 {"peak_allocated_bytes": 72 * GiB, "peak_reserved_bytes": 73 * GiB,
                  "device_total_bytes": 80 * GiB},
                 {"peak_allocated_bytes": 79 * GiB})          # device not known: not judged
    live = pd.DataFrame([_live(0, "aten::mm", 20 * GiB, "backward", "Linear", "bwd"),
                         _live(0, "(other)", 30 * GiB),
                         _live(1, "aten::bmm", 40 * GiB, "forward")])
    f = _one("near-oom", d, live, replicas=4)
    assert f.severity == "high" and f.dimension == "all" and f.cost_us is None
    assert f.title == ("Rank 0 peaks at 75.00 GiB of its 80.00 GiB cuda:0 (94%): within 10% "
                       "of running out")
    assert f.evidence == {"rank": 0, "device": "cuda:0", "peak_bytes": 75 * GiB,
                          "device_total_bytes": 80 * GiB, "share": 75 / 80, "margin": 0.10,
                          "to_shed_bytes": pytest.approx(3 * GiB),
                          "device_total_source": "trace", "peak_step": 2,
                          "peak_op": "aten::mm"}
    assert f.remedy == (
        "lower the peak by at least 3.00 GiB: expandable_segments would return up to 2.00 GiB "
        "held free in the allocator's segments; the memory growing 1.00 GiB a step (a leak); "
        "the largest allocator, aten::mm in Linear under bwd (backward), holds 20.00 GiB: "
        "gradients: shard them over the data-parallel ranks (ZeRO-2, FSDP) — saves 15.00 GiB "
        "(ZeRO-2 or FSDP over the 4 data-parallel ranks keeps 1/4 of the gradients on each)")
    assert f.peak_saving_bytes == pytest.approx(3 * GiB)
    assert f.what_if == {"peak_bytes": pytest.approx(72 * GiB),
                         "assumption": "the peak 10% below the device's memory"}
    assert f.cites == [cite("memory_steps", rank=0, step=2, device="cuda:0"),
                       cite("memory_devices", rank=0, device="cuda:0")]


def test_near_oom_without_a_known_remedy_and_at_its_edge():
    """Exactly 90% of the device is within the margin; the allocated peak counts where the
    allocator reserves nothing; with nothing to point at, the general remedies."""
    d = _devices({"peak_allocated_bytes": 72 * GiB, "device_total_bytes": 80 * GiB})
    f = _one("near-oom", d)
    assert f.evidence["share"] == pytest.approx(0.9) and f.peak_saving_bytes == 0.0
    assert f.remedy == ("lower the peak by at least 0 B: activation recomputation, a ZeRO/FSDP "
                        "stage that shards more, or a smaller microbatch")
    assert f.cites == [cite("memory_steps", rank=0, step=2, device="cuda:0"),
                       cite("memory_devices", rank=0, device="cuda:0")]
    below = d.assign(peak_allocated_bytes=72 * GiB - MiB)
    assert _one("near-oom", below) is None
    # the largest allocator the model's state from before the trace, one replica: bf16 halves it
    state = pd.DataFrame([_live(0, "(before the trace)", 40 * GiB)])
    assert _one("near-oom", d, state).remedy.startswith(
        "lower the peak by at least 0 B: the largest allocator, memory allocated before the "
        "trace began, holds 40.00 GiB: the model's state held from before the trace")


def test_near_oom_of_a_peak_no_step_holds_cites_the_device_only():
    """A memory_devices row whose peak no profiled step holds (``peak_step`` empty: a row
    from another writer, or a peak before the first step) is still judged — 76 of 80 GiB, 4 GiB
    above 90% of the device — and its evidence says no step rather than failing on it."""
    d = _devices({"peak_allocated_bytes": 76 * GiB, "device_total_bytes": 80 * GiB,
                  "peak_step": None})
    f = _one("near-oom", d)
    assert f.evidence["peak_step"] is None and f.evidence["to_shed_bytes"] == 4 * GiB
    assert f.cites == [cite("memory_devices", rank=0, device="cuda:0")]


def test_an_out_of_memory_snapshot_is_near_oom_by_itself():
    oom = {"rank": 3, "device": "cuda:1", "source": "rank3.pickle",
           "oom": {"requested_bytes": 2 * MiB, "device_free_bytes": 1 * MiB,
                   "allocated_bytes": 10 * MiB, "reserved_bytes": 12 * MiB,
                   "explained": "the device held 12 MiB; it fits if the batch halves",
                   "fits_if": ["the batch halves", "expandable segments"]}}
    f = _one("near-oom", _devices({"peak_allocated_bytes": 10 * MiB}), snapshots=[
        {"rank": 2, "device": "cuda:0", "source": "rank2.pickle", "oom": None}, oom])
    assert f.severity == "high"
    assert f.title == ("Rank 3 ran out of memory on cuda:1: it asked for 2.00 MiB with "
                       "1.00 MiB free (10.00 MiB allocated, 12.00 MiB reserved; snapshot "
                       "rank3.pickle): the device held 12 MiB")
    assert f.evidence["snapshot"] == "rank3.pickle" and f.evidence["requested_bytes"] == 2 * MiB
    assert (f.evidence["rank"], f.evidence["device"]) == (3, "cuda:1")
    assert f.remedy == "the batch halves; or expandable segments"
    assert f.peak_saving_bytes is None and f.what_if["peak_bytes"] is None
    assert f.cites == [cite("summary", page="memory", field="memory.snapshots",
                            source="rank3.pickle")]
    # no devices at all: the snapshot alone still says it
    empty = _devices({"peak_allocated_bytes": 1.0}).iloc[0:0]
    bare = {**oom, "oom": {k: v for k, v in oom["oom"].items()
                           if k not in ("explained", "fits_if")}}
    (g,) = mf.memory_findings(empty, NO_LIVE, [bare], {})
    assert g.id == "near-oom" and g.title.endswith("snapshot rank3.pickle)")
    assert g.remedy.startswith("free what the snapshot's live blocks show")


# -- imbalance --------------------------------------------------------------------------------

def test_imbalance_of_ranks_without_a_pipeline():
    """Peaks 300, 200 and 100 MiB: the mean 200, rank 0 1.5× it; bringing it to the mean saves
    100 MiB; on an 8 GiB device that is 1.2%, low, and the run leaves over half free: low."""
    d = _devices({"peak_allocated_bytes": 300 * MiB, "device_total_bytes": 8 * GiB},
                 {"peak_allocated_bytes": 200 * MiB}, {"peak_allocated_bytes": 100 * MiB})
    f = _one("memory-imbalance", d)
    assert f.dimension == "all"
    assert f.title == ("Rank 0 holds the most memory: its peak 300.00 MiB is 1.50× the mean of "
                       "the ranks (200.00 MiB)")
    assert f.evidence["by"] == "rank" and f.evidence["largest"] == 0
    assert f.evidence["peak_bytes_per_rank"] == {"0": 300 * MiB, "1": 200 * MiB, "2": 100 * MiB}
    assert f.evidence["max_over_mean"] == pytest.approx(1.5)
    assert f.evidence["mean_bytes"] == pytest.approx(200 * MiB)
    assert f.remedy.startswith("see what rank 0 holds that the others do not")
    assert f.peak_saving_bytes == pytest.approx(100 * MiB)
    assert f.what_if["peak_bytes"] == pytest.approx(200 * MiB)
    assert f.severity == "low" and f.evidence["severity_of"] == "the device's memory"
    assert f.cites == [cite("memory_devices", rank=0, device="cuda:0"), cite("memory_devices")]


def test_imbalance_where_the_last_stage_holds_the_most():
    """Stage 0 (ranks 0, 1) peaks at 100 MiB, stage 1 (ranks 2, 3) at 180: its largest rank,
    3, is the one cited; the remedy names the last stage's logits."""
    d = _devices({"peak_allocated_bytes": 100 * MiB}, {"peak_allocated_bytes": 90 * MiB},
                 {"peak_allocated_bytes": 150 * MiB}, {"peak_allocated_bytes": 180 * MiB})
    f = _one("memory-imbalance", d, stage_of={0: 0, 1: 0, 2: 1, 3: 1})
    assert f.dimension == "pp" and f.evidence["largest"] == 1
    assert f.title.startswith("Stage 1 holds the most memory: its peak 180.00 MiB is 1.29× "
                              "the mean of the stages (140.00 MiB)")
    assert f.evidence["peak_bytes_per_stage"] == {"0": 100 * MiB, "1": 180 * MiB}
    assert "the last stage also holds the logits" in f.remedy
    assert f.cites[0] == cite("memory_devices", rank=3, device="cuda:0")
    # severity against the peak (no device memory known): 40 of 180 MiB, high
    assert f.severity == "high" and f.evidence["severity_of"].startswith("the peak")


def test_imbalance_edges():
    # max/mean exactly 1.1 is not above it
    at = _devices({"peak_allocated_bytes": 110 * MiB}, {"peak_allocated_bytes": 90 * MiB})
    assert _one("memory-imbalance", at) is None
    just = _devices({"peak_allocated_bytes": 111 * MiB}, {"peak_allocated_bytes": 90 * MiB})
    assert _one("memory-imbalance", just).peak_saving_bytes == pytest.approx(10.5 * MiB)
    # three times the mean but under 1 MiB above it
    tiny = _devices({"peak_allocated_bytes": 900 * 1024}, {"peak_allocated_bytes": 1024},
                    {"peak_allocated_bytes": 1024})
    assert _one("memory-imbalance", tiny) is None
    # one rank: nothing to compare
    assert _one("memory-imbalance", _devices({"peak_allocated_bytes": 300 * MiB})) is None


# -- growth -----------------------------------------------------------------------------------

def test_growth_names_every_growing_rank_and_when_the_device_fills():
    """Rank 0 grows 2 MiB a step, rank 1 4 MiB over 2 step-to-step differences (3 profiled
    steps), both above 1 MiB and 0.5% of their 400 MiB peaks; rank 1 is the worst: 8 MiB added.
    Its 1 GiB device, reserved 600 MiB at the peak, is full in (1024 − 600) / 4 = 106 steps."""
    d = _devices({"peak_allocated_bytes": 400 * MiB, "growth_per_step_bytes": 2 * MiB,
                  "growth_monotone": True},
                 {"peak_allocated_bytes": 400 * MiB, "peak_reserved_bytes": 600 * MiB,
                  "growth_per_step_bytes": 4 * MiB, "growth_monotone": True,
                  "device_total_bytes": 1 * GiB},
                 {"peak_allocated_bytes": 400 * MiB, "growth_per_step_bytes": 9 * MiB,
                  "growth_monotone": False})                 # not every step: no leak
    f = _one("memory-growth", d)
    assert f.title == ("Memory grows on ranks 0, 1: rank 1's cuda:0 ends each step 4.00 MiB "
                       "higher than the one before, over 3 profiled steps; at this rate its "
                       "1.00 GiB are full in 106 more steps")
    assert f.evidence["ranks"] == [0, 1] and f.evidence["rank"] == 1
    assert f.evidence["growth_per_step_bytes"] == 4 * MiB and f.evidence["steps"] == 3
    assert f.evidence["steps_until_full"] == pytest.approx(106.0)
    assert f.evidence["peak_bytes"] == 400 * MiB
    assert f.peak_saving_bytes == 8 * MiB
    assert f.what_if["peak_bytes"] == 392 * MiB
    assert f.dimension == "all" and f.evidence["device"] == "cuda:0"
    assert f.remedy == ("find what each step keeps (tensors appended to a list, a loss "
                        "accumulated without .item() or .detach() keeping its graph, a cache "
                        "that never evicts); the growing operator is in memory_live at the last "
                        "peak")
    assert f.cites == [cite("memory_devices", rank=1, device="cuda:0"),
                       cite("memory_steps", rank=1, device="cuda:0")]
    # one rank, no device memory: no "ranks", no estimate of when
    alone = _one("memory-growth", d.iloc[[0]])
    assert alone.title == ("Memory grows on rank 0: rank 0's cuda:0 ends each step 2.00 MiB "
                           "higher than the one before, over 3 profiled steps")
    assert "steps_until_full" not in alone.evidence


def test_growth_edges():
    d = _devices({"peak_allocated_bytes": 1000 * MiB, "growth_per_step_bytes": 5 * MiB,
                  "growth_monotone": True})
    assert _one("memory-growth", d) is not None                    # 0.5% of the peak: at it
    assert _one("memory-growth", d.assign(growth_per_step_bytes=4.9 * MiB)) is None
    small = d.assign(peak_allocated_bytes=100 * MiB)
    assert _one("memory-growth", small.assign(growth_per_step_bytes=1 * MiB)) is not None
    assert _one("memory-growth", small.assign(growth_per_step_bytes=MiB - 1)) is None


# -- fragmentation ----------------------------------------------------------------------------

def test_fragmentation_names_the_rank_holding_the_most_free():
    """Rank 1 holds 3 GiB free of 6 GiB reserved (50%), rank 2 1 GiB of 4 (exactly 25%): rank
    1 holds more. Expandable segments would lower the peak reserved by those 3 GiB."""
    d = _devices({"peak_allocated_bytes": 3 * GiB},
                 {"peak_allocated_bytes": 3 * GiB, "reserved_at_peak_bytes": 6 * GiB,
                  "fragmentation_bytes": 3 * GiB},
                 {"peak_allocated_bytes": 3 * GiB, "reserved_at_peak_bytes": 4 * GiB,
                  "fragmentation_bytes": 1 * GiB})
    f = _one("memory-fragmentation", d)
    assert f.title == ("Rank 1's allocator holds 3.00 GiB free in its segments at the peak "
                       "(50% of the 6.00 GiB reserved): fragmentation")
    assert f.evidence == {"rank": 1, "device": "cuda:0", "fragmentation_bytes": 3 * GiB,
                          "share": 0.5, "reserved_at_peak_bytes": 6 * GiB,
                          "peak_allocated_bytes": 3 * GiB, "threshold_share": 0.25,
                          "severity_of": "the peak (the device's memory is not known)",
                          "headroom_bytes": None, "severity_adjusted": None}
    assert f.dimension == "all"
    assert f.remedy == ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in "
                        "place instead of new ones being cut); or allocate the largest buffers "
                        "first and keep their sizes fixed")
    assert f.peak_saving_bytes == 3 * GiB and f.what_if["peak_bytes"] == 3 * GiB
    assert f.cites == [cite("memory_devices", rank=1, device="cuda:0")]
    # the edges: exactly 25% fires, and exactly 64 MiB
    edge = _one("memory-fragmentation", d.iloc[[2]])
    assert edge.evidence["share"] == 0.25
    small = _devices({"peak_allocated_bytes": 192 * MiB, "reserved_at_peak_bytes": 256 * MiB,
                      "fragmentation_bytes": 64 * MiB})
    assert _one("memory-fragmentation", small) is not None
    assert _one("memory-fragmentation", small.assign(fragmentation_bytes=64 * MiB - 1)) is None


# -- the largest allocator --------------------------------------------------------------------

def test_the_largest_allocator_of_the_rank_with_the_largest_peak():
    """Rank 1 peaks highest (200 MiB); of its groups on cuda:0 the largest is 50 MiB (25%,
    the share's edge) of attention scores — a bmm in the forward; rank 0's larger group and
    rank 1's group on another device are not its."""
    d = _devices({"peak_allocated_bytes": 100 * MiB},
                 {"peak_allocated_bytes": 200 * MiB, "device_total_bytes": 1 * GiB})
    live = pd.DataFrame([_live(0, "aten::mm", 90 * MiB, "forward"),
                         _live(1, "aten::mm", 80 * MiB, "forward", device="cuda:1"),
                         _live(1, "(other)", 120 * MiB),
                         _live(1, "aten::bmm", 50 * MiB, "forward", "Attention", "fwd",
                               step=3),
                         _live(1, "aten::add", 10 * MiB, "forward")])
    f = _one("largest-allocator", d, live, replicas=4)
    assert f.title == ("aten::bmm in Attention under fwd (forward) holds 50.00 MiB (25%) of "
                       "rank 1's 200.00 MiB peak on cuda:0")
    # 50 MiB of a 1 GiB device is 4.9%, medium; the run leaves 80% free: one level down
    assert f.evidence == {
        "rank": 1, "device": "cuda:0", "step": 3, "operator": "aten::bmm",
        "module": "Attention", "annotation": "fwd", "phase": "forward", "bytes": 50 * MiB,
        "blocks": 3, "share": 0.25, "peak_bytes": 200 * MiB, "made_by": "attention scores",
        "remedy_model": "fused attention never materialises the scores",
        "data_parallel_ranks": 4, "severity_of": "the device's memory",
        "headroom_bytes": 1 * GiB - 200 * MiB,
        "severity_adjusted": "one level down: the run leaves over 50% of the device free"}
    assert f.severity == "low"
    assert f.peak_saving_bytes == 50 * MiB and f.what_if == {
        "peak_bytes": 150 * MiB, "assumption": "fused attention never materialises the scores"}
    assert f.cites == [cite("memory_live", rank=1, step=3, device="cuda:0",
                            operator="aten::bmm"),
                       cite("memory_devices", rank=1, device="cuda:0")]
    # under a quarter of the peak: no finding
    under = live.assign(bytes=live["bytes"].where(live["operator"] != "aten::bmm", 49 * MiB))
    assert _one("largest-allocator", d, under, replicas=4) is None


def test_the_largest_allocator_edges():
    # half of a 1.5 MiB peak is under 1 MiB
    d = _devices({"peak_allocated_bytes": 1.5 * MiB})
    assert _one("largest-allocator", d, pd.DataFrame([_live(0, "aten::mm", 0.75 * MiB,
                                                            "forward")])) is None
    # no live groups at all
    assert _one("largest-allocator", d) is None
    # exactly 1 MiB, half the peak: at the edge, a finding
    two = _devices({"peak_allocated_bytes": 2 * MiB})
    assert _one("largest-allocator", two, pd.DataFrame([_live(0, "aten::mm", MiB,
                                                              "forward")])) is not None
    # a group made in the step itself: no saving model, its bytes are what freeing it saves
    big = _devices({"peak_allocated_bytes": 100 * MiB})
    f = _one("largest-allocator", big, pd.DataFrame([_live(0, "aten::empty", 60 * MiB)]))
    assert f.title == "aten::empty holds 60.00 MiB (60%) of rank 0's 100.00 MiB peak on cuda:0"
    assert f.peak_saving_bytes == 60 * MiB
    assert f.what_if["assumption"] == "none of these blocks live at the peak"


# -- severity and the order -------------------------------------------------------------------

@pytest.mark.parametrize("saving,peak,total,level,adjusted", [
    (10, 60, 100, "high", None),          # 10% of the device: high, at the edge
    (3, 60, 100, "medium", None),         # 3%: medium, at the edge
    (2.9, 60, 100, "low", None),
    (3, 80, 100, "medium", None),         # 20% free exactly: not under it
    (3, 81, 100, "high", "one level up: the run leaves under 20% of the device free"),
    (10, 90, 100, "high", None),          # already high: no higher
    (3, 50, 100, "medium", None),         # 50% free exactly: not over it
    (3, 49, 100, "low", "one level down: the run leaves over 50% of the device free"),
    (2, 10, 100, "low", None),            # already low: no lower
])
def test_severity_edges(saving, peak, total, level, adjusted):
    s = mf.severity(saving, peak, total)
    assert (s.level, s.adjusted, s.of) == (level, adjusted, "the device's memory")
    assert s.headroom_bytes == total - peak


def test_severity_against_the_peak_and_of_nothing():
    s = mf.severity(10, 100, None)
    assert (s.level, s.headroom_bytes, s.adjusted) == ("high", None, None)
    assert mf.severity(2.9, 100, 0).level == "low"
    assert mf.severity(5, 0, None).level == "low"       # no peak: no share


def test_memory_findings_come_near_oom_first_then_by_saving():
    """Rank 0 reserves 76 of 80 GiB at most (near-oom) and holds 8 of the 16 GiB it reserves
    at its allocated peak free (fragmentation: 8 GiB); rank 1 grows 2 GiB a step over 2
    steps (4 GiB). near-oom first, then fragmentation's 8 GiB before growth's 4."""
    d = _devices({"peak_allocated_bytes": 8 * GiB, "peak_reserved_bytes": 76 * GiB,
                  "reserved_at_peak_bytes": 16 * GiB, "fragmentation_bytes": 8 * GiB,
                  "device_total_bytes": 80 * GiB},
                 {"peak_allocated_bytes": 8 * GiB, "growth_per_step_bytes": 2 * GiB,
                  "growth_monotone": True})
    assert [f.id for f in mf.memory_findings(d, NO_LIVE, [], {})] == \
        ["near-oom", "memory-fragmentation", "memory-growth"]
    # the imbalance whose largest stage grows is a symptom of the growth, not a finding
    d2 = _devices({"peak_allocated_bytes": 100 * MiB},
                  {"peak_allocated_bytes": 300 * MiB, "growth_per_step_bytes": 20 * MiB,
                   "growth_monotone": True})
    # (stage 0 is rank 1: the stage's number is not its rank's)
    found = mf.memory_findings(d2, NO_LIVE, [], {0: 1, 1: 0})
    assert [f.id for f in found] == ["memory-growth"]
    assert found[0].symptoms == [
        "Stage 0 holds the most memory: its peak 300.00 MiB is 1.50× the mean of the stages "
        "(200.00 MiB)"]
    # the same imbalance on a rank that does not grow stays a finding of its own
    d3 = d2.assign(growth_per_step_bytes=[20 * MiB, 0.0], growth_monotone=[True, False])
    assert sorted(f.id for f in mf.memory_findings(d3, NO_LIVE, [], {0: 1, 1: 0})) == \
        ["memory-growth", "memory-imbalance"]
    # and without stages, by rank: rank 1 grows and holds the most
    assert [f.id for f in mf.memory_findings(d2, NO_LIVE, [], {})] == ["memory-growth"]


def _remedy(operator, phase, replicas):
    return mf.remedy_of(pd.Series(_live(0, operator, 64 * MiB, phase)), replicas)


@pytest.mark.parametrize("operator,phase,replicas,text", [
    ("(before the trace)", None, 4,
     "the model's state held from before the trace (its weights; in training also the "
     "optimizer state and gradients kept between steps): shard it — FSDP (ZeRO-3) over the "
     "data-parallel ranks, tensor or pipeline parallelism for the weights —, keep it in lower "
     "precision (bf16 weights, an 8-bit optimizer), or offload the optimizer state to the CPU "
     "— saves 48.00 MiB (FSDP (ZeRO-3) over the 4 data-parallel ranks keeps 1/4 of the "
     "model's state on each)"),
    ("aten::_softmax", "forward", 4,
     "attention scores, most likely (unfused attention materialises them, [batch × heads, "
     "seq, seq], through aten::_softmax): fused attention — torch.nn.functional."
     "scaled_dot_product_attention with the flash or memory-efficient kernel — never keeps "
     "them, freeing these 64.00 MiB"),
    ("aten::zeros_like", "optimizer", 4,
     "optimizer state: shard it over the data-parallel ranks (ZeRO-1, or FSDP) — saves "
     "48.00 MiB (ZeRO-1 over the 4 data-parallel ranks keeps 1/4 of the optimizer state on "
     "each)"),
    ("aten::zeros_like", "optimizer", None,
     "optimizer state: offload it to the CPU, or use an 8-bit optimizer — saves 64.00 MiB "
     "(offloaded to the CPU, none of it stays on the device)"),
    ("aten::mm", "backward", 1,
     "gradients: apply the optimizer in the backward (per-parameter post-accumulate-grad "
     "hooks) so each gradient is freed once used — saves 64.00 MiB (each gradient freed once "
     "its parameter is updated)"),
    ("aten::mm", "forward", 8,
     "activations kept for the backward: activation recomputation (torch.utils.checkpoint; "
     "full recomputation keeps only each block's input), a smaller microbatch, or "
     "sequence/context parallelism to split the sequence — halving the microbatch saves "
     "32.00 MiB"),
])
def test_each_remedy_said_whole(operator, phase, replicas, text):
    """What an engineer reads, with the saving worked by hand: 64 MiB sharded over 4 ranks
    keeps 16 (saves 48), halved saves 32, offloaded or fused saves all 64."""
    assert _remedy(operator, phase, replicas).text == text


def test_a_tensor_of_the_step_itself_is_named_how_to_find():
    fix = _remedy("aten::empty", None, 8)
    assert fix.text == (
        "made by aten::empty in the step itself, outside the model's forward, backward and the "
        "optimizer (no module or range covers it): the batch, a buffer, a workspace or a "
        "cache. The trace does not say which: profile with with_stack=True (the Python line "
        "that made it) or take a memory snapshot (torch.cuda.memory._record_memory_history) "
        "whose frames name it; then make it once before the loop and reuse it, or free it "
        "after its last use")
    assert (fix.made_by, fix.saving_bytes, fix.model) == (
        "unknown", None, "none: what the memory is is not in the trace")
