"""Validate a run.json against its JSON Schema (``docs/run.schema.json``, draft 2020-12).

``validate_run_json(path)`` returns the parsed run.json, or raises ``RunDirError`` whose message
names the file, the failing place as a JSON path (``$.process_groups[2].ranks``) and what is
wrong there. The schema states the keys the runner (``parallel/launch.py``) and
``collectors.Recorder`` write; readers still accept unknown extra keys. Needs ``jsonschema``
(a test dependency; ``pip install jsonschema``).
"""
from __future__ import annotations

import functools
import json
import pathlib

from .run_dir import RunDirError

SCHEMA_PATH = pathlib.Path(__file__).resolve().parents[1] / "docs" / "run.schema.json"


@functools.lru_cache(maxsize=1)
def _validator():
    try:
        import jsonschema
    except ImportError:
        raise RuntimeError("validating run.json needs the jsonschema package "
                           "(pip install jsonschema)") from None
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def json_path(parts) -> str:
    """``['mesh', 'shape', 0]`` → ``$.mesh.shape[0]``."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def validate_run_json(path) -> dict:
    """The contents of the run.json at ``path`` (a file, or a run directory holding one);
    RunDirError naming the file and the failing path when it does not match the schema."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "run.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunDirError(f"{path}: not readable JSON ({e})") from None
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(map(str, e.path)))
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise RunDirError(f"{path}: {json_path(first.path)}: {first.message}{more}")
    return data
