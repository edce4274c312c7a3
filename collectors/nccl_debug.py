"""What NCCL decided when it set up its communicators, read from ``NCCL_DEBUG=INFO`` logs.

With ``NCCL_DEBUG=INFO`` (subsystems ``INIT,GRAPH,ENV``) every rank logs, while it creates a
communicator, the rings and trees it builds over the ranks, and for each peer connection of
each channel the transport it chose: ``P2P`` (NVLink or PCIe between GPUs of one host, e.g.
``P2P/IPC/read``), ``SHM`` (through host memory), ``NET`` (to another host: ``NET/IB``,
``NET/Socket``, ``NET/AWS Libfabric`` for EFA…), ``COLLNET``, ``NVLS``. A collective's
bandwidth depends on exactly these choices: a ring that crosses hosts more often than it must, a
transport that fell back to sockets, fewer channels than expected.

Lines look like ``host:pid:tid [cudaDev] NCCL INFO <message>``; any prefix before them (srun's
``R:`` label, a timestamp) is ignored, and lines of several ranks may be interleaved in one
file. A line belongs to the communicator whose ``comm 0x… rank R nranks N … Init START`` came
last from the same thread, else from the same process.

``parse_log`` / ``parse_run`` return an ``NcclTopology`` of DataFrames (one row per …):

``ranks`` — the topology table, per (communicator, rank):
    version        NCCL version (``NCCL version 2.18.3+cuda12.2``), None if not logged
    comm_id        the communicator's ``commId`` (same on all its ranks), else its pointer
    rank, nranks   rank in the communicator and its size
    host, pid      where the rank ran (from the log line prefix)
    cuda_dev, bus_id  the GPU (CUDA device index, PCI bus id)
    network        the network plugin NCCL used (``IB``, ``Socket``, ``AWS Libfabric``), if logged
    coll_channels, p2p_channels  channel counts (``8 coll channels, … 8 p2p channels``)
    ring_next      per ring channel, the rank this rank sends to (from the ``rings`` table)
    tree_parent    per tree channel, the parent rank (-1: the root)
    tree_children  per tree channel, the list of child ranks
    transports     sorted transports of the connections this rank logged (``["NET", "P2P"]``)
    net_peers      sorted ranks this rank connects to over NET
    init           ``START``, ``COMPLETE`` (initialised) or ``DESTROYED``
``rings`` — per (communicator, channel): ``comm_id, channel, nchannels, order`` (the ring's
    rank order; NCCL prints it on rank 0 only).
``trees`` — per (communicator, rank, channel): ``comm_id, rank, channel, parent, children``.
``connections`` — per logged connection: ``comm_id, channel, conn_index, src, dst, src_dev,
    dst_dev, direction`` (``send``/``receive`` for NET, None otherwise), ``transport``,
    ``detail`` (the rest: ``IPC/read``, ``AWS Libfabric/0/GDRDMA``), ``reported_by`` (the rank
    whose line it is), ``src_host, dst_host``, ``inter_node`` (hosts differ; None if unknown).

Capturing a run (CUDA only): ``nccl_debug_env(run_dir)`` gives the environment that makes every
rank write its log under ``comms/``. NCCL's ``NCCL_DEBUG_FILE`` knows two placeholders, ``%h``
(host name) and ``%p`` (process id) — there is none for the rank, so files are named
``nccl-<host>-<pid>.log`` unless the rank is passed (``nccl_debug_env(run_dir, rank=R)`` →
``nccl-rank{R}.log``, for a worker that sets its own environment before
``init_process_group``). The parser takes ranks from the log lines, never from file names.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

import pandas as pd

from .run_dir import COMMS

PREFIX_RE = re.compile(
    r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO (?P<msg>.*?)\s*$")
VERSION_RE = re.compile(r"NCCL version (?P<version>\S+)")
COMM_RE = re.compile(r"\bcomm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)",
                     re.IGNORECASE)
RING_RE = re.compile(
    r"^(?:Channel (?P<ch>\d+)/(?P<n>\d+)|Ring (?P<ring>\d+)) :(?P<order>(\s+\d+)+)$")
TREES_RE = re.compile(r"^Trees(?P<rest>( \[\d+\] \S+)+)$")
TREE_RE = re.compile(r"\[(?P<ch>\d+)\] (?P<down>-?\d+(?:/-?\d+)*)->(?P<me>\d+)->(?P<up>-?\d+)")
CONN_RE = re.compile(
    r"^Channel (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)\[(?P<sdev>\w+)\] -> "
    r"(?P<dst>\d+)\[(?P<ddev>\w+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+)$")
CHANNELS_RE = re.compile(r"^(?P<coll>\d+) coll channels, (?:\d+ \w+ channels, )*?"
                         r"(?P<p2p>\d+) p2p channels")
NETWORK_RE = re.compile(r"^Using network (?P<net>.+)$")

RANK_COLUMNS = ["version", "comm_id", "rank", "nranks", "host", "pid", "cuda_dev", "bus_id",
                "network", "coll_channels", "p2p_channels", "ring_next", "tree_parent",
                "tree_children", "transports", "net_peers", "init"]
RING_COLUMNS = ["comm_id", "channel", "nchannels", "order"]
TREE_COLUMNS = ["comm_id", "rank", "channel", "parent", "children"]
CONN_COLUMNS = ["comm_id", "channel", "conn_index", "src", "dst", "src_dev", "dst_dev",
                "direction", "transport", "detail", "reported_by", "src_host", "dst_host",
                "inter_node"]


@dataclasses.dataclass
class NcclTopology:
    version: str | None
    ranks: pd.DataFrame
    rings: pd.DataFrame
    trees: pd.DataFrame
    connections: pd.DataFrame


def nccl_debug_env(run_dir, rank: int | None = None) -> dict[str, str]:
    """Environment for NCCL's INIT/GRAPH/ENV log of every rank into ``run_dir/comms/``
    (created here, since NCCL does not create directories)."""
    comms = pathlib.Path(run_dir).resolve() / COMMS
    comms.mkdir(parents=True, exist_ok=True)
    name = f"nccl-rank{rank}.log" if rank is not None else "nccl-%h-%p.log"
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,ENV",
            "NCCL_DEBUG_FILE": str(comms / name)}


def _int(text):
    return None if text is None else int(text)


def parse_lines(lines) -> NcclTopology:
    version = None
    comms: dict[tuple, dict] = {}            # (host, pid, ptr) -> the rank's row
    current: dict[tuple, tuple] = {}         # (host, pid, tid) and (host, pid) -> comm key
    network: dict[tuple, str] = {}           # (host, pid) -> network plugin
    rings, trees, conns = [], [], []
    for line in lines:
        m = PREFIX_RE.search(line)
        if m is None:
            v = VERSION_RE.search(line)
            version = version or (v and v["version"])
            continue
        msg, proc = m["msg"], (m["host"], int(m["pid"]))
        thread = (*proc, int(m["tid"]))
        if (v := VERSION_RE.match(msg)) is not None:
            version = version or v["version"]
            continue
        if (c := COMM_RE.search(msg)) is not None:
            key = (*proc, c["ptr"])
            row = comms.setdefault(key, {"comm_id": c["ptr"], "rank": int(c["rank"]),
                                         "nranks": int(c["nranks"]), "host": proc[0],
                                         "pid": proc[1], "cuda_dev": int(m["dev"]),
                                         "bus_id": None, "init": "START"})
            for field, pattern in (("comm_id", r"commId (0x[0-9a-fA-F]+)"),
                                   ("bus_id", r"busId (\w+)")):
                if (f := re.search(pattern, msg)) is not None:
                    row[field] = f[1]
            if "Init COMPLETE" in msg:
                row["init"] = "COMPLETE"
            elif "Destroy COMPLETE" in msg:
                row["init"] = "DESTROYED"
            current[thread] = current[proc] = key
            continue
        if (n := NETWORK_RE.match(msg)) is not None:
            network[proc] = n["net"]
            continue
        key = current.get(thread) or current.get(proc)
        row = comms.get(key)
        if row is None:
            continue
        if (r := RING_RE.match(msg)) is not None:
            rings.append({"key": key, "channel": int(r["ch"] or r["ring"]),
                          "nchannels": _int(r["n"]), "order": [int(x) for x in r["order"].split()]})
        elif (t := TREES_RE.match(msg)) is not None:
            for tm in TREE_RE.finditer(t["rest"]):
                trees.append({"key": key, "rank": int(tm["me"]), "channel": int(tm["ch"]),
                              "parent": int(tm["up"]),
                              "children": [int(d) for d in tm["down"].split("/") if d != "-1"]})
        elif (cm := CONN_RE.match(msg)) is not None:
            transport, _, detail = cm["via"].partition("/")
            conns.append({"key": key, "channel": int(cm["ch"]), "conn_index": _int(cm["conn"]),
                          "src": int(cm["src"]), "dst": int(cm["dst"]), "src_dev": cm["sdev"],
                          "dst_dev": cm["ddev"], "direction": cm["dir"], "transport": transport,
                          "detail": detail, "reported_by": row["rank"]})
        elif (ch := CHANNELS_RE.match(msg)) is not None:
            row["coll_channels"], row["p2p_channels"] = int(ch["coll"]), int(ch["p2p"])
    return _tables(version, comms, network, rings, trees, conns)


def _tables(version, comms, network, rings, trees, conns) -> NcclTopology:
    for key, row in comms.items():
        row.update(version=version, network=network.get(key[:2]))
    cid = {key: row["comm_id"] for key, row in comms.items()}
    host = {(row["comm_id"], row["rank"]): row["host"] for row in comms.values()}
    for table in (rings, trees, conns):
        for item in table:
            item["comm_id"] = cid[item.pop("key")]
    for c in conns:
        c["src_host"] = host.get((c["comm_id"], c["src"]))
        c["dst_host"] = host.get((c["comm_id"], c["dst"]))
        c["inter_node"] = (None if c["src_host"] is None or c["dst_host"] is None
                           else c["src_host"] != c["dst_host"])
    rings_df = pd.DataFrame(rings, columns=RING_COLUMNS).drop_duplicates(
        subset=["comm_id", "channel"]).sort_values(["comm_id", "channel"], ignore_index=True)
    trees_df = pd.DataFrame(trees, columns=TREE_COLUMNS)
    conns_df = pd.DataFrame(conns, columns=CONN_COLUMNS)
    rows = []
    for row in comms.values():
        me, comm = row["rank"], row["comm_id"]
        ring_next = [order[(order.index(me) + 1) % len(order)]
                     for order in rings_df.loc[rings_df["comm_id"] == comm, "order"] if me in order]
        mine = trees_df[(trees_df["comm_id"] == comm) & (trees_df["rank"] == me)].sort_values(
            "channel")
        logged = conns_df[(conns_df["comm_id"] == comm) & (conns_df["reported_by"] == me)]
        net = logged[logged["transport"] == "NET"]
        peers = set(net["src"]) | set(net["dst"])
        rows.append({**dict.fromkeys(RANK_COLUMNS), **row, "ring_next": ring_next,
                     "tree_parent": mine["parent"].tolist(),
                     "tree_children": mine["children"].tolist(),
                     "transports": sorted(set(logged["transport"])),
                     "net_peers": sorted(int(p) for p in peers - {me})})
    ranks = pd.DataFrame(rows, columns=RANK_COLUMNS)
    if not ranks.empty:
        ranks = ranks.sort_values(["comm_id", "rank"], ignore_index=True)
    return NcclTopology(version, ranks, rings_df, trees_df, conns_df)


def parse_log(source) -> NcclTopology:
    """Parse one NCCL log: a path, or the text itself when it contains a newline."""
    if isinstance(source, str) and "\n" in source:
        return parse_lines(source.splitlines())
    with open(source, errors="replace") as f:
        return parse_lines(f)


def parse_run(run_dir) -> NcclTopology:
    """All ``comms/nccl-*.log`` of a run directory, parsed together (empty tables if none)."""
    lines = []
    for path in sorted((pathlib.Path(run_dir) / COMMS).glob("nccl-*.log")):
        lines += path.read_text(errors="replace").splitlines()
    return parse_lines(lines)
