"""``analysis/gpu/idle.py``'s ``causes`` and ``stream_idle`` called directly on hand-made
intervals whose partition is known by construction (issue 52 item 1, item 3 of the brief: its
survivors in ``causes`` and ``stream_idle``; the traces of ``test_gpu_idle.py`` reach them
through the whole analysis).

One idle stretch [0, 100] µs on a device whose next kernel starts at 100, launched by a call
on thread ``h`` from 60 to 70: 0-60 the device waited for the host, charged by what ``h`` was
doing, 60-70 it was inside the launching call, 70-100 the work was queued."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from meshscope.analysis.gpu import idle

H = "cpu:1:1"


def _iv(*pairs) -> np.ndarray:
    return np.array(pairs, dtype=np.float64).reshape(-1, 2)


def _length(s: np.ndarray) -> float:
    return float((s[:, 1] - s[:, 0]).sum()) if len(s) else 0.0


def _causes(sets, launch=(60.0, 70.0), lane=H, sync_spans=None, gaps=_iv((0, 100)),
            dev_ts=(100.0,)):
    n = len(dev_ts)
    return idle.causes(gaps, np.array(dev_ts, dtype=np.float64),
                       np.full(n, launch[0]), np.array([lane] * n, dtype=object),
                       {H: sets}, H, sync_spans or {}, np.full(n, launch[1]))


def test_the_host_part_is_charged_in_order_and_the_parts_cover_the_stretch():
    """Host 0-60: the data loader 0-20 (and a sync 15-25 under it: the loader first), a sync
    20-30, a collective's host call 30-40, stream creation 40-45, a runtime call 45-50 and a
    copy call 50-52, an operator 52-55, nothing traced 55-60."""
    sets = {"dataloader": _iv((0, 20)), "sync": _iv((15, 30)), "comm": _iv((30, 40)),
            "startup": _iv((40, 45)), "runtime": _iv((45, 50)), "copy": _iv((50, 52)),
            "cpu": _iv((52, 55), (58, 58))}
    out = _causes(sets)
    got = {c: out[c].tolist() for c in idle.CAUSES}
    assert got == {"dataloader": [[0, 20]], "sync": [[20, 30]], "wait_rank": [[30, 40]],
                   "startup": [[40, 45]], "launch": [[45, 52], [60, 70]],
                   "cpu": [[52, 55]], "other": [[55, 60]], "queued": [[70, 100]]}
    assert out[idle.SLOW_LAUNCH].tolist() == []
    assert sum(_length(out[c]) for c in idle.CAUSES) == pytest.approx(100.0)


def test_a_slow_launch_call_and_a_launch_blocked_by_its_copy():
    """The launching call 60-70 inside a slow launch (55-90): its 10 µs are slow launch time,
    and so is the host's 55-60 in that call; the same call inside a blocking copy is sync."""
    out = _causes({"runtime": _iv((55, 90)), "slow_launch": _iv((55, 90))})
    assert out["launch"].tolist() == [[55, 70]]
    assert out[idle.SLOW_LAUNCH].tolist() == [[55, 70]]
    assert out["other"].tolist() == [[0, 55]] and out["queued"].tolist() == [[70, 100]]
    blocked = _causes({"blocking_copy": _iv((60, 80))})
    assert blocked["sync"].tolist() == [[60, 80]]
    assert blocked["launch"].tolist() == [] and blocked["queued"].tolist() == [[80, 100]]


def test_no_launch_record_is_host_time_and_a_launch_before_the_stretch_is_queued():
    out = _causes({"cpu": _iv((0, 100))}, launch=(np.nan, np.nan))
    assert out["cpu"].tolist() == [[0, 100]] and out["queued"].tolist() == []
    early = _causes({"cpu": _iv((0, 100))}, launch=(-10.0, -5.0))
    assert early["queued"].tolist() == [[0, 100]] and early["cpu"].tolist() == []
    # nothing after the stretch on the device: the host's, all of it
    last = _causes({"cpu": _iv((0, 100))}, dev_ts=(50.0,), gaps=_iv((60, 100)))
    assert last["cpu"].tolist() == [[60, 100]] and last["queued"].tolist() == []
    empty = idle.causes(idle.iv.EMPTY, np.zeros(0), np.zeros(0), np.zeros(0, dtype=object),
                        {}, None, {})
    assert all(len(v) == 0 for v in empty.values())
    assert set(empty) == set(idle.CAUSES) | {idle.SLOW_LAUNCH}


def test_the_host_time_after_a_synchronisation_is_bounded_by_what_it_held():
    """A synchronisation on ``h`` from -20 to 0 (20 µs, ending as the stretch begins): of the
    host's 60 µs after it, 20 are charged to it, the rest to what the host did (nothing
    traced: other). One that ended 60 µs before the stretch is too far (over 50 µs)."""
    spans = {H: (np.array([-20.0]), np.array([0.0]))}
    out = _causes({}, sync_spans=spans)
    assert out["sync"].tolist() == [[0, 20]] and out["other"].tolist() == [[20, 60]]
    edge = _causes({}, sync_spans={H: (np.array([-70.0]), np.array([-50.0]))})
    assert edge["sync"].tolist() == [[0, 20]]                # 50 µs before: still within
    far = _causes({}, sync_spans={H: (np.array([-80.0]), np.array([-60.0]))})
    assert far["sync"].tolist() == [] and far["other"].tolist() == [[0, 60]]


def _device(rows):
    return pd.DataFrame(rows, columns=["lane", "ts_us", "end_us"])


def test_stream_idle_labels_each_gap_as_hta_does():
    """Stream 7: kernels at 0-10, 15-20 (launched at 5, before the gap: a 5 µs kernel wait),
    60-70 (launched at 50, after the previous ended at 20: a 40 µs host wait), 120-130
    (launched at 60: a 50 µs gap, over 30 µs: other). Stream 8: 0-10 then 40-50 launched at
    35 (a 30 µs host wait), and 80-90 launched at 45 with a 30 µs gap — not under 30: other."""
    dev = _device([("stream 7", 0.0, 10.0), ("stream 7", 60.0, 70.0),
                   ("stream 7", 15.0, 20.0), ("stream 7", 120.0, 130.0),
                   ("stream 8", 0.0, 10.0), ("stream 8", 40.0, 50.0),
                   ("stream 8", 80.0, 90.0)])
    launch = np.array([-1.0, 50.0, 5.0, 60.0, -1.0, 35.0, 45.0])
    got = idle.stream_idle(3, dev, launch)
    assert list(got.columns) == idle.STREAM_COLUMNS
    rows = {r["stream"]: r for r in got.to_dict("records")}
    assert rows["stream 7"] == {"rank": 3, "stream": "stream 7", "idle_us": 95.0,
                                "host_wait_us": 40.0, "kernel_wait_us": 5.0,
                                "other_us": 50.0}
    assert rows["stream 8"] == {"rank": 3, "stream": "stream 8", "idle_us": 60.0,
                                "host_wait_us": 30.0, "kernel_wait_us": 0.0,
                                "other_us": 30.0}
    assert list(rows) == ["stream 7", "stream 8"]
    empty = idle.stream_idle(0, _device([]), np.zeros(0))
    assert list(empty.columns) == idle.STREAM_COLUMNS and empty.empty


def test_covered_us_counts_the_set_inside_each_window():
    s = _iv((0, 10), (20, 30))
    got = idle.covered_us(s, [5, 0, 25, 40, 12], [25, 100, 26, 50, 18])
    assert got.tolist() == [10.0, 20.0, 1.0, 0.0, 0.0]
    assert idle.covered_us(idle.iv.EMPTY, [0], [10]).tolist() == [0.0]


def test_only_copies_of_pageable_or_unnamed_host_memory_block_the_host():
    names = ["Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)",
             "Memcpy DtoD (Device -> Device)", "Memcpy HtoD", "Memcpy DtoH (Device -> Pageable)",
             "HtoD_kernel", "Memcpy DtoH (Device -> Pageable)"]
    cats = ["gpu_memcpy"] * 5 + ["kernel", "gpu_memcpy"]
    device = pd.DataFrame({"cat": cats, "name": names})
    ts = np.array([0.0, 10, 20, 30, 40, 50, np.nan])
    end = ts + 5
    lanes = np.array([H, H, H, "cpu:1:2", H, H, H], dtype=object)
    got = idle.blocking_copies(device, ts, end, lanes)
    assert {k: v.tolist() for k, v in got.items()} == {H: [[0, 5], [40, 45]],
                                                       "cpu:1:2": [[30, 35]]}
    assert idle.blocking_copies(device.iloc[[1, 2]], ts[1:3], end[1:3], lanes[1:3]) == {}
    assert idle.blocking_copies(device.iloc[0:0], ts[:0], end[:0], lanes[:0]) == {}


def test_synchronisations_by_thread_sorted_by_end_without_event_waits():
    calls = pd.DataFrame({"name": ["cudaDeviceSynchronize", "cudaStreamWaitEvent",
                                   "cudaStreamSynchronize", "cudaMemcpyAsync"],
                          "lane": [H, H, H, "cpu:1:2"], "ts_us": [0.0, 5, 2, 7],
                          "end_us": [30.0, 40, 10, 9]})
    got = idle.sync_spans_by_lane(calls)
    assert {k: (a.tolist(), b.tolist()) for k, (a, b) in got.items()} == {
        H: ([2.0, 0.0], [10.0, 30.0]), "cpu:1:2": ([7.0], [9.0])}
    assert idle.sync_spans_by_lane(calls.iloc[0:0]) == {}


def test_without_launch_ends_the_call_is_an_instant_and_a_sync_blocks_the_queue():
    """No end of the launching call given: it takes no time — the host part up to 60, the
    queue after. A synchronisation on the launching thread from 60 to 80 blocks it: sync."""
    out = idle.causes(_iv((0, 100)), np.array([100.0]), np.array([60.0]),
                      np.array([H], dtype=object), {H: {}}, H, {})
    assert out["launch"].tolist() == [] and out["queued"].tolist() == [[60, 100]]
    assert out["other"].tolist() == [[0, 60]]
    synced = _causes({"sync": _iv((60, 80))})
    assert synced["sync"].tolist() == [[60, 80]] and synced["launch"].tolist() == []
    assert synced["queued"].tolist() == [[80, 100]]


def test_a_copy_without_a_name_blocks_nothing():
    device = pd.DataFrame({"cat": ["gpu_memcpy", "gpu_memcpy"],
                           "name": [None, "Memcpy DtoH (Device -> Pageable)"]})
    got = idle.blocking_copies(device, np.array([0.0, 10.0]), np.array([5.0, 15.0]),
                               np.array([H, H], dtype=object))
    assert {k: v.tolist() for k, v in got.items()} == {H: [[10, 15]]}


def test_sync_idle_is_charged_to_the_call_it_lies_in_or_follows():
    """A synchronisation 0-10 µs: 5 µs of sync idle inside it (5-10) and 20 after it (10-30,
    within 50 µs of its end): 25 µs charged to it; a copy call charges only what lies in it."""
    calls = pd.DataFrame({"name": ["cudaDeviceSynchronize", "cudaMemcpyAsync"],
                          "lane": [H, H], "ts_us": [0.0, 100.0], "end_us": [10.0, 110.0]})
    got = idle.charged_sync(calls, _iv((5, 30), (105, 107)))
    assert got["idle_after_us"].tolist() == [25.0, 2.0]
    none = idle.charged_sync(calls, idle.iv.EMPTY)
    assert none["idle_after_us"].tolist() == [0.0, 0.0]
