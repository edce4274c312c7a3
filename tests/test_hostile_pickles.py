"""Issue 46, cases 2 and 3: a pickle costs time and memory in proportion to its size.

Python's unpickler built a dict of 40,000 int keys that all hash alike (``i*(2**61-1)``) in
quadratic time (7.9 s for 559 kB), and 5,000,000 empty dicts from a 4.8 MB file in 1.1 GB,
before anything looked at them. ``collectors/plain_pickle.py`` now interprets the opcodes
itself and refuses as it goes. The hostile files are built here, byte by byte where Python's
own pickler would itself take quadratic time; each budget is asserted as a relation — where
in the file the refusal came, peak traced memory against the file's size, what the loader
counted against what it built — never as a wall-clock threshold. PyTorch's own forms (Python's
pickler for snapshots, torch's C++ pickler for Flight Recorder dumps) still load to exactly
what ``pickle.loads`` gives.
"""
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import time
import tracemalloc

import pytest

from meshscope.analysis.memory import snapshot
from meshscope.collectors import plain_pickle
from meshscope.collectors.flight_recorder import load_pickle_dump, read_torch_dump
from meshscope.collectors.plain_pickle import UnsafePickleError
from fr_fixtures import moe_dumps
from test_memory_snapshot import hand_made

MB = 1 << 20
COLLIDE = 2 ** 61 - 1           # i*COLLIDE: every such int hashes to 0


def bound(raw: bytes) -> int:
    """The issue's memory bound: 20 times the file's size + 200 MB."""
    return 20 * len(raw) + 200 * MB


def refused_at(err) -> int:
    """The byte a refusal names (``… (byte N))``)."""
    return int(re.findall(r"byte (\d+)", str(err))[-1])


def traced(fn):
    """``fn()``'s result (or the UnsafePickleError it raised) and its peak traced memory."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except UnsafePickleError as e:
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


CHILD = r"""
import json, sys
from meshscope.collectors import plain_pickle

def status(key):
    return next(int(ln.split()[1]) * 1024 for ln in open("/proc/self/status")
                if ln.startswith(key))

raw = open(sys.argv[1], "rb").read()
before = status("VmRSS")
try:
    plain_pickle.loads(raw)
    said = "accepted"
except plain_pickle.UnsafePickleError as e:
    said = str(e)
print(json.dumps({"before": before, "peak": status("VmHWM"), "said": said}))
"""


def load_in_a_fresh_process(tmp_path, raw: bytes) -> dict:
    """``plain_pickle.loads(raw)`` in a fresh process: its outcome (``said``), its resident
    memory before the load (the interpreter and the file's bytes: ``before``) and its peak
    (``VmHWM``: what the allocator really took, not only what Python traced)."""
    path = tmp_path / "hostile.pickle"
    path.write_bytes(raw)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=600, check=True)
    return json.loads(proc.stdout)


def _str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def colliding_dump(keys: int, batch: int | None = None) -> bytes:
    """A Flight Recorder dump whose ``pg_status`` maps ``keys`` colliding ints to 1: the
    bytes ``pickle.dumps`` writes (SETITEMS every ``batch`` pairs), made without building
    the dict (which is itself quadratic)."""
    pairs = [b"\x8a" + bytes([len(e)]) + e + b"K\x01"
             for e in (pickle.encode_long(i * COLLIDE) for i in range(keys))]
    batch = batch or keys
    body = b"".join(b"(" + b"".join(pairs[i:i + batch]) + b"u"
                    for i in range(0, keys, batch))
    return (b"\x80\x04}(" + _str("version") + _str("2.10") + _str("entries") + b"]" +
            _str("pg_status") + b"}" + body + b"u.")


# -- case 2: hostile hashing ---------------------------------------------------------------

def test_colliding_int_keys_are_refused_at_their_first_dict_without_building_it(tmp_path):
    """The issue's 40,000 colliding keys (559 kB): refused at the first SETITEMS — within the
    first thousand pairs of the file, before any of them is in a dict — naming the key; an
    ordinary dict of str keys of the same size loads, as ``pickle.loads`` gives it, in less
    than the file's budget."""
    raw = colliding_dump(40_000, batch=1000)
    assert 500_000 < len(raw) < 700_000
    with pytest.raises(UnsafePickleError, match=r"a dict key of type int \(0\): only str keys"
                       ) as err:
        plain_pickle.loads(raw)
    assert refused_at(err.value) < len(raw) / 30           # the first batch of 1000
    path = tmp_path / "_dump_0"
    path.write_bytes(raw)
    with pytest.raises(UnsafePickleError, match=f"{path}: .*dict key of type int"):
        load_pickle_dump(path)
    # The same keys in one SETITEMS (as torch's own pickler writes a dict): every key is read
    # (a pass over the file), none is hashed.
    one = colliding_dump(40_000)
    err, peak = traced(lambda: plain_pickle.loads(one))
    assert isinstance(err, UnsafePickleError) and "dict key of type int" in str(err)
    ordinary = pickle.dumps({"version": "2.10", "entries": [],
                             "pg_status": {f"g{i:07d}": 1 for i in range(40_000)}})
    assert abs(len(ordinary) - len(one)) < len(one) / 2
    stats = {}
    got, peak_ordinary = traced(lambda: plain_pickle.loads(ordinary, stats=stats))
    assert got == pickle.loads(ordinary)
    assert peak < 2 * peak_ordinary and peak < bound(one)
    assert stats["bytes_held"] < stats["budget"]


@pytest.mark.parametrize("key", [7, 7 * COLLIDE % (1 << 63), 1.5, (1, 2), b"k", None, True])
def test_every_non_str_key_is_refused_and_named(key):
    """PyTorch's dumps and snapshots have str keys only (checked against torch's writers:
    pg_config, pg_status, nccl_comm_state, allocator_settings, roundup_power2_divisions…);
    str hashes are randomised per process, no file can make them collide. Any other key —
    int, float, tuple, bytes, None, bool — is refused before it is hashed."""
    raw = pickle.dumps({"segments": [], "odd": {key: 1}})
    with pytest.raises(UnsafePickleError, match=f"a dict key of type {type(key).__name__}"):
        plain_pickle.loads(raw)


def test_a_colliding_snapshot_is_refused_not_accepted_after_seconds(tmp_path):
    """The issue's snapshot (accepted, exit 0, after 8.4 s): refused, naming the file."""
    raw = (b"\x80\x04}(" + _str("segments") + b"]" + _str("allocator_settings") + b"}(" +
           b"".join(b"\x8a" + bytes([len(e)]) + e + b"K\x01"
                    for e in (pickle.encode_long(i * COLLIDE) for i in range(40_000))) +
           b"uu.")
    path = tmp_path / "rank0.pickle"
    path.write_bytes(raw)
    with pytest.raises(snapshot.SnapshotError, match="dict key of type int") as err:
        snapshot.read(path)
    assert str(path) in str(err.value)


# -- case 3: memory far beyond the file's size ---------------------------------------------

def test_five_million_empty_dicts_are_refused_within_20x_the_file_plus_200_mb(tmp_path):
    """5,000,000 empty dicts, one byte each (4.8 MB; 1.1 GB before): refused for the memory
    they would take before the last is made, the process' peak resident memory (the
    interpreter, the file, what was built before the refusal, the stack) under 20 times the
    file + 200 MB — measured in a fresh process, as the allocator took it (tracing 2 million
    allocations would take a minute)."""
    n = 5_000_000
    raw = b"\x80\x04}(" + _str("version") + _str("2.10") + _str("entries") + b"](" + \
        b"}" * n + b"eu."
    got = load_in_a_fresh_process(tmp_path, raw)
    assert "bytes of memory for a pickle of 5,000,0" in got["said"], got
    assert refused_at(got["said"]) < len(raw)               # before the last dict was made
    assert got["peak"] < bound(raw), (got, bound(raw))
    assert got["peak"] - got["before"] < \
        plain_pickle.BYTES_PER_BYTE * len(raw) + plain_pickle.BYTES_ALLOWANCE
    path = tmp_path / "_dump_0"
    path.write_bytes(raw)
    with pytest.raises(UnsafePickleError, match=f"{path}: .*bytes of memory"):
        load_pickle_dump(path)


@pytest.mark.parametrize("unit", [b"]", b"N\x85", b"K\x01", b"\x8c\x02ab", b"G" + b"\0" * 8,
                                  b"N\x94"], ids=["lists", "tuples", "ints", "strings",
                                                  "floats", "memo"])
def test_many_small_objects_of_any_kind_stay_within_the_bound(tmp_path, unit):
    """Whatever the object — an empty list, a 1-tuple, an int, a 2-character string, a
    float, a memo entry — a pickle of millions of them (8 MB) loads or is refused with the
    process' peak resident memory under 20 times the file + 200 MB."""
    raw = b"\x80\x04](" + unit * (8 * MB // len(unit)) + b"e."
    got = load_in_a_fresh_process(tmp_path, raw)
    assert got["said"] == "accepted" or "bytes of memory" in got["said"], got
    assert got["peak"] < bound(raw), (got, bound(raw))


def test_deep_nesting_is_refused_as_it_deepens():
    """Nesting past MAX_DEPTH, however written: ``]]]…aaa`` (refused at the 201st APPEND),
    a chain of 1-tuples (at the 201st), and what ``pickle.dumps`` writes for 300 lists."""
    n = 100_000
    raw = b"\x80\x04" + b"]" * n + b"a" * (n - 1) + b"."
    with pytest.raises(UnsafePickleError, match="nesting deeper than 200 levels") as err:
        plain_pickle.loads(raw)
    assert refused_at(err.value) == 2 + n + plain_pickle.MAX_DEPTH
    raw = b"\x80\x04N" + b"\x85" * n + b"."
    with pytest.raises(UnsafePickleError, match="nesting deeper than 200 levels") as err:
        plain_pickle.loads(raw)
    assert refused_at(err.value) == 3 + plain_pickle.MAX_DEPTH
    deep = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(UnsafePickleError, match="nesting deeper"):
        plain_pickle.loads(pickle.dumps({"segments": deep}))
    ok = []
    for _ in range(plain_pickle.MAX_DEPTH - 1):
        ok = [ok]
    assert plain_pickle.loads(pickle.dumps({"segments": ok})) == {"segments": ok}


def test_huge_integers_are_refused_as_they_are_read(tmp_path):
    """An integer of 10 MB (``LONG4``) is refused at its opcode, never converted; a text
    integer of 1,000 digits too; one beyond int64 but small (2**64, 2**70) is refused naming
    where it is, as the schemas name a field."""
    n = 10 * MB
    raw = b"\x80\x04}(" + _str("segments") + b"\x8b" + struct.pack("<i", n) + b"\x7f" * n + \
        b"u."
    err, peak = traced(lambda: plain_pickle.loads(raw))
    assert isinstance(err, UnsafePickleError) and "an integer of 10,485,760 bytes" in str(err)
    assert refused_at(err) == 14 and peak < len(raw) / 10
    with pytest.raises(UnsafePickleError, match="an integer of 1,000 digits"):
        plain_pickle.loads(b"L" + b"9" * 1000 + b"L\n.")
    with pytest.raises(UnsafePickleError, match=r"^\$\[1\]\.x: the integer -18446744073709551616"
                       r" is beyond int64$"):
        plain_pickle.loads(pickle.dumps([0, {"x": -2 ** 64}]))
    dump = moe_dumps(hang_step=None)[0]
    dump["entries"][2]["collective_seq_id"] = 2 ** 70
    path = tmp_path / "_dump_0"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    with pytest.raises(UnsafePickleError, match=r"\$\.entries\[2\]\.collective_seq_id: the "
                                                r"integer 1180591620717411303424 is beyond"):
        load_pickle_dump(path)
    assert plain_pickle.loads(pickle.dumps([2 ** 63 - 1, -2 ** 63])) == [2 ** 63 - 1, -2 ** 63]


# -- what the module guaranteed before, kept -------------------------------------------------

class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", range(6))
def test_code_is_refused_by_name_and_never_runs(tmp_path, protocol):
    marker = tmp_path / "pwned"
    raw = pickle.dumps({"segments": [1, 2, _Exploit(marker)]}, protocol=protocol)
    with pytest.raises(UnsafePickleError, match=r"refused to load posix\.system"):
        plain_pickle.loads(raw)
    assert not marker.exists()


@pytest.mark.parametrize("raw,said", [
    (b"\x80\x02cos\nsystem\nq\x00.", "refused to load os.system"),
    (b"\x80\x04N)R.", "REDUCE"), (b"\x80\x04}Nb.", "BUILD"),
    (b"\x80\x04N)\x81.", "NEWOBJ"), (b"\x80\x04N)}\x92.", "NEWOBJ_EX"),
    (b"\x80\x04\x82\x01.", "EXT1"), (b"\x80\x04P1\n.", "PERSID"),
    (b"\x80\x04N\x8f.", "a set"), (b"\x80\x04(N\x91.", "a frozenset"),
    (b"\x80\x05\x96\x00\x00\x00\x00\x00\x00\x00\x00.", "a bytearray"),
    (b"\x80\x05\x97.", "NEXT_BUFFER"), (b"\x80\x04\xff.", "not a pickle opcode: 0xff"),
])
def test_every_opcode_that_is_not_plain_data_is_refused(raw, said):
    with pytest.raises(UnsafePickleError, match=re.escape(said)):
        plain_pickle.loads(raw)


@pytest.mark.parametrize("raw,said", [
    (b"\x80\x04]\x94h\x00a.", "placed in itself"),                         # l.append(l)
    (b"\x80\x04]\x94]h\x00aa.", "changed after it was placed"),            # mutate a child
    (b"\x80\x04]\x94h\x00\x85h\x00\x85.", None),                            # shared: fine
    (b"\x80\x04]2a.", "DUP of a list"),
    (b"\x80\x04N\x94q\x05.", "memo index 5 out of order"),
    (b"\x80\x04N\x94q\x00.", "memo index 0 out of order"),
    (b"\x80\x04h\x03.", "memo index 3 was never stored"),
    (b"\x80\x04]K\x01K\x02\x86", "ends before its STOP"),
    (b"\x80\x04a.", "no container below the items"),
    (b"\x80\x04X\xff\xff\xff\x00ab.", "ends inside an opcode"),
])
def test_what_no_plain_pickler_writes_is_refused(raw, said):
    """Cycles and containers changed after they were placed (which would make the counts
    wrong) cannot be built; the memo is filled in order; a damaged pickle is named."""
    if said is None:
        assert plain_pickle.loads(raw) == ([],)
        return
    with pytest.raises(UnsafePickleError, match=said):
        plain_pickle.loads(raw)


# -- PyTorch's own forms, unchanged ----------------------------------------------------------

def _torch_form(obj) -> bytes:
    """``obj`` as torch's C++ pickler (``torch::jit::pickle``: ``_dump_fr_trace``) writes it:
    protocol 2, each distinct string once (BINUNICODE + BINPUT, BINGET after), containers
    never memoized, a dict or list in one MARK … SETITEMS/APPENDS however long."""
    out, memo = [b"\x80\x02"], {}

    def put(x):
        if isinstance(x, str):
            if x in memo:
                out.append(b"h" + bytes([memo[x]]) if memo[x] < 256 else
                           b"j" + struct.pack("<I", memo[x]))
                return
            b = x.encode()
            out.append(b"X" + struct.pack("<I", len(b)) + b)
            memo[x] = len(memo)
            out.append(b"q" + bytes([memo[x]]) if memo[x] < 256 else
                       b"r" + struct.pack("<I", memo[x]))
        elif x is None or isinstance(x, bool):
            out.append({None: b"N", True: b"\x88", False: b"\x89"}[x])
        elif isinstance(x, int):
            out.append(b"K" + bytes([x]) if 0 <= x < 256 else
                       b"J" + struct.pack("<i", x) if -2 ** 31 <= x < 2 ** 31 else
                       b"\x8a" + bytes([len(pickle.encode_long(x))]) + pickle.encode_long(x))
        elif isinstance(x, float):
            out.append(b"G" + struct.pack(">d", x))
        elif isinstance(x, tuple):
            out.append(b"(")
            for v in x:
                put(v)
            out.append(b"t")
        elif isinstance(x, list):
            out.append(b"](")
            for v in x:
                put(v)
            out.append(b"e")
        else:
            out.append(b"}(")
            for k, v in x.items():
                put(k)
                put(v)
            out.append(b"u")
    put(obj)
    return b"".join(out) + b"."


def _fr_with_frames(entries: int) -> dict:
    dump = moe_dumps(steps=entries // 3 + 1, hang_step=None)[0]
    for i, e in enumerate(dump["entries"]):
        e["frames"] = [{"name": f"fn{j}", "filename": f"/src/train{j % 4}.py",
                        "line": 100 + i + j} for j in range(8)]
        e["time_discovered_started_ns"] = e["time_created_ns"] + 10
        e["duration_ms"] = 1.25
    dump["pg_status"] = {"0": {"last_enqueued_collective": 4, "last_started_collective": -1}}
    return dump


@pytest.mark.parametrize("protocol", ["torch", 2, 4, 5])
def test_real_shaped_dumps_and_snapshots_load_as_pickle_loads_gives_them(tmp_path, protocol):
    dump, snap = _fr_with_frames(300), hand_made()
    for doc in (dump, snap):
        raw = _torch_form(doc) if protocol == "torch" else pickle.dumps(doc, protocol=protocol)
        got = plain_pickle.loads(raw)
        assert got == pickle.loads(raw) and type(got["segments" if "segments" in doc else
                                                    "entries"]) is list
    path = tmp_path / "_dump_0"
    path.write_bytes(_torch_form(dump) if protocol == "torch" else
                     pickle.dumps(dump, protocol=protocol))
    typed = read_torch_dump(path, 0, "pickle")
    assert len(typed.flight_recorder.entries) == len(dump["entries"])
    path = tmp_path / "rank0.pickle"
    path.write_bytes(_torch_form(snap) if protocol == "torch" else
                     pickle.dumps(snap, protocol=protocol))
    assert len(snapshot.read(path).segments) == 2


def _snapshot_like(segments: int) -> dict:
    frames = [[{"filename": f"/src/layer{(i + j) % 40}.py", "line": i * 7 + j,
                "name": f"forward_{j}"} for j in range(10)] for i in range(segments * 8)]
    return {"segments": [{"device": 0, "address": s << 24, "total_size": 8 << 20, "stream": 0,
                          "segment_type": "large", "blocks": [
                              {"address": (s << 24) + (b << 20), "size": 1 << 20,
                               "requested_size": 1 << 20, "state": "active_allocated",
                               "frames": frames[s * 8 + b]} for b in range(8)]}
                         for s in range(segments)],
            "device_traces": [[{"action": "alloc", "addr": i << 20, "size": 1 << 20,
                                "stream": 0, "time_us": 10 ** 15 + i, "frames": frames[i]}
                               for i in range(segments * 8)]]}


def test_an_ordinary_large_snapshot_loads_in_linear_time_and_memory():
    """A snapshot-like pickle of ~2 MB and of four times that: the same document as
    ``pickle.loads``; what the loader counts grows with the file (within 10% of linear) and
    stays under its budget with room; its CPU time grows linearly too (under 6× for 4× the
    bytes, quadratic would be 16×) and stays within 60× ``pickle.loads``' (measured: ~10–20×,
    a pure-Python interpreter against C)."""
    small, large = (pickle.dumps(_snapshot_like(n)) for n in (60, 240))
    assert 3.5 < len(large) / len(small) < 4.5
    counted, cpu = [], []
    for raw in (small, large):
        stats = {}
        best = float("inf")
        for _ in range(2):
            t = time.process_time()
            got = plain_pickle.loads(raw, stats=stats)
            best = min(best, time.process_time() - t)
        assert got == pickle.loads(raw)
        assert stats["bytes_held"] < 0.9 * plain_pickle.BYTES_PER_BYTE * len(raw) + MB
        counted.append(stats["bytes_held"] / len(raw))
        cpu.append(best)
    assert abs(counted[1] / counted[0] - 1) < 0.1, counted
    assert cpu[1] / cpu[0] < 6 * len(large) / len(small) / 4, cpu
    reference = float("inf")
    for _ in range(3):
        t = time.process_time()
        pickle.loads(large)
        reference = min(reference, time.process_time() - t)
    assert cpu[1] < 60 * max(reference, 1e-3), (cpu[1], reference)


@pytest.mark.slow
def test_a_real_pytorch_dump_loads_as_pickle_loads_gives_it(tmp_path):
    """torch's own C++ pickler (gloo, one rank): the same value as ``pickle.loads``."""
    pytest.importorskip("torch")
    script = tmp_path / "dump.py"
    script.write_text(
        "import sys, torch, torch.distributed as dist\n"
        "import torch._C._distributed_c10d as c10d\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(8)\n"
        "for _ in range(3):\n    dist.all_reduce(t)\n"
        "open(sys.argv[1], 'wb').write(c10d._dump_fr_trace())\n"
        "dist.destroy_process_group()\n")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "TORCH_FR_BUFFER_SIZE": "100",
           "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(script), str(tmp_path / "fr.pkl")], env=env,
                   check=True, capture_output=True, timeout=120)
    raw = (tmp_path / "fr.pkl").read_bytes()
    got = plain_pickle.loads(raw)
    assert got == pickle.loads(raw) and len(got["entries"]) == 3
