"""The forms a Flight Recorder dump comes in, each mapped onto the one record meshscope reads
(``flight_recorder.TorchDump`` / ``Dump``) — bounded, plain data only, nothing executed.

1. **PyTorch's pickle and JSON dumps of every format version** (the dump's ``version`` field:
   the format's, not torch's). ``normalise(data, path)`` maps an older version's fields onto
   today's before the record is checked (``flight_recorder.read_torch_dump``):

   - ``1.x`` (``NCCLTraceBuffer::dump`` in ``NCCLUtils.hpp``, torch 2.2-2.3): one ``seq_id``
     per entry and no ``process_group`` — ``seq_id`` is read as ``collective_seq_id``
     (``p2p_seq_id`` 0, ``is_p2p`` false: every operation of a group shared that one
     counter), ``pg_id`` as the group's name (``process_group`` = (``"<pg_id>"``, ``""``));
     no ``input_dtypes`` / ``output_dtypes``. Versions ``1.4``-``1.x`` key ``pg_config`` by
     the group's integer id, each a list of its ranks: the plain-data reader takes such a
     key as its text (``plain_pickle.loads(int_keys=True)``: converted before it is hashed,
     so no file can make the keys collide), and each becomes ``{name, desc "", ranks}``.
   - ``2.0``-``2.1`` (``collective_seq_id`` / ``p2p_seq_id`` / ``process_group``; ``pg_config``
     by group name, ``{"name", "desc", "ranks"}``): no ``is_p2p`` — an entry is point-to-point
     when its ``p2p_seq_id`` is set and its ``profiling_name`` is a send or a receive.
   - ``2.2`` onwards (``is_p2p``, ``timeout_ms``, dtypes; ``2.3`` ``pg_status``; ``2.4``
     thread id and name; ``2.7`` ``nccl_version``; ``2.10`` ``comm_lib_version``): read as
     they are.

   A dump without a ``version``, with one that is not ``<major>.<minor>``, of a major version
   after 2, or missing a field meshscope needs (an entry's sequence number, group or op) is
   refused with ``RunDirError`` naming the file, the field (a JSON path), the problem and the
   version.

2. **TorchComms' FlightRecorderHook** (github.com/meta-pytorch/torchcomms,
   ``comms/torchcomms/hooks/FlightRecorder.cpp``): the same keys and version as PyTorch's
   (it includes torch's ``FlightRecorder.hpp`` constants), written per rank as a pickle
   (``dump_file``: ``$TORCHCOMM_FR_DUMP_TEMP_FILE<rank>``, by default
   ``~/.cache/torch/comm_lib_trace_rank_<rank>``) or handed over as JSON (``dump_json``, which
   users save under a name of their own, often without ``.json``). Its ``pg_config`` ranks are
   ``"0,1,2"`` (no brackets), ``p2p_seq_id`` 0 and ``is_p2p`` false, the group's description
   is the backend's name. ``sniff(path)`` tells the two encodings apart by their first byte,
   whatever the name; ``is_torchcomms(fr)`` tells the writer from the ranks' text.

3. **The debug server's dump folder** (``torch.distributed.debug.start_debug_server(
   dump_dir=…)``, torch 2.10+, ``_frontend.PeriodicDumper``): every ``dump_interval`` seconds
   one plain-text file per handler, ``<handler>_<YYYYmmdd_HHMMSS>.txt`` — ``fr_trace_…``
   (tabulate's plain tables of torch's analyser: Groups, Memberships, Collectives, NCCL Calls),
   ``stacks_…`` (each rank's Python stacks, ``=== Rank R: addr ===`` sections),
   ``wait_counters_…``. ``debug_folder(path)`` finds the newest ``fr_trace`` file (and the
   ``stacks`` file of the same time or the newest before it); ``read_debug_fr_trace`` rebuilds
   each rank's entries from the Collectives table: a rank in a collective's expected ranks
   and not among its missing ranks issued it (its state is the collective's; its group's
   ranks are the expected ones — Groups and Memberships name groups by the analyser's hash);
   a rank in Memberships that issued nothing has an empty buffer; ranks the server names as not
   responding (``PARTIAL DATA: …``) left no dump. ``read_debug_stacks`` keeps each rank's
   innermost frames.
"""
from __future__ import annotations

import ast
import pathlib
import re

from .run_dir import RunDirError

# Fields an entry must hold, in today's names, once mapped.
NEEDED = ("process_group", "profiling_name", "collective_seq_id")
NEWEST_MAJOR = 2
_P2P_NAMES = ("send", "recv")


def version_of(data: dict) -> tuple[int, int] | None:
    v = data.get("version")
    if not isinstance(v, str):
        return None
    m = re.fullmatch(r"(\d{1,4})\.(\d{1,4})", v.strip())
    return (int(m[1]), int(m[2])) if m else None


def normalise(data: dict, path) -> dict:
    """``data`` (a PyTorch dump as plain data) with an older version's fields mapped onto
    today's (module docstring, 1.); ``RunDirError`` naming the file, the field and the version
    when it cannot be."""
    raw_version = data.get("version")
    shown = raw_version if isinstance(raw_version, str) else repr(raw_version)[:40]
    if "version" not in data:
        raise RunDirError(f"{path}: $.version: missing (a Flight Recorder dump names its "
                          f"format version; this one cannot be mapped)")
    version = version_of(data)
    if version is None:
        raise RunDirError(f"{path}: $.version: {shown!s} is not a Flight Recorder format "
                          f"version (<major>.<minor>)")
    if version[0] > NEWEST_MAJOR:
        raise RunDirError(f"{path}: $.version: format version {shown} is newer than this "
                          f"meshscope reads (1.x and 2.x)")
    entries = data.get("entries")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        return data                     # the record's check names it
    old = version[0] < 2
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            continue                    # the record's check names it
        if old:
            if "collective_seq_id" not in e and "seq_id" in e:
                e["collective_seq_id"] = e.pop("seq_id")
                e.setdefault("p2p_seq_id", 0)
                e.setdefault("is_p2p", False)
            if "process_group" not in e and isinstance(e.get("pg_id"), int):
                e["process_group"] = (str(e["pg_id"]), "")
        if "is_p2p" not in e:
            name = e.get("profiling_name")
            e["is_p2p"] = bool(e.get("p2p_seq_id")) and isinstance(name, str) and \
                name.rsplit(":", 1)[-1] in _P2P_NAMES
        e.setdefault("p2p_seq_id", 0)
        for field in NEEDED:
            if field not in e:
                raise RunDirError(f"{path}: $.entries[{i}].{field}: missing in a Flight "
                                  f"Recorder dump of format version {shown}; meshscope needs "
                                  f"it (an entry's group, op and sequence number)")
    if old and isinstance(data.get("pg_config"), list):
        data["pg_config"] = {}
    elif old and isinstance(data.get("pg_config"), dict):
        # 1.4-1.x: group id (its text, ``plain_pickle``'s ``int_keys``) -> its ranks
        data["pg_config"] = {k: {"name": k, "desc": "", "ranks": v} if isinstance(v, list)
                             else v for k, v in data["pg_config"].items()}
    return data


def sniff(path: pathlib.Path) -> str | None:
    """``pickle`` or ``json`` as a file's first byte says (``\\x80``: a pickle of protocol 2+;
    ``{``: a JSON object), None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return None
    if head[:1] == b"\x80":
        return "pickle"
    if head[:1] == b"{":
        return "json"
    return None


def is_torchcomms(pg_config) -> bool:
    """A dump written by TorchComms' FlightRecorderHook: its ``pg_config`` ranks are written
    ``"0,1"`` (PyTorch's ``"[0, 1]"``)."""
    if not isinstance(pg_config, dict) or not pg_config:
        return False
    for cfg in pg_config.values():
        ranks = getattr(cfg, "ranks", None) if not isinstance(cfg, dict) else cfg.get("ranks")
        if not isinstance(ranks, str) or ranks.lstrip().startswith("["):
            return False
    return True


# -- the debug server's dump folder ----------------------------------------------------------

DEBUG_FILE = re.compile(r"^(?P<kind>fr_trace|torchcomms_fr_trace|stacks|wait_counters)_"
                        r"(?P<stamp>\d{8}_\d{6})\.txt$")
MAX_DEBUG_BYTES = 256 << 20
MAX_TABLE_ROWS = 2_000_000
_CELL = 4096                          # characters of one cell read
MAX_STACK_LINES = 16


def debug_folder(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path | None] | None:
    """(the newest ``fr_trace_<stamp>.txt``, the ``stacks_<stamp>.txt`` of that time or the
    newest before it) in ``path`` — the debug server's dump folder — or None."""
    path = pathlib.Path(path)
    if not path.is_dir():
        return None
    found: dict[str, list[tuple[str, pathlib.Path]]] = {}
    for f in path.iterdir():
        m = DEBUG_FILE.match(f.name)
        if m and not f.is_symlink() and f.is_file():
            found.setdefault(m["kind"], []).append((m["stamp"], f))
    fr = sorted(found.get("fr_trace", []) or found.get("torchcomms_fr_trace", []))
    if not fr:
        return None
    stamp, newest = fr[-1]
    stacks = [f for s, f in sorted(found.get("stacks", [])) if s <= stamp]
    return newest, (stacks[-1] if stacks else None)


def _read_text(path: pathlib.Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_DEBUG_BYTES:
            raise RunDirError(f"{path}: {size:,} bytes, larger than any debug server dump "
                              f"({MAX_DEBUG_BYTES >> 20} MiB at most)")
        return path.read_bytes().decode("utf-8", "replace")
    except OSError as e:
        raise RunDirError(f"{path}: cannot read ({e.strerror})") from None


def _sections(lines: list[str], start: int) -> dict[str, list[str]]:
    """``--- Groups ---`` … sections of the first ``=== … ===`` block from ``start``."""
    out: dict[str, list[str]] = {}
    name = None
    for line in lines[start:]:
        if line.startswith("=== "):
            break
        m = re.fullmatch(r"--- (.+?) ---", line.strip())
        if m:
            name = m[1]
            out[name] = []
        elif name is not None and line.strip():
            if len(out[name]) >= MAX_TABLE_ROWS:
                raise RunDirError(f"more than {MAX_TABLE_ROWS:,} rows in table {name}")
            out[name].append(line)
    return out


def _table(lines: list[str]) -> list[dict[str, str]]:
    """tabulate's ``plain`` table as rows of cells: columns are where every line, header
    included, has two or more spaces in a row (cells hold single spaces: ``[[4, 5]]``)."""
    if not lines:
        return []
    width = max(len(x) for x in lines)
    padded = [x.ljust(width) for x in lines]
    blank = [all(x[i] == " " for x in padded) for i in range(width)]
    cuts, i = [], 0
    while i < width:
        if blank[i]:
            j = i
            while j < width and blank[j]:
                j += 1
            if j - i >= 2 or i == 0 or j == width:
                cuts.append((i, j))
            i = j
        else:
            i += 1
    spans, at = [], 0
    for a, b in cuts:
        if a > at:
            spans.append((at, a))
        at = b
    if at < width:
        spans.append((at, width))
    header = [padded[0][a:b].strip() for a, b in spans]
    return [{h: x[a:b].strip()[:_CELL] for h, (a, b) in zip(header, spans)}
            for x in padded[1:]]


def _literal(text: str, what: str, path, where: str):
    if text in ("", "None"):
        return None
    try:
        return ast.literal_eval(text)   # literals only: nothing is called or looked up
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise RunDirError(f"{path}: {where}: {what} {text[:40]!r} is not a literal") from None


def read_debug_fr_trace(path: pathlib.Path) -> tuple[dict[int, dict], list[int], str | None]:
    """(rank → a PyTorch dump as plain data, rebuilt from the debug server's tables; the
    ranks the server says did not respond; the table block read) — module docstring, 3.
    ``RunDirError`` naming the file, the table and the cell otherwise."""
    path = pathlib.Path(path)
    text = _read_text(path)
    lines = text.splitlines()
    absent = sorted({int(m[1]) for m in re.finditer(r"(?m)^\s+Rank (\d{1,7}):", text.split(
        "=== ", 1)[0])}) if text.startswith("PARTIAL DATA") else []
    start = next((i for i, x in enumerate(lines)
                  if x.strip() in ("=== FR Trace ===", "=== TorchComms FR Trace ===")), None)
    if start is None:
        raise RunDirError(f"{path}: no '=== FR Trace ===' table: not a debug server fr_trace "
                          f"dump")
    try:
        sections = _sections(lines, start + 1)
    except RunDirError as e:
        raise RunDirError(f"{path}: {e}") from None
    for name in ("Groups", "Memberships", "Collectives"):
        if name not in sections:
            raise RunDirError(f"{path}: --- {name} ---: the table is missing")
    groups = {}
    for k, row in enumerate(_table(sections["Groups"])):
        groups[row.get("id", "")] = row.get("desc", "")
    members: dict[str, list[int]] = {}
    for k, row in enumerate(_table(sections["Memberships"])):
        try:
            members.setdefault(row["group_id"], []).append(int(row["global_rank"]))
        except (KeyError, ValueError):
            raise RunDirError(f"{path}: Memberships row {k}: global_rank "
                              f"{row.get('global_rank')!r} is not a rank") from None
    dumps: dict[int, dict] = {r: {"version": "2.10", "entries": [], "pg_config": {}}
                              for ranks in members.values() for r in ranks}
    for r in absent:
        dumps.pop(r, None)
    # Groups and Memberships name a group by the analyser's hash of it; Collectives by the
    # name the dumps gave it: a group's ranks are its collectives' expected ranks.
    pg_config: dict[str, dict] = {}
    for k, row in enumerate(_table(sections["Collectives"])):
        where = f"Collectives row {k}"
        for need in ("group_id", "collective_seq_id", "collective_name", "expected_ranks"):
            if need not in row:
                raise RunDirError(f"{path}: {where}: no column {need}")
        try:
            seq = int(row["collective_seq_id"] or 0)
            p2p = int(row.get("p2p_seq_id") or 0)
        except ValueError:
            raise RunDirError(f"{path}: {where}: collective_seq_id "
                              f"{row['collective_seq_id']!r} is not a number") from None
        expected = _literal(row["expected_ranks"], "expected_ranks", path, where) or set()
        missing = _literal(row.get("missing_ranks", ""), "missing_ranks", path, where) or set()
        if not isinstance(expected, (set, list, tuple)) or \
                not isinstance(missing, (set, list, tuple)):
            raise RunDirError(f"{path}: {where}: expected_ranks / missing_ranks are not sets "
                              f"of ranks")
        name = row["collective_name"]
        entry = {
            "process_group": (row["group_id"], row.get("pg_desc") or
                              groups.get(row["group_id"], "")),
            "profiling_name": name, "collective_seq_id": seq, "p2p_seq_id": p2p,
            "is_p2p": bool(p2p) and name.rsplit(":", 1)[-1] in _P2P_NAMES,
            "state": row.get("collective_state") or None,
            "input_sizes": _literal(row.get("input_sizes", ""), "input_sizes", path, where),
            "output_sizes": _literal(row.get("output_sizes", ""), "output_sizes", path, where),
        }
        if all(isinstance(r, int) and 0 <= r < 1 << 20 for r in expected) and expected:
            pg_config.setdefault(row["group_id"], {
                "name": row["group_id"], "desc": entry["process_group"][1],
                "ranks": str(sorted(expected))})
        for r in sorted(set(expected) - set(missing)):
            if isinstance(r, int) and r in dumps:
                dumps[r]["entries"].append(dict(entry))
    for d in dumps.values():
        d["pg_config"] = pg_config
    return dumps, absent, lines[start].strip()


def read_debug_stacks(path: pathlib.Path) -> dict[int, list[str]]:
    """rank → its stack's innermost lines (at most ``MAX_STACK_LINES``) from the debug
    server's ``stacks_<stamp>.txt`` (``=== Rank R: addr ===`` sections, each the worker's
    ``dump_traceback``: Python's faulthandler text, innermost call first)."""
    out: dict[int, list[str]] = {}
    rank = None
    for line in _read_text(pathlib.Path(path)).splitlines():
        m = re.match(r"^=== Rank (\d{1,7}): .* ===$", line)
        if m:
            rank = int(m[1])
            out[rank] = []
        elif rank is not None and len(out[rank]) < MAX_STACK_LINES:
            # faulthandler's frame lines only (its thread headers and "<no Python frame>"
            # say nothing of where the rank is)
            fm = re.match(r'^File "(.*)", line (\d+) in (.*)$', line.strip())
            if fm:
                out[rank].append(f"{fm[1][:200]}:{fm[2]} in {fm[3][:100]}")
    return out
