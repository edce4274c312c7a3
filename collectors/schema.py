"""Reading meshscope's JSON documents at the boundary: bounded decoding and JSON Schemas.

The schemas ship inside the package (``collectors/schemas/``, package data), so a non-editable
install validates exactly what a checkout does:

- ``run.schema.json`` — run.json (draft 2020-12), hand-written: it documents the file for
  people writing their own (docs/run-directory.md);
- ``flight_recorder.schema.json`` — ``comms/rank{R}.json``, generated from the typed records of
  ``collectors/flight_recorder.py`` (one definition; a test checks the shipped file is current).

``read_document(path, what)`` reads one JSON document with bounds: at most ``MAX_BYTES[what]``
bytes, decoded by msgspec (no NaN or Infinity, no number beyond 64-bit range, nesting at most the
decoder's limit of about 1,000 levels); else ``RunDirError`` naming the file and what is wrong.
``validate_run_json(path)`` returns a parsed run.json that matches its schema, or raises
``RunDirError`` whose message names the file, the failing place as a JSON path
(``$.process_groups[2].ranks``) and what is wrong there. The schema states the keys the runner
(``parallel/launch.py``) and ``collectors.Recorder`` write; readers accept unknown extra keys.
``collectors/run_info.py`` adds the bounds a schema cannot state.
"""
from __future__ import annotations

import functools
import json
import pathlib
import sys
import threading

import msgspec

from .run_dir import RUN_JSON, RunDirError

SCHEMA_DIR = pathlib.Path(__file__).resolve().with_name("schemas")
SCHEMA_PATH = SCHEMA_DIR / "run.schema.json"
FR_SCHEMA_PATH = SCHEMA_DIR / "flight_recorder.schema.json"
# The largest file of each kind read whole: far above any real one (a 1,024-rank run.json is
# ~300 KB; a Flight Recorder dump of 20,000 entries ~12 MB).
MAX_BYTES = {"run.json": 64 << 20, "Flight Recorder dump": 1 << 30}


def json_path(parts) -> str:
    """``['mesh', 'shape', 0]`` → ``$.mesh.shape[0]``."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def short(value, limit: int = 40) -> str:
    """``value`` as JSON, cut to ``limit`` characters: how messages quote what a file holds."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_bytes(path: pathlib.Path, what: str) -> bytes:
    """The bytes of ``path``, at most ``MAX_BYTES[what]``; ``RunDirError`` naming the file
    otherwise, or when it cannot be read."""
    path = pathlib.Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES[what]:
            raise RunDirError(f"{path}: {size:,} bytes, larger than any {what} "
                              f"({MAX_BYTES[what] >> 20} MiB at most)")
        return path.read_bytes()
    except OSError as e:
        raise RunDirError(f"{path}: cannot read ({e.strerror})") from None


def read_document(path: pathlib.Path, what: str, raw: bytes | None = None):
    """The decoded JSON document at ``path`` (module docstring; ``raw``: its bytes, when
    already read by ``read_bytes``); ``RunDirError`` naming the file when it cannot be read or
    decoded within the bounds."""
    path = pathlib.Path(path)
    if raw is None:
        raw = read_bytes(path, what)
    try:
        return msgspec.json.decode(raw)
    except RecursionError:
        raise RunDirError(f"{path}: not a usable {what}: nested deeper than the decoder's limit "
                          f"(about 1,000 levels)") from None
    except msgspec.DecodeError as e:
        raise RunDirError(f"{path}: not readable JSON, so not a usable {what} ({e})") from None


# jsonschema's optional checkers of string formats, imported with it when installed. The
# schemas here use no "format", and one of them (rfc3987-syntax, pulled in by Jupyter) compiles
# a grammar for ~2 s at import: they are kept out while jsonschema is first imported.
_FORMAT_MODULES = ("rfc3987_syntax", "rfc3987", "rfc3986_validator", "rfc3339_validator",
                   "uri_template", "isoduration", "fqdn", "webcolors", "jsonpointer")
# One thread imports jsonschema at a time: while one is importing, the format modules are
# hidden (``sys.modules[m] = None``) and ``jsonschema`` is in ``sys.modules`` half-initialised,
# so a second thread (the dashboard answers requests on several) must wait, not read it.
_IMPORT_LOCK = threading.Lock()
_JSONSCHEMA = None


def _import_jsonschema():
    global _JSONSCHEMA
    if _JSONSCHEMA is not None:
        return _JSONSCHEMA
    with _IMPORT_LOCK:
        if _JSONSCHEMA is None:
            _JSONSCHEMA = _import_hiding_formats()
    return _JSONSCHEMA


def _import_hiding_formats():
    if "jsonschema" in sys.modules and sys.modules["jsonschema"] is not None and \
            hasattr(sys.modules["jsonschema"], "Draft202012Validator"):
        import jsonschema  # imported elsewhere: the import system waits until it is complete
        return jsonschema
    hidden = [m for m in _FORMAT_MODULES if m not in sys.modules]
    for m in hidden:
        sys.modules[m] = None           # "import m" raises ImportError: jsonschema skips it
    try:
        import jsonschema
    finally:
        for m in hidden:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]      # anyone else importing it later gets the real one
    return jsonschema


_VALIDATOR_LOCK = threading.Lock()


def _validator(schema_path: pathlib.Path):
    """The validator of ``schema_path``, built once (under a lock: concurrent first requests
    of the dashboard share it)."""
    with _VALIDATOR_LOCK:
        return _build_validator(schema_path)


@functools.lru_cache(maxsize=None)
def _build_validator(schema_path: pathlib.Path):
    """A draft 2020-12 validator of the schema at ``schema_path`` (its own validity against the
    meta-schema is a test, not a cost of every read)."""
    jsonschema = _import_jsonschema()
    return jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))


def _message(error) -> str:
    """jsonschema's message with the offending value quoted briefly (a message starts with the
    value's repr, which may be a whole list)."""
    head = repr(error.instance)
    text = error.message
    if text.startswith(head) and len(head) > 40:
        text = short(error.instance) + text[len(head):]
    return text[:300]


def check(data, path: pathlib.Path, schema_path: pathlib.Path = SCHEMA_PATH) -> None:
    """RunDirError naming ``path``, the failing place and what is wrong, when ``data`` does not
    match the schema; one error is named and the others counted."""
    validator = _validator(schema_path)
    best_match = _import_jsonschema().exceptions.best_match

    errors = list(validator.iter_errors(data))
    if errors:
        # The shallowest error (most is wrong there), the first in document order; within
        # oneOf / anyOf, the alternative jsonschema finds most relevant.
        first = best_match([min(errors, key=lambda e: (len(e.absolute_path), [
            (0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in e.absolute_path]))])
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise RunDirError(f"{path}: {json_path(first.absolute_path)}: {_message(first)}{more}")


def validate_run_json(path) -> dict:
    """The contents of the run.json at ``path`` (a file, or a run directory holding one);
    RunDirError naming the file and the failing path when it does not match the schema."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / RUN_JSON
    data = read_document(path, "run.json")
    check(data, path)
    return data
