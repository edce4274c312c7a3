"""nccl-tests' bandwidth definitions, message-size buckets, and both on real NCCL kernels."""
import math

import numpy as np
import pandas as pd
import pytest

from meshscope.analysis.comm import bandwidth as bw
from meshscope.analysis.ingest.events import load_trace
from conftest import shared_trace


@pytest.mark.parametrize("op,n,factor", [
    ("all_reduce", 8, 1.75), ("allreduce", 2, 1.0), ("all_reduce", 1, 0.0),
    ("all_gather", 4, 0.75), ("_allgather_base", 8, 7 / 8),
    ("reduce_scatter", 4, 0.75), ("_reduce_scatter_base", 2, 0.5),
    ("all_to_all", 16, 15 / 16), ("alltoall_base", 4, 0.75),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("send", 2, 1.0), ("recv", 2, 1.0),
    ("sendrecv", 8, 1.0),
])
def test_bus_factor(op, n, factor):
    assert bw.bus_factor(op, n) == pytest.approx(factor)


@pytest.mark.parametrize("name,op", [
    ("gloo:all_reduce", "all_reduce"), ("nccl:_all_gather_base", "all_gather"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reduce_scatter"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "send_recv"),
    ("reduce_scatter_tensor_coalesced", "reduce_scatter"), ("all_to_all_single", "all_to_all"),
    ("gloo:recv", "recv"), ("c10d::send", "send"), ("all_reduce_perf", "all_reduce"),
    ("barrier", None), ("wait", None), ("ncclDevKernel_Generic", None), (None, None),
])
def test_canonical_op(name, op):
    assert bw.canonical_op(name) == op


def test_unknown_op_and_bad_group_are_refused():
    with pytest.raises(ValueError, match="unknown collective"):
        bw.bus_factor("barrier", 4)
    with pytest.raises(ValueError, match="group size"):
        bw.bus_factor("all_reduce", 0)


def test_algbw_units():
    assert bw.algbw_gbps(1e9, 1e6) == pytest.approx(1.0)       # 1 GB in 1 s
    assert bw.algbw_gbps(8 * 2**30, 63896) == pytest.approx(134.44, abs=0.005)  # nccl-tests row
    assert math.isnan(bw.algbw_gbps(1, 0))
    assert bw.busbw_gbps("all_reduce", 1e9, 1e6, 4) == pytest.approx(1.5)


def test_vectorised_matches_per_instance():
    df = pd.DataFrame({
        "coll_name": ["allreduce", "_allgather_base", "broadcast", "gloo:send", "barrier",
                      "allreduce", "alltoall"],
        "msg_bytes": pd.array([4096, 1 << 20, 100, 64, 8, None, 1 << 30], dtype="Int64"),
        "dur_us": [10.0, 100.0, 1.0, 2.0, 1.0, 5.0, 0.0],
        "group_size": pd.array([8, 4, 2, 2, 2, 8, 16], dtype="Int64"),
    })
    out = bw.add_bandwidth(df, op="coll_name")
    for i in range(3):
        row = df.iloc[i]
        assert out["busbw_gbps"].iloc[i] == pytest.approx(bw.busbw_gbps(
            row["coll_name"], row["msg_bytes"], row["dur_us"], row["group_size"]))
    assert out["bus_factor"].iloc[3] == 1.0 and out["algbw_gbps"].iloc[3] == pytest.approx(0.032)
    assert out[["bus_factor", "busbw_gbps"]].iloc[4].isna().all()     # barrier: no op
    assert np.isnan(out["busbw_gbps"].iloc[5])                        # size unknown
    assert np.isnan(out["algbw_gbps"].iloc[6])                        # zero time
    assert bw.add_bandwidth(df.iloc[:0], op="coll_name").empty


def test_group_size_not_world_size():
    """An all_reduce over a 2-rank dp group in a world of 8: f = 1, not 1.75."""
    df = pd.DataFrame({"op": ["all_reduce"], "msg_bytes": [1e9], "dur_us": [1e6],
                       "group_size": [2], "world_size": [8]})
    assert bw.add_bandwidth(df)["busbw_gbps"].iloc[0] == pytest.approx(1.0)


def test_size_buckets():
    cases = {0: 0, 1: 1, 2: 2, 3: 2, 1023: 512, 1024: 1024, 1025: 1024,
             (1 << 40) + 5: 1 << 40, 115456 * 4: 1 << 18}
    for size, bucket in cases.items():
        assert bw.size_bucket(size) == bucket
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 1 << 45, 2000)
    assert list(bw.size_buckets(sizes)) == [bw.size_bucket(s) for s in sizes]
    assert list(bw.size_buckets([None, -1, 4096])) == [-1, -1, 4096]
    assert [bw.bucket_label(b) for b in (0, 512, 1 << 16, 3 << 20, 1 << 31)] == \
        ["0 B", "512 B", "64 KiB", "3 MiB", "2 GiB"]
    with pytest.raises(ValueError):
        bw.size_bucket(-1)


def test_real_nccl_kernels():
    """DDP on 2 A100s (nccl_data.json.gz): the kernels' record_param_comms arguments give S
    and n; busbw/algbw is the factor of a 2-rank group."""
    ev = load_trace(shared_trace("gpu/hta/nccl_parser_config/nccl_data.json.gz")).events
    kernels = ev[(ev["cat"] == "kernel") & ev["coll_name"].notna()]
    out = bw.add_bandwidth(kernels, op="coll_name")
    assert len(out) == 21 and out["busbw_gbps"].notna().all()
    assert (out["busbw_gbps"] / out["algbw_gbps"]).round(12).eq(1.0).all()  # n=2: f=1
    expected = out["msg_bytes"].astype(float) / out["dur_us"] / 1e3
    assert np.allclose(out["algbw_gbps"], expected)
    buckets = bw.size_buckets(out["msg_bytes"])
    assert (buckets <= out["msg_bytes"]).all() and (out["msg_bytes"] < 2 * buckets).all()


def _p2p_instances(rows):
    """A hand-made instance table of send/recv rows (rank, op, match_id, source, arrival,
    exec start, exec end), 1,000,000 bytes each, one step, all on one clock."""
    cols = ["rank", "op", "match_id", "source", "arrival_us", "exec_ts_us", "exec_end_us"]
    t = pd.DataFrame(rows, columns=cols)
    return t.assign(step=3, k=0, p2p=True, dim="pp", end_us=t["exec_end_us"],
                    call_ts_us=t["arrival_us"], call_end_us=t["arrival_us"] + 1.0,
                    seq=pd.array([None] * len(t), dtype="Int64"), pg_ranks="0,1",
                    group_size=2, backend_op=None,
                    msg_bytes=pd.array([1_000_000] * len(t), dtype="Int64"))


def test_p2p_transfer_is_the_time_both_kernels_run_and_the_rest_is_wait():
    """Transfer is not waiting (issue 23), known by construction:

    - k1 (NCCL kernels): the recv kernel spins from 50 µs, the send kernel starts at 100 and
      both end at 300: 200 µs of transfer (1 MB / 200 µs = 5 GB/s, busbw = algbw for
      send/recv); the receive's first 50 µs are waiting for its sender.
    - k2 (NCCL, grouped): rank 0's send and its recv of k3 share one kernel 400 → 600 (a
      grouped send/recv carries the batch, not one message): no transfer, no busbw.
    - g1 (gloo): the ranges are waits for asynchronous work — no transfer however they lie;
      the receive posted at 1000 waited 500 µs for the send posted at 1500.
    """
    from meshscope.analysis.comm import bandwidth_report, matching

    inst = _p2p_instances([
        (0, "send", "k1", "nccl", 100.0, 100.0, 300.0),
        (1, "recv", "k1", "nccl", 50.0, 50.0, 300.0),
        (0, "send", "k2", "nccl", 400.0, 400.0, 600.0),
        (1, "recv", "k2", "nccl", 410.0, 410.0, 590.0),
        (1, "send", "k3", "nccl", 420.0, 420.0, 580.0),
        (0, "recv", "k3", "nccl", 400.0, 400.0, 600.0),
        (0, "send", "g1", "gloo", 1500.0, 1600.0, 1700.0),
        (1, "recv", "g1", "gloo", 1000.0, 1000.0, 1700.0)])
    p2p = matching.p2p_table(inst).set_index("match_id")
    assert p2p.loc["k1", "transfer_us"] == 200.0
    assert (p2p.loc["k1", "recv_wait_us"], p2p.loc["k1", "send_wait_us"]) == (50.0, 0.0)
    assert p2p[["transfer_us"]].loc[["k2", "k3", "g1"]].isna().all().all()
    assert p2p.loc["g1", "recv_wait_us"] == 500.0 and p2p.loc["g1", "send_wait_us"] == 0.0
    table = bandwidth_report.bandwidth_table(
        inst, pd.DataFrame(columns=["match_id", "transfer_us"]), matching.p2p_table(inst))
    k1 = table[table["match_id"] == "k1"].set_index("op")
    assert k1["busbw_gbps"].tolist() == pytest.approx([5.0, 5.0])
    assert (k1.loc["recv", "wait_us"], k1.loc["send", "wait_us"]) == (50.0, 0.0)
    rest = table[table["match_id"] != "k1"]
    assert rest["busbw_gbps"].isna().all() and rest["transfer_us"].isna().all()
    g1 = table[table["match_id"] == "g1"].set_index("op")
    assert (g1.loc["recv", "wait_us"], g1.loc["send", "wait_us"]) == (500.0, 0.0)


def test_an_unmatched_send_has_no_bandwidth():
    """A send whose receive no trace holds: its span is a wait for a peer nobody saw, so no
    transfer and no busbw (a collective without a match still uses its own span)."""
    from meshscope.analysis.comm import bandwidth_report, matching

    inst = _p2p_instances([(0, "send", "", "nccl", 100.0, 100.0, 300.0)])
    table = bandwidth_report.bandwidth_table(
        inst, pd.DataFrame(columns=["match_id", "transfer_us"]), matching.p2p_table(inst))
    assert len(table) == 1 and pd.isna(table["transfer_us"].iloc[0])
    assert pd.isna(table["busbw_gbps"].iloc[0])


def _summary_rows():
    """A bandwidth table whose summary is known by construction: per (dim, op, group_size,
    bucket), the values below, in an order that mixes the groups."""
    rows = [  # dim, op, group_size, msg_bytes, transfer_us, busbw_gbps
        ("tp", "all_reduce", 4, 1 << 20, 10.0, 1.0),
        ("dp", "all_reduce", 8, 3 << 20, 40.0, 8.0),
        ("tp", "all_reduce", 4, (1 << 20) + 7, 30.0, 3.0),
        ("dp", "all_reduce", 8, 2 << 20, 20.0, 2.0),
        ("tp", "all_reduce", 4, 1 << 20, np.nan, np.nan),       # counted, not in the medians
        ("pp", "send", None, None, np.nan, np.nan),              # no group size, no bytes
        ("tp", "all_reduce", 4, (1 << 20) + 1, 20.0, 5.0),
        ("dp", "all_reduce", 8, 1024, 1.0, 0.5),                 # another bucket
        ("dp", "all_reduce", 8, 2 << 20, 30.0, 4.0),
    ]
    t = pd.DataFrame(rows, columns=["dim", "op", "group_size", "msg_bytes", "transfer_us",
                                    "busbw_gbps"])
    return t.astype({"dim": "str", "op": "str", "group_size": "Int64", "msg_bytes": "Int64"})


def test_bandwidth_summary_medians_by_construction():
    from meshscope.analysis.comm import bandwidth_report

    out = bandwidth_report.bandwidth_summary(_summary_rows())
    assert list(out.columns) == bandwidth_report.SUMMARY_COLUMNS
    got = [(r.dim, r.op, None if pd.isna(r.group_size) else int(r.group_size),
            int(r.size_bucket), int(r.instances),
            None if pd.isna(r.msg_bytes) else float(r.msg_bytes),
            None if pd.isna(r.transfer_us) else r.transfer_us,
            None if pd.isna(r.busbw_gbps) else r.busbw_gbps,
            None if pd.isna(r.busbw_max_gbps) else r.busbw_max_gbps)
           for r in out.itertuples()]
    assert got == [
        # sorted by dim, op, group size, bucket; 2, 2 and 3 MiB are all in the 2 MiB bucket
        ("dp", "all_reduce", 8, 1024, 1, 1024.0, 1.0, 0.5, 0.5),
        ("dp", "all_reduce", 8, 2 << 20, 3, float(2 << 20), 30.0, 4.0, 8.0),
        ("pp", "send", None, -1, 1, None, None, None, None),
        # four rows; the medians of the three known values (the middle one) and of the bytes
        # of all four (the mean of the two middle ones)
        ("tp", "all_reduce", 4, 1 << 20, 4, (1 << 20) + 0.5, 20.0, 3.0, 5.0),
    ]
    assert out["efficiency"].isna().all()


@pytest.mark.parametrize("rows_per_part", [1, 2, 4, 9])
def test_bandwidth_summary_of_parts_is_that_of_the_table(rows_per_part):
    """Given as parts read one after another (the report's bandwidth table on disk, issue 51),
    the summary is the same, in the same order and types, wherever the parts cut the groups;
    each part is read once for the groups and once for each column (so ``table`` is a
    function giving them afresh)."""
    from meshscope.analysis.comm import bandwidth_report

    t = _summary_rows()
    reads = []

    def parts():
        reads.append(1)
        yield t.iloc[:0]
        for start in range(0, len(t), rows_per_part):
            yield t.iloc[start:start + rows_per_part]
    pd.testing.assert_frame_equal(bandwidth_report.bandwidth_summary(parts),
                                  bandwidth_report.bandwidth_summary(t), check_exact=True)
    assert len(reads) == 4
    empty = bandwidth_report.bandwidth_summary(lambda: iter([t.iloc[:0]]))
    assert list(empty.columns) == bandwidth_report.SUMMARY_COLUMNS and empty.empty


def test_bandwidth_summary_of_parts_whose_types_differ():
    """Parts whose columns' types differ (a part with no dimension at all holds object nulls, a
    part's group sizes floats) are summarised as the table pandas makes of them."""
    from meshscope.analysis.comm import bandwidth_report

    t = _summary_rows()
    a = t.iloc[:4].assign(dim=pd.Series([None] * 4, dtype=object))
    b = t.iloc[4:].astype({"group_size": "float64"})
    whole = pd.concat([a, b], ignore_index=True)
    out = bandwidth_report.bandwidth_summary(lambda: iter([a, b]))
    pd.testing.assert_frame_equal(out, bandwidth_report.bandwidth_summary(whole),
                                  check_exact=True)
    assert out["dim"].isna().sum() == 2        # the first part's two groups, kept apart


def test_bandwidth_summary_is_pandas_groupby_of_the_whole_table():
    """Against pandas' own grouped median and maximum of the whole table (its sort of the
    groups, its median of an even count, its missing values), on a random table of many
    groups given as parts of 1,000 rows."""
    from meshscope.analysis.comm import bandwidth_report

    rng = np.random.default_rng(7)
    n = 20_000
    t = pd.DataFrame({
        "dim": pd.array(rng.choice(["dp", "tp", "pp", "unknown"], n), dtype="str"),
        "op": pd.array(rng.choice(["all_reduce", "all_gather", "send"], n), dtype="str"),
        "group_size": pd.array(rng.choice([2, 4, 8], n), dtype="Int64"),
        "msg_bytes": pd.array(rng.integers(0, 1 << 24, n), dtype="Int64"),
        "transfer_us": rng.choice([1.0, 2.5, 7.0, 11.0], n) * rng.integers(1, 4, n),
        "busbw_gbps": rng.random(n) * 100})
    t.loc[rng.random(n) < 0.05, "group_size"] = pd.NA
    t.loc[rng.random(n) < 0.05, "msg_bytes"] = pd.NA
    t.loc[rng.random(n) < 0.1, "transfer_us"] = np.nan
    t.loc[rng.random(n) < 0.1, "busbw_gbps"] = np.nan
    expected = t.assign(size_bucket=bw.size_buckets(t["msg_bytes"])).groupby(
        ["dim", "op", "group_size", "size_bucket"], dropna=False).agg(
        instances=("transfer_us", "size"), msg_bytes=("msg_bytes", "median"),
        transfer_us=("transfer_us", "median"), busbw_gbps=("busbw_gbps", "median"),
        busbw_max_gbps=("busbw_gbps", "max")).reset_index()
    got = bandwidth_report.bandwidth_summary(
        lambda: (t.iloc[s:s + 1000] for s in range(0, n, 1000)))
    assert len(expected) > 200 and expected["group_size"].isna().any()
    pd.testing.assert_frame_equal(got[list(expected.columns)], expected, check_exact=True)
