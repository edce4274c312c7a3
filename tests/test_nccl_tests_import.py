"""The nccl-tests importer against real logs: every row's busbw follows from its algbw with
``analysis.bandwidth``'s factor and the log's rank count, to the log's printed precision."""
import pytest

from meshscope.analysis.comm import bandwidth
from meshscope.analysis.comm import nccl_tests
from conftest import shared_trace

SUPERBENCH = "logs/nccl_tests_logs/superbench_a100x8"
SLURM = "logs/nccl_debug_logs/aws_p4d_a100x16_2node/slurm-104.out"
LOGS = {  # file -> op that nccl-tests measured
    "nccl_allgather.log": "all_gather", "nccl_allreduce.log": "all_reduce",
    "nccl_alltoall.log": "all_to_all", "nccl_broadcast.log": "broadcast",
    "nccl_reduce.log": "reduce", "nccl_reducescatter.log": "reduce_scatter",
}
HALF = 0.005  # the logs print algbw and busbw with two decimals


def _time_half_ulp(t_us: float) -> float:
    """nccl-tests prints times with 2 decimals below 100 µs, 1 below 10 ms, else none."""
    return 0.5 if t_us >= 10000 else 0.05 if t_us >= 100 else 0.005


def _check_rows(df, n):
    for row in df.itertuples():
        f = bandwidth.bus_factor(row.op, n)
        # busbw = algbw × f, with both printed values rounded to HALF.
        assert abs(row.algbw_gbps * f - row.busbw_gbps) <= HALF * f + HALF + 1e-9, row
        # algbw = S / t, with t and algbw rounded as printed.
        exact = bandwidth.algbw_gbps(row.size_bytes, row.time_us)
        slack = exact * _time_half_ulp(row.time_us) / row.time_us
        assert abs(exact - row.algbw_gbps) <= HALF + slack + 1e-9, row


def _data_lines(path):
    """Result lines of a log without launcher prefixes: they start with the size."""
    return [ln for ln in path.read_text().splitlines()
            if ln.split()[:1] and ln.split()[0].isdigit() and len(ln.split()) > 10]


@pytest.mark.parametrize("name", sorted(LOGS))
def test_superbench_logs_reproduce_busbw(name):
    path = shared_trace(f"{SUPERBENCH}/{name}")
    df = nccl_tests.read(path)
    assert (df["op"] == LOGS[name]).all()              # the op comes from the file name
    assert (df["n_ranks"] == 8).all()                  # eight "# Rank N" lines
    assert len(df) == 2 * len(_data_lines(path))       # out-of-place and in-place per line
    assert df["in_place"].sum() == len(df) // 2
    assert df["size_bytes"].max() == 8 * 2**30
    _check_rows(df, 8)


def test_wrong_group_size_is_caught():
    """The check above is not vacuous: the world size of another job breaks it."""
    df = nccl_tests.read(shared_trace(f"{SUPERBENCH}/nccl_allreduce.log"))
    with pytest.raises(AssertionError):
        _check_rows(df, 16)


def test_two_node_alltoall_table_in_a_slurm_log():
    path = shared_trace(SLURM)
    with pytest.raises(nccl_tests.NcclTestsError, match="op="):
        nccl_tests.read(path)                          # the log never names the test
    df = nccl_tests.read(path, op="alltoall")
    assert (df["op"] == "all_to_all").all()
    assert (df["n_ranks"] == 16).all()                 # 16 "# Rank N Group 0" lines
    assert len(df) == 2 * 29
    assert set(df["redop"]) == {"none"} and set(df["root"].dropna()) == {0}
    assert (df["n_wrong"] == 0).all()
    # S = count × 4 bytes × 16 ranks: all_to_all counts elements per peer.
    assert (df["size_bytes"] == df["count"] * 4 * 16).all()
    _check_rows(df, 16)


def test_parse_variants():
    text = "\n".join([
        " 0: # nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor)",
        " 0: #  Rank  0 Group  0 Pid  1 on a device  0 [0x10] GPU",
        " 1: #  Rank  1 Group  0 Pid  2 on b device  0 [0x10] GPU",
        " 0: #       size         count      type   redop    root     time   algbw   busbw "
        "#wrong     time   algbw   busbw #wrong",
        " 0: #        (B)    (elements)                               (us)  (GB/s)  (GB/s)",
        " 1: host:1:1 [0] NCCL INFO comm 0x1 rank 1 nranks 2 cudaDev 0 - Init COMPLETE",
        " 0:          128            32     float     sum      -1    10.00    0.01    0.01 "
        "     0    10.00    0.01    0.01    N/A",
    ])
    df = nccl_tests.parse(text, source="run/all_reduce_perf.txt")
    assert list(df["op"]) == ["all_reduce"] * 2
    assert list(df["n_ranks"]) == [2, 2]
    assert df["root"].isna().all()                     # -1: no root
    assert df["n_wrong"].iloc[0] == 0 and df["n_wrong"].isna().iloc[1]
    assert nccl_tests.parse(text, op="broadcast", n_ranks=4)["n_ranks"].iloc[0] == 4
    with pytest.raises(nccl_tests.NcclTestsError, match="no nccl-tests result table"):
        nccl_tests.parse("# nothing here\n", op="all_reduce")
