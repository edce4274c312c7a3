"""Bandwidth against a known answer: a 4-rank gloo sweep of collectives of known sizes
(`meshscope bench-comm --profile`), analysed from its traces. Bytes per instance are exact and
busbw/algbw is nccl-tests' factor for the group size (4), written out here by hand."""
import json

import pandas as pd
import pytest

from conftest import meshscope

pytestmark = pytest.mark.slow

SIZES = (4096, 65536)
# nccl-tests' bus factors for n = 4 (PERFORMANCE.md of nccl-tests): all_reduce 2(n-1)/n,
# all_gather / reduce_scatter / all_to_all (n-1)/n, broadcast and send/recv 1.
FACTOR_N4 = {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75,
             "all_to_all": 0.75, "broadcast": 1.0, "send": 1.0, "recv": 1.0}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "sweep"
    meshscope("bench-comm", "--layout", "dp=4", "--sizes", ",".join(map(str, SIZES)),
              "--iters", 3, "--warmup", 1, "--profile", "--out", out, check=True)
    summary = json.loads(meshscope("analyze", out, "--json", "--baseline",
                                   out / "baseline.parquet", check=True).stdout)
    return out, summary


def test_bytes_per_instance_are_exact(sweep):
    out, _ = sweep
    bw = pd.read_parquet(out / "report" / "bandwidth.parquet")
    swept = bw[(bw["dim"] == "dp") & (bw["msg_bytes"] != 4)]  # 4 B: the timing all-reduce
    assert set(swept["rank"]) == {0, 1, 2, 3}
    for op in FACTOR_N4:
        rows = swept[swept["op"] == op]
        assert set(rows["msg_bytes"].astype(int)) == set(SIZES), op
        # Every size appears once per warm-up and timed iteration (1 + 3) on every rank.
        assert (rows.groupby(["rank", "msg_bytes"]).size() == 4).all(), op


def test_busbw_over_algbw_is_the_nccl_tests_factor(sweep):
    out, _ = sweep
    bw = pd.read_parquet(out / "report" / "bandwidth.parquet")
    swept = bw[(bw["dim"] == "dp") & (bw["msg_bytes"] != 4)]
    assert (swept["group_size"] == 4).all()
    for op, factor in FACTOR_N4.items():
        rows = swept[swept["op"] == op]
        if op in ("send", "recv"):
            # gloo's send/recv ranges are waits for asynchronous work: no separable transfer
            # (matching.p2p_table), so busbw is null, never the wait-dominated figure.
            assert not rows.empty and rows["busbw_gbps"].isna().all()
            continue
        ratio = rows["busbw_gbps"] / rows["algbw_gbps"]
        assert ratio.tolist() == pytest.approx([factor] * len(rows)), op
        algbw = rows["msg_bytes"] / rows["transfer_us"] / 1e3
        assert rows["algbw_gbps"].tolist() == pytest.approx(algbw.tolist())


def test_gloo_reduce_scatter_is_flagged_as_all_reduce(sweep):
    out, _ = sweep
    bw = pd.read_parquet(out / "report" / "bandwidth.parquet")
    rs = bw[bw["op"] == "reduce_scatter"]
    assert not rs.empty and (rs["backend_op"] == "all_reduce").all()
    assert bw.loc[bw["op"] != "reduce_scatter", "backend_op"].isna().all()


def test_transfer_is_the_fastest_rank_and_the_rest_is_wait(sweep):
    out, _ = sweep
    table = pd.read_parquet(out / "report" / "bandwidth.parquet")
    p2p = table["op"].isin(["send", "recv"])
    bw = table[~p2p]
    keyed = bw.groupby("match_id")  # one matched collective across its ranks
    assert bw["match_id"].ne("").all() and (keyed["rank"].nunique() == 4).all()
    assert (keyed["transfer_us"].transform("min") == bw["transfer_us"]).all()
    assert ((bw["dur_us"] - bw["transfer_us"] - bw["wait_us"]).abs() < 1e-6).all()
    assert (keyed["wait_us"].min() == 0).all()
    # A send and its recv share one transfer (on gloo always null: matching.p2p_table); the
    # rest of each side's span is waiting.
    pairs = table[p2p].groupby("match_id")
    assert len(pairs) and (pairs["rank"].nunique() == 2).all()
    assert (pairs["transfer_us"].nunique(dropna=False) == 1).all()
    sides = table[p2p & table["transfer_us"].notna()]
    assert ((sides["wait_us"] - (sides["dur_us"] - sides["transfer_us"]).clip(lower=0)).abs()
            < 1e-6).all()
    assert table.loc[p2p & table["transfer_us"].isna(), "busbw_gbps"].isna().all()


def test_baseline_table_and_efficiency(sweep):
    out, summary = sweep
    base = pd.read_parquet(out / "baseline.parquet")
    assert set(base["size_bytes"]) == set(SIZES) and (base["n_ranks"] == 4).all()
    for r in base.itertuples():
        expected = FACTOR_N4["send" if r.op == "send_recv" else r.op]
        assert r.busbw_gbps / r.algbw_gbps == pytest.approx(expected)
    rows = [b for b in summary["bandwidth"] if b["dim"] == "dp" and b["op"] == "all_reduce"
            and b["msg_bytes"] in SIZES]
    assert rows and all(b["efficiency"] is not None and b["efficiency"] > 0 for b in rows)
