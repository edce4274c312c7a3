"""collectors.nccl_debug on a real NCCL_DEBUG=INFO log: 2 nodes × 8 A100 on AWS p4d (EFA)."""
import pytest

from meshscope.collectors.nccl_debug import (CONN_COLUMNS, RANK_COLUMNS, nccl_debug_env, parse_log,
                                   parse_run)
from conftest import shared_trace

LOG = "logs/nccl_debug_logs/aws_p4d_a100x16_2node/slurm-104.out"
HOSTS = ("compute-gpu-st-distributed-ml-1", "compute-gpu-st-distributed-ml-2")


@pytest.fixture(scope="module")
def topo():
    return parse_log(shared_trace(LOG))


def test_version_and_every_rank(topo):
    assert topo.version == "2.18.3+cuda12.2"
    r = topo.ranks
    assert list(r.columns) == RANK_COLUMNS
    assert r["rank"].tolist() == list(range(16)), "every rank appears, once"
    assert set(r["nranks"]) == {16} and r["comm_id"].nunique() == 1
    assert set(r["version"]) == {"2.18.3+cuda12.2"}
    # Ranks 0-7 on the first host, 8-15 on the second, GPU index = rank mod 8.
    assert r["host"].tolist() == [HOSTS[0]] * 8 + [HOSTS[1]] * 8
    assert r["cuda_dev"].tolist() == [i % 8 for i in range(16)]
    assert r.loc[0, "bus_id"] == "101c0"
    assert set(r["network"]) == {"AWS Libfabric"}
    assert set(r["coll_channels"]) == {8} and set(r["p2p_channels"]) == {8}
    # The log ends after the benchmark, when nccl-tests destroys the communicator.
    assert set(r["init"]) == {"DESTROYED"}


def test_rings_and_trees(topo):
    rings = topo.rings
    assert rings["channel"].tolist() == list(range(8)) and set(rings["nchannels"]) == {8}
    assert rings.loc[0, "order"] == [0, 7, 6, 5, 4, 3, 2, 1, 8, 15, 14, 13, 12, 11, 10, 9]
    assert all(sorted(o) == list(range(16)) for o in rings["order"]), "a ring visits every rank"
    r = topo.ranks.set_index("rank")
    assert r.loc[0, "ring_next"][0] == 7 and r.loc[9, "ring_next"][0] == 0
    # "Trees [0] 1/8/-1->0->-1 …": rank 0 is channel 0's root with children 1 and 8.
    assert r.loc[0, "tree_parent"][0] == -1 and r.loc[0, "tree_children"][0] == [1, 8]
    assert r.loc[8, "tree_parent"][0] == 0
    assert len(topo.trees) == 16 * 8
    assert all(len(p) == 8 for p in r["tree_parent"])


def test_transports_net_between_hosts_p2p_within(topo):
    c = topo.connections
    assert list(c.columns) == CONN_COLUMNS
    assert set(c["transport"]) == {"NET", "P2P"}
    assert c["inter_node"].notna().all()
    # Between the two hosts: the network (EFA through the AWS Libfabric plugin, GPUDirect RDMA).
    net = c[c["transport"] == "NET"]
    assert net["inter_node"].all() and not net.empty
    assert net["detail"].str.startswith("AWS Libfabric/").all()
    assert net["detail"].str.contains("GDRDMA").all()
    assert set(net["direction"]) == {"send", "receive"}
    # Within a host: GPU peer-to-peer (NVLink) through CUDA IPC.
    p2p = c[c["transport"] == "P2P"]
    assert not p2p["inter_node"].any() and set(p2p["detail"]) == {"IPC/read"}
    assert (topo.ranks["transports"].map(tuple) == ("NET", "P2P")).all()
    # The ring of channel 0 leaves host 1 at rank 1 (-> 8) and host 2 at rank 9 (-> 0).
    r = topo.ranks.set_index("rank")
    assert 8 in r.loc[1, "net_peers"] and 0 in r.loc[9, "net_peers"]


def test_parse_run_reads_every_rank_file(tmp_path, topo):
    """A run directory with one log per process (as NCCL_DEBUG_FILE=…%h-%p writes them)."""
    lines = shared_trace(LOG).read_text().splitlines()
    comms = tmp_path / "comms"
    comms.mkdir()
    for rank in range(16):
        mine = [ln for ln in lines if ln.startswith(f"{rank:2d}: ")]
        (comms / f"nccl-rank{rank}.log").write_text("\n".join(mine) + "\n")
    got = parse_run(tmp_path)
    assert got.version == topo.version
    assert got.ranks["rank"].tolist() == list(range(16))
    assert len(got.connections) == len(topo.connections)


def test_empty_and_foreign_input(tmp_path):
    empty = parse_run(tmp_path)
    assert empty.version is None and empty.ranks.empty and empty.connections.empty
    assert list(empty.ranks.columns) == RANK_COLUMNS
    text = ("host-a:1:2 [0] NCCL INFO comm 0xabc rank 0 nRanks 2 nNodes 1 localRanks 2 "
            "localRank 0 MNNVL 0\n"
            "host-a:1:2 [0] NCCL INFO Channel 00/02 :    0   1\n"
            "host-a:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n"
            "garbage line\n")
    t = parse_log(text)
    assert t.ranks["rank"].tolist() == [0] and t.ranks.loc[0, "nranks"] == 2
    assert t.connections.loc[0, "transport"] == "SHM"
    assert t.connections.loc[0, "inter_node"] is None  # rank 1's host is not in the log


def test_nccl_debug_env(tmp_path):
    env = nccl_debug_env(tmp_path)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,GRAPH,ENV"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path.resolve() / "comms" / "nccl-%h-%p.log")
    assert (tmp_path / "comms").is_dir()
    assert nccl_debug_env(tmp_path, rank=3)["NCCL_DEBUG_FILE"].endswith("comms/nccl-rank3.log")
