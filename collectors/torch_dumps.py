"""Which files are PyTorch's own Flight Recorder dumps, told by their name and first bytes —
without reading them as pickles (``flight_recorder.read_torch_dump`` does that, through the
plain-data unpickler). Standard library only: the run discovery (``run_dir.run_kind``) asks it
as well as the Flight Recorder's reader.
"""
from __future__ import annotations

import pathlib
import pickle
import pickletools
import re
import struct

# A dump file's name: a prefix, the rank, and — for the JSON form (``_dump_fr_trace_json``,
# the debug server's ``fr_trace_json``), which PyTorch hands over but never names — ``.json``;
# a pickle saved with ``.pkl`` or ``.pickle`` is taken too.
_TORCH_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)(?P<ext>\.json|\.pkl|\.pickle)?$")
# The keys of PyTorch's dump; its JSON form starts with one of them (nlohmann's sorted keys
# put comm_lib_version first), a Kineto trace with none.
TORCH_KEYS = frozenset({"comm_lib_version", "entries", "nccl_comm_state", "nccl_version",
                        "pg_config", "pg_status", "version"})
_FIRST_KEY = re.compile(rb'^\s*\{\s*"([A-Za-z_]{1,40})"')


def torch_dump_name(name: str) -> tuple[str, int, str] | None:
    """(prefix, rank, form) that a file name gives as one of PyTorch's dumps —
    ``nccl_trace_rank_3`` → (``nccl_trace_rank_``, 3, ``pickle``), ``_dump_12.json`` →
    (``_dump_``, 12, ``json``); None for a name that cannot be one (no rank at its end)."""
    m = _TORCH_NAME.match(name)
    if not m:
        return None
    return m["prefix"], int(m["rank"]), "json" if m["ext"] == ".json" else "pickle"


_PICKLE_PREAMBLE = {"PROTO", "FRAME", "MARK", "BINPUT", "LONG_BINPUT", "MEMOIZE"}


def _first_pickle_key(head: bytes) -> str | None:
    """The first key of the dict a pickle starts with, read from its first bytes by
    ``pickletools.genops`` (which only reads); None when it starts with anything else."""
    seen_dict = False
    try:
        for op, arg, _ in pickletools.genops(head):
            if op.name == "EMPTY_DICT" and not seen_dict:
                seen_dict = True
            elif op.name not in _PICKLE_PREAMBLE:
                return arg if seen_dict and op.name.endswith("UNICODE") else None
    except (ValueError, EOFError, struct.error, IndexError, OverflowError):
        pass
    return None


def torch_dump_form(path: pathlib.Path, form: str) -> str | None:
    """Why ``path`` is not a PyTorch dump of ``form`` (``pickle``: a binary pickle, protocol 2
    or later, of a dict whose first key is one of the dump's, as PyTorch writes it; ``json``:
    an object whose first key is one of them), judged from its first bytes; None when it may
    be one. Another pickle — a checkpoint beside the traces — is no dump."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not head:
        return "an empty file"
    if form == "pickle" and head.lstrip()[:1] == b"{":
        form = "json"       # the JSON form under a name without .json (TorchComms' dump_json)
    if form == "pickle":
        if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= pickle.HIGHEST_PROTOCOL and \
                _first_pickle_key(head) in TORCH_KEYS:
            return None
        return "not a pickle of PyTorch's dump (a dict starting with one of its keys)"
    m = _FIRST_KEY.match(head)
    return None if m and m[1].decode() in TORCH_KEYS else \
        "not PyTorch's JSON dump (an object starting with one of its keys)"
