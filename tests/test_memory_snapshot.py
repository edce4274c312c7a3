"""Memory snapshots (analysis/memory/snapshot.py). A snapshot made by
``torch.cuda.memory._record_memory_history`` needs CUDA, which this machine has not: the
snapshot here is written by hand in the structure ``torch.cuda.memory._snapshot()`` documents
(its docstring: segments of blocks with their frames, and per device the allocator's log), with
a history whose answers are known by construction; and a pickle that tries to run code is
refused, nothing executed."""
from __future__ import annotations

import json
import os
import pickle

import pandas as pd
import pytest

from conftest import meshscope
from meshscope.analysis.memory import snapshot

MiB = 1 << 20
A, B = 0x7F0000000000, 0x7F0010000000
LINEAR = {"filename": "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
          "line": 125, "name": "forward"}
F1 = [LINEAR, {"filename": "/home/u/train.py", "line": 40, "name": "step"}]
F2 = [{"filename": "/home/u/model.py", "line": 12, "name": "attention"}]
F3 = [{"filename": "/home/u/train.py", "line": 55, "name": "log_metrics"}]
F4 = [{"filename": "/home/u/model.py", "line": 30, "name": "big_temp"}]


def hand_made() -> dict:
    """Two segments on device 0 — A (20 MiB, large): 8 MiB in use, 4 free, 6 in use, 2 free;
    B (2 MiB, small): 1 in use, 1 free — and the log that led there: A cut, 8 MiB allocated
    (t=1), a 4 MiB temporary (t=2), 6 MiB (t=3), the temporary freed (t=4 requested, t=5
    completed), B cut (t=6), 1 MiB in it (t=7), then an out-of-memory error asking for
    64 MiB with 3 MiB free on the device (t=8). So: 15 MiB allocated and 22 reserved at the
    end, 7 free in the segments (the largest free block 4 MiB), and the largest moment 18 MiB
    allocated, after t=3, with 20 reserved: the blocks of F1, F4 and F2."""
    def block(addr, size, state, frames=()):
        return {"address": addr, "size": size, "requested_size": size, "state": state,
                "frames": list(frames)}
    segments = [
        {"device": 0, "address": A, "total_size": 20 * MiB, "stream": 0,
         "segment_type": "large", "segment_pool_id": (0, 0), "allocated_size": 14 * MiB,
         "active_size": 14 * MiB,
         "blocks": [block(A, 8 * MiB, "active_allocated", F1),
                    block(A + 8 * MiB, 4 * MiB, "inactive"),
                    block(A + 12 * MiB, 6 * MiB, "active_allocated", F2),
                    block(A + 18 * MiB, 2 * MiB, "inactive")]},
        {"device": 0, "address": B, "total_size": 2 * MiB, "stream": 0,
         "segment_type": "small", "segment_pool_id": (0, 0), "allocated_size": MiB,
         "active_size": MiB,
         "blocks": [block(B, MiB, "active_allocated", F3), block(B + MiB, MiB, "inactive")]}]

    def act(action, addr, size, t, frames=(), **kw):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
                "frames": list(frames), **kw}
    log = [act("segment_alloc", A, 20 * MiB, 0), act("alloc", A, 8 * MiB, 1, F1),
           act("alloc", A + 8 * MiB, 4 * MiB, 2, F4), act("alloc", A + 12 * MiB, 6 * MiB, 3, F2),
           act("free_requested", A + 8 * MiB, 4 * MiB, 4),
           act("free_completed", A + 8 * MiB, 4 * MiB, 5),
           act("segment_alloc", B, 2 * MiB, 6), act("alloc", B, MiB, 7, F3),
           {"action": "oom", "size": 64 * MiB, "stream": 0, "time_us": 8,
            "device_free": 3 * MiB, "frames": F1}]
    return {"segments": segments, "device_traces": [log],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def _check(segments, live, summaries):
    seg = {r["address"]: r for r in segments}
    assert seg[A]["free_bytes"] == 6 * MiB and seg[A]["largest_free_bytes"] == 4 * MiB
    assert seg[A]["allocated_bytes"] == 14 * MiB and seg[A]["blocks"] == 4
    assert seg[B]["free_bytes"] == MiB and seg[B]["segment_type"] == "small"
    (s,) = summaries
    assert (s["reserved_bytes"], s["allocated_bytes"], s["free_in_segments_bytes"]) == \
        (22 * MiB, 15 * MiB, 7 * MiB)
    assert (s["largest_allocated_bytes"], s["largest_reserved_bytes"], s["largest_at_us"]) == \
        (18 * MiB, 20 * MiB, 3)
    assert s["oom"]["requested_bytes"] == 64 * MiB and s["oom"]["device_free_bytes"] == 3 * MiB
    assert (s["oom"]["allocated_bytes"], s["oom"]["reserved_bytes"]) == (15 * MiB, 22 * MiB)
    assert s["oom"]["site"] == "step (train.py:40)"
    by_site = {r["site"]: r["bytes"] for r in live}
    assert by_site == {"step (train.py:40)": 8 * MiB, "attention (model.py:12)": 6 * MiB,
                       "big_temp (model.py:30)": 4 * MiB}
    assert sum(r["share"] for r in live) == pytest.approx(1.0)


def test_a_hand_made_snapshot_read_from_its_pickle_and_its_json(tmp_path):
    doc = hand_made()
    pkl = tmp_path / "rank0.pickle"
    pkl.write_bytes(pickle.dumps(doc))
    as_json = tmp_path / "rank0.json"
    as_json.write_text(json.dumps(doc))
    for path in (pkl, as_json):
        _check(*snapshot.analyse(0, snapshot.read(path), path.name))


def torch_2_0(doc: dict, addresses: bool = True) -> dict:
    """``doc`` in PyTorch 2.0's block layout (``torch/cuda/_memory_viz.py``'s
    ``_block_extra_legacy`` reads it): a block has no ``address``, ``frames`` nor
    ``requested_size``, but a ``history`` of its allocations — ``addr``, ``real_size``,
    ``frames`` — an inactive block an empty one; ``addresses`` False leaves the ``addr`` out
    too, so that a block's place is only its order in its segment."""
    out = json.loads(json.dumps(doc))
    for seg in out["segments"]:
        for b in seg["blocks"]:
            addr, frames = b.pop("address"), b.pop("frames")
            b.pop("requested_size")
            b["history"] = [] if b["state"] == "inactive" else [
                {**({"addr": addr} if addresses else {}), "real_size": b["size"],
                 "frames": frames}]
    return out


@pytest.mark.parametrize("addresses", [True, False])
def test_a_torch_2_0_snapshot_is_read_from_its_blocks_history(tmp_path, addresses):
    """Issue 48: PyTorch 2.0's snapshots keep each block's address and stack under its
    ``history``; they were read as holding nothing ("allocated 0 B" beside 22 MiB reserved).
    The same snapshot in that layout gives the same answers, to the byte — with the history's
    addresses, and with none (each block placed after the blocks before it in its segment)."""
    path = tmp_path / "rank0.pickle"
    doc = torch_2_0(hand_made(), addresses)
    path.write_bytes(pickle.dumps(doc))
    _check(*snapshot.analyse(0, snapshot.read(path), path.name))
    # torch's own reader of snapshots (torch/cuda/_memory_viz.py: segsum, which reads 2.0's
    # history through _block_extra_legacy) totals them alike
    import copy
    import re

    from torch.cuda import _memory_viz

    said = _memory_viz.segsum(copy.deepcopy(doc))
    totals = dict(re.findall(r"^total_(reserved|allocated): ([\d.]+)MiB$", said, re.M))
    _, _, (s,) = snapshot.analyse(0, snapshot.read(path), path.name)
    assert float(totals["reserved"]) * MiB == s["reserved_bytes"] == 22 * MiB
    assert float(totals["allocated"]) * MiB == s["allocated_bytes"] == 15 * MiB


def test_analyze_a_snapshot_alone(tmp_path):
    """``meshscope analyze rank3.pickle``: the snapshot's tables and summary, its
    out-of-memory record as the near-oom finding, every other table empty."""
    path = tmp_path / "rank3.pickle"
    path.write_bytes(pickle.dumps(hand_made()))
    out = tmp_path / "report"
    proc = meshscope("analyze", path, "--out", out, "--json", check=True)
    summary = json.loads(proc.stdout)
    (snap,) = summary["memory"]["snapshots"]
    assert snap["rank"] == 3 and snap["source"] == "rank3.pickle"
    assert snap["largest_allocated_bytes"] == 18 * MiB
    assert summary["findings"][0]["id"] == "near-oom"
    assert "rank3.pickle" in summary["findings"][0]["title"]
    segments = pd.read_parquet(out / "memory_segments.parquet")
    assert sorted(segments["free_bytes"]) == [MiB, 6 * MiB]
    assert len(pd.read_parquet(out / "breakdown.parquet")) == 0
    text = meshscope("analyze", path, "--out", out, check=True).stdout
    assert "OUT OF MEMORY: asked for 64.00 MiB with 3.00 MiB free" in text


class _Exploit:
    """Unpickling this would run a shell command."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_snapshot_that_runs_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    doc = hand_made()
    doc["segments"][0]["blocks"][0]["frames"] = [_Exploit(marker)]
    evil.write_bytes(pickle.dumps(doc))
    with pytest.raises(snapshot.SnapshotError) as err:
        snapshot.read(evil)
    assert str(evil) in str(err.value) and "posix.system" in str(err.value)
    assert not marker.exists()
    proc = meshscope("analyze", evil, "--out", tmp_path / "report")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("meshscope: error: ") and str(evil) in lines[0]
    assert "refused" in lines[0] and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_files_that_are_not_snapshots_are_named(tmp_path):
    other = tmp_path / "fr.pkl"
    other.write_bytes(pickle.dumps({"entries": [], "version": "2.10"}))
    with pytest.raises(snapshot.SnapshotError, match="not a memory snapshot"):
        snapshot.read(other)
    bad = hand_made()
    bad["segments"][1]["total_size"] = -1
    damaged = tmp_path / "bad.pickle"
    damaged.write_bytes(pickle.dumps(bad))
    with pytest.raises(snapshot.SnapshotError, match=r"\$\.segments\[1\]\.total_size"):
        snapshot.read(damaged)
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(pickle.dumps(hand_made())[:200])
    with pytest.raises(snapshot.SnapshotError, match="not a plain-data pickle"):
        snapshot.read(cut)
    (tmp_path / "empty.pkl").write_bytes(b"")
    with pytest.raises(snapshot.SnapshotError, match="empty file"):
        snapshot.read(tmp_path / "empty.pkl")


def test_any_bytes_are_a_snapshot_or_named_never_a_crash(tmp_path):
    """Fuzzed: random bytes, and the hand-made snapshot's pickle cut or with bytes flipped,
    read as a snapshot give a ``Snapshot`` or ``SnapshotError`` — never another exception."""
    from hypothesis import HealthCheck, given, settings, strategies as hs

    good = pickle.dumps(hand_made())
    path = tmp_path / "fuzz.pickle"

    @settings(max_examples=200, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(hs.one_of(hs.binary(min_size=1, max_size=400),
                     hs.tuples(hs.integers(0, len(good) - 1), hs.integers(0, 255)).map(
                         lambda p: good[:p[0]] + bytes([p[1]]) + good[p[0] + 1:]),
                     hs.integers(1, len(good)).map(lambda n: good[:n])))
    def read(raw):
        path.write_bytes(raw)
        try:
            snapshot.read(path)
        except snapshot.SnapshotError:
            pass
    read()


def test_a_fuzzed_but_valid_snapshot_analyses_without_a_crash(tmp_path):
    """Any document the reader accepts — fields of the right types with arbitrary values —
    is analysed into rows, never an exception (a negative device is refused when read)."""
    from hypothesis import HealthCheck, given, settings, strategies as hs

    size = hs.integers(0, 1 << 40)
    frame = hs.fixed_dictionaries({"filename": hs.text(max_size=20), "line": hs.integers(0, 9),
                                   "name": hs.text(max_size=10)})
    block = hs.fixed_dictionaries({"size": size, "state": hs.sampled_from(
        ["active_allocated", "active_awaiting_free", "inactive", "odd"]),
        "address": size, "frames": hs.lists(frame, max_size=3)})
    segment = hs.fixed_dictionaries({"address": size, "total_size": size,
                                     "device": hs.integers(0, 2),
                                     "blocks": hs.lists(block, max_size=4)})
    entry = hs.fixed_dictionaries({"action": hs.sampled_from(
        ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
         "oom", "snapshot"]), "addr": size, "size": size, "frames": hs.lists(frame, max_size=2)})
    doc = hs.fixed_dictionaries({"segments": hs.lists(segment, max_size=4),
                                 "device_traces": hs.lists(hs.lists(entry, max_size=8),
                                                           max_size=3)})
    path = tmp_path / "rank0.pickle"

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(doc)
    def analyse(d):
        path.write_bytes(pickle.dumps(d))
        segments, live, summaries = snapshot.analyse(0, snapshot.read(path), path.name)
        assert len(segments) == len(d["segments"])
        assert len(summaries) == len({s["device"] for s in d["segments"]}
                                     | set(range(len(d["device_traces"]))))
    analyse()
    bad = hand_made()
    bad["segments"][0]["device"] = -1
    path.write_bytes(pickle.dumps(bad))
    with pytest.raises(snapshot.SnapshotError, match=r"\$\.segments\[0\]\.device"):
        snapshot.read(path)


def test_a_snapshot_alone_writes_its_report_beside_it_and_snapshot_flags_work(tmp_path):
    """Issue 46, cases 4 and 8: ``meshscope analyze rank3.pickle`` as docs/memory.md shows it
    (no ``--out``) writes ``rank3.pickle.report/``; ``--snapshot FILE`` (once or twice) works
    in ``analyze`` and ``compare`` (it raised TypeError in the reuse key)."""
    from damage_corpus import copy_sample

    path = tmp_path / "rank3.pickle"
    path.write_bytes(pickle.dumps(hand_made()))
    proc = meshscope("analyze", path)
    assert proc.returncode == 0, proc.stderr
    assert "OUT OF MEMORY: asked for 64.00 MiB with 3.00 MiB free" in proc.stdout
    assert (tmp_path / "rank3.pickle.report" / "summary.json").is_file()
    other = tmp_path / "rank5.pickle"
    other.write_bytes(pickle.dumps(hand_made()))
    run = copy_sample(tmp_path / "run")
    proc = meshscope("analyze", run, "--snapshot", path, "--snapshot", other, "--json")
    assert proc.returncode == 0, proc.stderr
    snaps = json.loads(proc.stdout)["memory"]["snapshots"]
    assert sorted((s["rank"], s["source"]) for s in snaps) == \
        [(3, "rank3.pickle"), (5, "rank5.pickle")]
    proc = meshscope("compare", run, run, "--snapshot", path)
    assert proc.returncode == 0, proc.stderr
    assert "meshscope compare" in proc.stdout


@pytest.mark.parametrize("field, value", [("size", 2 ** 70), ("stream", -(2 ** 64))])
def test_a_number_beyond_int64_is_refused_at_read(tmp_path, field, value):
    """Issue 46, case 6: a snapshot whose block size is 2**70 passed the reader and failed at
    the write (OverflowError, exit 1, a traceback, a ``.new-*`` folder left). It is refused
    when read, naming the field; nothing is written."""
    doc = hand_made()
    if field == "size":
        doc["segments"][0]["blocks"][0]["size"] = value
    else:
        doc["segments"][0]["stream"] = value
    path = tmp_path / "rank0.pickle"
    path.write_bytes(pickle.dumps(doc))
    out = tmp_path / "out"
    proc = meshscope("analyze", path, "--out", out)
    assert proc.returncode == 2, proc.stderr
    assert f"$.segments[0]{'.blocks[0]' if field == 'size' else ''}.{field}" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    assert not list(tmp_path.glob(".out.new-*"))


def test_blocks_that_disagree_with_their_segment_are_a_stated_caveat(tmp_path):
    """Segment A says 16 MiB allocated (allocated_size) where its blocks in use add up to 14:
    the allocator's own totals are reported — 17 MiB with B's 1 — and the disagreement is said;
    the snapshot whose blocks agree has no caveat."""
    doc = hand_made()
    doc["segments"][0]["allocated_size"] = 16 * MiB
    path = tmp_path / "rank0.pickle"
    path.write_bytes(pickle.dumps(doc))
    _, _, (s,) = snapshot.analyse(0, snapshot.read(path), path.name)
    assert s["allocated_bytes"] == 17 * MiB
    assert s["caveat"] == ("the blocks in use add up to 15.00 MiB but the segments' own totals "
                           "(allocated_size) to 17.00 MiB: the segment totals are reported, "
                           "the live blocks by site are the blocks'")
    path.write_bytes(pickle.dumps(hand_made()))
    assert snapshot.analyse(0, snapshot.read(path), path.name)[2][0]["caveat"] is None
    proc = meshscope("analyze", path, "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stderr[-1500:]
    doc["segments"][0]["allocated_size"] = 16 * MiB
    (tmp_path / "bad.pickle").write_bytes(pickle.dumps(doc))
    text = meshscope("analyze", tmp_path / "bad.pickle", "--out", tmp_path / "bad").stdout
    assert "caveat: the blocks in use add up to 15.00 MiB" in text


def _oom_2_0(weights: int, activations: int, free: int, asked: int) -> dict:
    """Issue 48's case, built to PyTorch 2.0's layout: one 2 GiB-aligned segment holding the
    weights a model's loader placed (frames of ``load_state_dict``) and the activations a
    forward made, then an ``oom`` asking for ``asked`` bytes with ``free`` free."""
    base = 0x7F0000000000
    w = [{"filename": "/venv/torch/nn/modules/module.py", "line": 2153,
          "name": "load_state_dict"}, {"filename": "/app/load.py", "line": 20, "name": "load"}]
    a = [{"filename": "/app/model.py", "line": 77, "name": "forward"}]
    blocks = [{"size": weights, "state": "active_allocated",
               "history": [{"addr": base, "real_size": weights, "frames": w}]},
              {"size": activations, "state": "active_allocated",
               "history": [{"addr": base + weights, "real_size": activations, "frames": a}]}]
    total = weights + activations
    seg = {"device": 0, "address": base, "total_size": total, "stream": 0,
           "segment_type": "large", "allocated_size": total, "active_size": total,
           "blocks": blocks}
    log = [{"action": "segment_alloc", "addr": base, "size": total, "stream": 0},
           {"action": "alloc", "addr": base, "size": weights, "stream": 0, "frames": w},
           {"action": "alloc", "addr": base + weights, "size": activations, "stream": 0,
            "frames": a},
           {"action": "oom", "size": asked, "stream": 0, "device_free": free, "frames": a}]
    return {"segments": [seg], "device_traces": [log]}


def test_an_oom_snapshot_is_explained_by_what_the_device_held(tmp_path):
    """Weights fill the device (7 GiB of an 11 GiB one), activations 3 GiB; the forward asks
    for 1.5 GiB with 0.5 GiB free: 1 GiB from fitting. The explanation names the weights and
    the activations by the stacks that made them, the 1 GiB, and that shrinking either by it
    — with the change an engineer makes for each — makes it fit."""
    GiB = 1 << 30
    path = tmp_path / "rank0.pickle"
    path.write_bytes(pickle.dumps(_oom_2_0(7 * GiB, 3 * GiB, GiB // 2, 3 * GiB // 2)))
    doc = json.loads(meshscope("analyze", path, "--json", "--out", tmp_path / "r",
                               check=True).stdout)
    o = doc["memory"]["snapshots"][0]["oom"]
    assert o["held_bytes"]["weights"] == 7 * GiB and o["held_bytes"]["activations"] == 3 * GiB
    assert o["held_bytes"]["optimizer"] == 0 and o["held_bytes"]["allocator cache"] == 0
    assert o["shortfall_bytes"] == GiB
    assert o["explained"].startswith("the device held weights 7.00 GiB, activations 3.00 GiB "
                                     "(of about 10.50 GiB: reserved and free at the error")
    assert "; it was 1.00 GiB from fitting" in o["explained"]
    assert [f.split(" (")[0] for f in o["fits_if"]] == ["weights", "activations"]
    assert "shard the weights" in o["fits_if"][0] and "recompute" in o["fits_if"][1]
    f = next(f for f in doc["findings"] if f["id"] == "near-oom")
    assert "weights 7.00 GiB" in f["title"] and f["remedy"].startswith("weights (7.00 GiB held)")


@pytest.mark.parametrize("frames, kind", [
    ([("/venv/torch/optim/adam.py", 120, "_init_group"), ("/app/train.py", 9, "step")],
     "optimizer"),
    ([("/venv/torch/autograd/graph.py", 824, "_engine_run_backward")], "gradients"),
    ([("/venv/torch/nn/modules/module.py", 942, "_apply"), ("/app/main.py", 3, "main")],
     "weights"),
    ([("/app/model.py", 40, "forward"), ("/venv/torch/nn/modules/module.py", 1773,
                                         "_call_impl")], "activations"),
    ([("/app/metrics.py", 5, "log")], "other"), ([], "other")])
def test_a_blocks_kind_is_told_by_its_stack(frames, kind):
    from meshscope.analysis.memory import oom
    from meshscope.analysis.memory.snapshot import Frame

    assert oom.kind_of([Frame(f, line, name) for f, line, name in frames]) == kind


def test_two_devices_and_an_expandable_segment_each_total_as_the_allocator_says(tmp_path):
    """A snapshot of two devices (torch ≥ 2.1 layout, PyTorch's own keys): device 0 as
    ``hand_made``; device 1 one expandable segment (``is_expandable``, grown by
    ``segment_map``) of 64 MiB holding 40 MiB asked as 39. Each device's reserved, allocated,
    active and requested bytes equal a scan of the segments written here, and the largest
    moment of device 1 follows its own log."""
    doc = hand_made()
    C = 0x7F1000000000
    blocks = [{"address": C, "size": 40 * MiB, "requested_size": 39 * MiB,
               "state": "active_allocated", "frames": F2},
              {"address": C + 40 * MiB, "size": 24 * MiB, "requested_size": 0,
               "state": "inactive", "frames": []}]
    doc["segments"].append({"device": 1, "address": C, "total_size": 64 * MiB, "stream": 0,
                            "segment_type": "large", "allocated_size": 40 * MiB,
                            "active_size": 40 * MiB, "requested_size": 39 * MiB,
                            "is_expandable": True, "blocks": blocks})
    doc["device_traces"].append([
        {"action": "segment_map", "addr": C, "size": 64 * MiB, "stream": 0, "time_us": 1},
        {"action": "alloc", "addr": C, "size": 40 * MiB, "stream": 0, "time_us": 2,
         "frames": F2}])
    path = tmp_path / "rank0.pickle"
    path.write_bytes(pickle.dumps(doc))
    _, _, summaries = snapshot.analyse(0, snapshot.read(path), path.name)
    by_device = {s["device"]: s for s in summaries}
    for device, index in (("cuda:0", 0), ("cuda:1", 1)):
        segs = [s for s in doc["segments"] if s["device"] == index]
        live = [b for s in segs for b in s["blocks"] if b["state"] != "inactive"]
        scan = (sum(s["total_size"] for s in segs), sum(s["allocated_size"] for s in segs),
                sum(s["active_size"] for s in segs), sum(b["requested_size"] for b in live))
        got = by_device[device]
        assert (got["reserved_bytes"], got["allocated_bytes"], got["active_bytes"],
                got["requested_bytes"]) == scan, device
        assert got["caveat"] is None
    assert (by_device["cuda:1"]["largest_allocated_bytes"],
            by_device["cuda:1"]["largest_reserved_bytes"]) == (40 * MiB, 64 * MiB)


def test_a_block_awaiting_free_is_held_not_free_as_torchs_own_reading_says(tmp_path):
    """A block freed by its tensor but still in use by another stream (``record_stream``: the
    allocator's ``active_awaiting_free``) is memory held, not free. Against torch's own reading
    of the same file (``torch.cuda._memory_viz.segments``, each block written under its state
    as the allocator named it): free in the segments is what torch writes as ``inactive``; the
    requested bytes of the live blocks, what it writes under an ``active_`` state (issue 52:
    a mutant counting awaiting-free blocks as free passed every snapshot test before)."""
    from torch.cuda import _memory_viz

    doc = hand_made()
    seg_a = doc["segments"][0]
    seg_a["blocks"][1]["state"] = "active_awaiting_free"   # the 4 MiB temporary, on a stream
    seg_a["blocks"][1]["frames"] = F4
    seg_a["active_size"] = 18 * MiB                         # allocated 14 + awaiting free 4
    path = tmp_path / "rank0.pickle"
    path.write_bytes(pickle.dumps(doc))
    _, _, (s,) = snapshot.analyse(0, snapshot.read(path), path.name)

    by_state: dict[str, int] = {}
    for line in _memory_viz.segments(doc, format_flamegraph=lambda text: text).splitlines():
        stack, size = line.rsplit(" ", 1)
        state = stack.split(";")[2]
        by_state[state] = by_state.get(state, 0) + int(size)
    assert by_state == {"active_allocated": 15 * MiB, "active_awaiting_free": 4 * MiB,
                        "inactive": 3 * MiB}
    assert s["free_in_segments_bytes"] == by_state["inactive"]
    assert s["requested_bytes"] == by_state["active_allocated"] + by_state["active_awaiting_free"]
    assert s["active_bytes"] == 19 * MiB and s["allocated_bytes"] == 15 * MiB
