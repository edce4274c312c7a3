"""The rows meshscope makes of a memory snapshot, field by field, against torch's own reading of
the same file (issue 52 item 1: ``snapshot.segment_rows``, ``live_rows`` and ``read`` kept
their row fields and messages unread by any test — 71% of their mutants killed).

- per segment (``segment_rows``): ``torch.cuda._memory_viz.segments`` writes one line per
  block — ``stream_S;seg_ADDRESS;STATE;stack SIZE`` — so each segment's blocks, their states,
  sizes and stream are torch's; meshscope's allocated, active, free and largest free bytes
  and block count are sums and maxima over those lines (segments without the allocator's own
  totals, so that the blocks are what is read; three devices and streams);
- the live blocks by site (``live_rows``): 32 sites of 1…32 MiB built here — the 30 largest
  each a row, the two smallest one ``(other)`` row of 3 MiB — with their shares of the total
  that ``_memory_viz.segsum`` reports allocated.
"""
from __future__ import annotations

import copy
import json
import pickle
import re

import pytest

from meshscope.analysis.memory import snapshot

MiB = 1 << 20


def _frames(i: int) -> list[dict]:
    return [{"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
             "line": 125, "name": "forward"},
            {"filename": f"/home/u/layer{i}.py", "line": 10 + i, "name": f"make{i}"},
            {"filename": "/home/u/train.py", "line": 7, "name": "main"},
            {"filename": "/home/u/run.py", "line": 1, "name": "<module>"}]


def _mixed() -> dict:
    """Three segments on two devices and two streams, without the allocator's own totals:
    S1 (device 0, stream 0): 3 MiB in use, 2 MiB awaiting free, 1 + 4 MiB free;
    S2 (device 0, stream 7): 2 MiB in use, 6 MiB free;
    S3 (device 1): no blocks at all (a segment of 16 MiB: free is its size)."""
    def b(size, state, i=0):
        return {"size": size * MiB, "state": state, "requested_size": size * MiB,
                "frames": _frames(i) if state != "inactive" else []}

    def seg(addr, device, stream, blocks, kind="large"):
        total = sum(x["size"] for x in blocks) or 16 * MiB
        at = addr
        for x in blocks:
            x["address"] = at
            at += x["size"]
        return {"device": device, "address": addr, "total_size": total, "stream": stream,
                "segment_type": kind, "blocks": blocks}
    return {"segments": [
        seg(0x9000_0000, 0, 7, [b(2, "active_allocated", 1), b(6, "inactive")], "small"),
        seg(0x1000_0000, 0, 0, [b(3, "active_allocated", 2), b(1, "inactive"),
                                b(2, "active_awaiting_free", 3), b(4, "inactive")]),
        seg(0x5000_0000, 1, 0, [])], "device_traces": []}


def _torch_segments(doc: dict) -> dict[int, dict]:
    """Per segment address: its stream, block count and bytes by state, from torch's lines."""
    from torch.cuda import _memory_viz

    out: dict[int, dict] = {}
    text = _memory_viz.segments(copy.deepcopy(doc), format_flamegraph=lambda t: t)
    for line in text.splitlines():
        stack, size = line.rsplit(" ", 1)
        stream, seg, state = stack.split(";")[:3]
        s = out.setdefault(int(seg[len("seg_"):]),
                           {"stream": int(stream[len("stream_"):]), "blocks": 0,
                            "sizes": {}})
        s["blocks"] += 1
        s["sizes"].setdefault(state, []).append(int(size))
    return out


def test_each_segments_row_is_the_sum_of_its_blocks_as_torch_reads_them(tmp_path):
    doc = _mixed()
    path = tmp_path / "rank3.pickle"
    path.write_bytes(pickle.dumps(doc))
    rows = snapshot.segment_rows(3, snapshot.read(path), "rank3.pickle")
    torch_says = _torch_segments(doc)
    # sorted by device, then address
    assert [(r["device"], r["address"]) for r in rows] == [
        ("cuda:0", 0x1000_0000), ("cuda:0", 0x9000_0000), ("cuda:1", 0x5000_0000)]
    for r in rows:
        assert (r["rank"], r["source"]) == (3, "rank3.pickle")
        seg = next(s for s in doc["segments"] if s["address"] == r["address"])
        assert (r["segment_type"], r["total_bytes"]) == (seg["segment_type"], seg["total_size"])
        said = torch_says.get(r["address"])
        if said is None:            # torch writes no line for a segment without blocks
            assert seg["blocks"] == []
            assert (r["blocks"], r["allocated_bytes"], r["active_bytes"]) == (0, 0, 0)
            assert (r["free_bytes"], r["largest_free_bytes"]) == (16 * MiB, 0)
            continue
        sizes = said["sizes"]
        assert r["stream"] == said["stream"] and r["blocks"] == said["blocks"]
        assert r["allocated_bytes"] == sum(sizes.get("active_allocated", []))
        assert r["active_bytes"] == sum(sizes.get("active_allocated", [])) + \
            sum(sizes.get("active_awaiting_free", []))
        assert r["free_bytes"] == sum(sizes.get("inactive", []))
        assert r["largest_free_bytes"] == max(sizes.get("inactive", [0]))
    s1 = rows[0]
    assert (s1["allocated_bytes"], s1["active_bytes"], s1["free_bytes"],
            s1["largest_free_bytes"], s1["blocks"]) == (3 * MiB, 5 * MiB, 5 * MiB, 4 * MiB, 4)


def test_the_allocators_own_totals_are_taken_where_given(tmp_path):
    doc = _mixed()
    seg = doc["segments"][1]
    seg["allocated_size"], seg["active_size"] = 11 * MiB, 13 * MiB
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    rows = {r["address"]: r for r in snapshot.segment_rows(0, snapshot.read(path), "r.json")}
    r = rows[0x1000_0000]
    assert (r["allocated_bytes"], r["active_bytes"]) == (11 * MiB, 13 * MiB)
    # free is still the blocks': torch's inactive lines
    assert r["free_bytes"] == sum(_torch_segments(doc)[0x1000_0000]["sizes"]["inactive"])


def _many_sites(n: int = 32) -> dict:
    """One segment holding ``n`` live blocks of 1…n MiB, each made at its own site (the
    user's frame under torch's ``linear.py``), and one free MiB."""
    blocks, at = [], 0x2000_0000
    for i in range(1, n + 1):
        blocks.append({"address": at, "size": i * MiB, "requested_size": i * MiB,
                       "state": "active_allocated", "frames": _frames(i)})
        at += i * MiB
    blocks.append({"address": at, "size": MiB, "requested_size": MiB, "state": "inactive",
                   "frames": []})
    total = sum(b["size"] for b in blocks)
    return {"segments": [{"device": 0, "address": 0x2000_0000, "total_size": total,
                          "stream": 0, "segment_type": "large", "blocks": blocks}],
            "device_traces": [[]]}


def test_the_live_blocks_are_grouped_by_site_largest_first_the_rest_as_other(tmp_path):
    from torch.cuda import _memory_viz

    doc = _many_sites()
    path = tmp_path / "rank1.pickle"
    path.write_bytes(pickle.dumps(doc))
    _, live, (summary,) = snapshot.analyse(1, snapshot.read(path), "rank1.pickle")
    said = _memory_viz.segsum(copy.deepcopy(doc))
    allocated = float(re.search(r"^total_allocated: ([\d.]+)MiB$", said, re.M)[1]) * MiB
    assert summary["allocated_bytes"] == allocated == 528 * MiB      # 1 + 2 + … + 32
    assert len(live) == snapshot.TOP_LIVE + 1
    for row, i in zip(live, range(32, 2, -1)):
        assert row["site"] == f"make{i} (layer{i}.py:{10 + i})"
        assert row["frames"] == (f"forward (linear.py:125) ← make{i} (layer{i}.py:{10 + i}) "
                                 f"← main (train.py:7)")
        assert (row["bytes"], row["blocks"]) == (i * MiB, 1)
        assert row["share"] == pytest.approx(i / 528)
        assert (row["rank"], row["device"], row["source"]) == (1, "cuda:0", "rank1.pickle")
    other = live[-1]
    assert (other["site"], other["frames"], other["bytes"], other["blocks"]) == \
        ("(other)", "", 3 * MiB, 2)
    assert other["share"] == pytest.approx(3 / 528)
    assert (other["rank"], other["device"], other["source"]) == (1, "cuda:0", "rank1.pickle")


def test_blocks_of_one_site_are_one_row_and_ties_are_ordered_by_site(tmp_path):
    doc = _many_sites(3)
    blocks = doc["segments"][0]["blocks"]
    blocks[0]["frames"] = _frames(2)                 # the 1 MiB block made where the 2 MiB was
    blocks.insert(3, {**blocks[2], "address": blocks[2]["address"] + 3 * MiB,
                      "frames": [{"filename": "??", "line": 0, "name": "?"}]})
    blocks[4]["address"] += 3 * MiB                  # the free MiB after it
    doc["segments"][0]["total_size"] += 3 * MiB
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    _, live, _ = snapshot.analyse(0, snapshot.read(path), "r.json")
    # make2: 1 + 2 MiB in two blocks; make3: 3 MiB; the unknown frame: 3 MiB — the ties by
    # site's text
    assert [(r["site"], r["bytes"], r["blocks"]) for r in live] == [
        ("? (??:0)", 3 * MiB, 1), ("make2 (layer2.py:12)", 3 * MiB, 2),
        ("make3 (layer3.py:13)", 3 * MiB, 1)]
    assert sum(r["share"] for r in live) == pytest.approx(1.0)


def test_an_empty_snapshot_has_no_share(tmp_path):
    doc = {"segments": [{"device": 0, "address": 4096, "total_size": MiB, "blocks": [
        {"address": 4096, "size": MiB, "state": "inactive"}]}], "device_traces": [[]]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    seg, live, (s,) = snapshot.analyse(0, snapshot.read(path), "r.json")
    assert live == [] and s["allocated_bytes"] == 0 and s["reserved_bytes"] == MiB
    assert seg[0]["segment_type"] == "large" and seg[0]["stream"] == 0


def test_a_file_that_is_not_read_says_why(tmp_path):
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(_mixed()))
    size = path.stat().st_size
    with pytest.raises(snapshot.SnapshotError) as e:
        snapshot.read(path, max_bytes=size - 1)
    assert str(e.value) == (f"{path}: {size:,} bytes, more than the budget of {size - 1:,} "
                            f"(raise it with --max-trace-bytes)")
    assert snapshot.read(path, max_bytes=size).segments[0].device == 0
    with pytest.raises(snapshot.SnapshotError) as e:
        snapshot.read(tmp_path / "absent.pickle")
    assert str(e.value) == f"{tmp_path / 'absent.pickle'}: cannot read (No such file or " \
                           f"directory)"
    bad = tmp_path / "bad.json"
    bad.write_text('  {"segments": [}')
    with pytest.raises(snapshot.SnapshotError) as e:
        snapshot.read(bad)
    assert str(e.value).startswith(f"{bad}: not valid JSON (")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(snapshot.SnapshotError) as e:
        snapshot.read(listed)
    assert str(e.value) == f"{listed}: not a memory snapshot (no 'segments': " \
                           f"torch.cuda.memory._snapshot() writes one)"
    doc = _mixed()
    doc["segments"][0]["blocks"][1]["size"] = "six"
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps(doc))
    with pytest.raises(snapshot.SnapshotError) as e:
        snapshot.read(typed)
    assert str(e.value) == (f"{typed}: $.segments[0].blocks[1].size: Expected `int`, got "
                            f"`str` (not a usable memory snapshot)")


def test_the_largest_moment_holds_the_blocks_live_then(tmp_path):
    """A log whose largest moment is followed at once by a free: 4 MiB at A (t=1), 4 MiB at
    A+4 (t=2: 8 MiB, the largest), A+4 freed (t=3), 2 MiB at A+4 (t=4). At the end 6 MiB live;
    at the largest moment the two 4 MiB blocks, made at their own sites — by construction
    (the free right after the moment must be undone to see it)."""
    A = 0x3000_0000

    def act(action, addr, size, t, i=0):
        return {"action": action, "addr": addr, "size": size * MiB, "stream": 0,
                "time_us": t, "frames": _frames(i) if action == "alloc" else []}
    log = [act("segment_alloc", A, 10, 0), act("alloc", A, 4, 1, 1),
           act("alloc", A + 4 * MiB, 4, 2, 2), act("free_completed", A + 4 * MiB, 4, 3),
           act("alloc", A + 4 * MiB, 2, 4, 3)]
    blocks = [{"address": A, "size": 4 * MiB, "state": "active_allocated",
               "frames": _frames(1)},
              {"address": A + 4 * MiB, "size": 2 * MiB, "state": "active_allocated",
               "frames": _frames(3)},
              {"address": A + 6 * MiB, "size": 4 * MiB, "state": "inactive", "frames": []}]
    doc = {"segments": [{"device": 0, "address": A, "total_size": 10 * MiB, "stream": 0,
                         "segment_type": "large", "blocks": blocks}], "device_traces": [log]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    _, live, (s,) = snapshot.analyse(0, snapshot.read(path), "r.json")
    assert (s["allocated_bytes"], s["largest_allocated_bytes"], s["largest_at_us"]) == \
        (6 * MiB, 8 * MiB, 2)
    assert {r["site"]: r["bytes"] for r in live} == {
        "make1 (layer1.py:11)": 4 * MiB, "make2 (layer2.py:12)": 4 * MiB}
