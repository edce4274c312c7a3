"""The one codec between the report's typed records (``model.py``) and JSON: encode, decode and
the JSON Schema, each read off the records' own type hints, so summary.json is declared once.

- ``encode(record)`` — a dataclass as a JSON-ready value: its fields in declaration order,
  every field written (None as null), enums as their value; numbers are written as they are
  (an integer count stays an integer).
- ``decode(tp, value, strict=...)`` — a JSON value as ``tp`` (a dataclass, ``list[T]``,
  ``dict[str, T]``, ``T | None``, ``int``, ``float``, ``str``, ``bool``, an ``Enum``, ``Any``).
  A value of the wrong type is a ``CodecError`` naming its place (``$.cross_rank.straggler``)
  and what was expected. ``strict=False`` (reading a report): a key the record does not
  declare is ignored (a newer report's), a key it lacks takes the field's default, else null;
  a string an enum does not hold is kept as the string (a newer report's finding id).
  ``strict=True`` (the analysis building its own summary): an undeclared key or a missing
  field without a default is an error — a field written but never declared cannot slip in.
- ``schema(tp)`` — the JSON Schema (draft 2020-12) of ``tp``: every record a closed object
  (``additionalProperties: false``, every field required), every map keyed by data
  (``dict[str, T]``: ranks, stages, table names) an object whose ``additionalProperties`` is
  the value's schema, records shared through ``$defs``.

Only the standard library: reading a report stays free of pandas and jsonschema.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Union

_NONE = type(None)


class CodecError(ValueError):
    """A JSON value that does not fit the record; the message starts with its place."""


def encode(value: Any) -> Any:
    """``value`` (a record, list, dict or scalar) as JSON-ready Python values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class _Mode:
    strict: bool


def decode(tp: Any, value: Any, *, strict: bool = False, path: str = "$") -> Any:
    """``value`` as ``tp`` (module docstring); ``CodecError`` naming the place otherwise."""
    return _decode(tp, value, _Mode(strict), path)


def _what(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _decode(tp: Any, value: Any, mode: _Mode, path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        errors = []
        for arg in (a for a in args if a is not _NONE):
            try:
                return _decode(arg, value, mode, path)
            except CodecError as e:
                errors.append(str(e))
        raise CodecError(errors[0] if len(errors) == 1 else
                         f"{path}: expected {_name(tp)}, got {_what(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise CodecError(f"{path}: expected a list, got {_what(value)}")
        return [_decode(args[0], v, mode, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise CodecError(f"{path}: expected an object, got {_what(value)}")
        return {str(k): _decode(args[1], v, mode, f"{path}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _record(tp, value, mode, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            if not mode.strict and isinstance(value, str):
                return value
            raise CodecError(f"{path}: {value!r} is not one of "
                             f"{', '.join(str(m.value) for m in tp)}") from None
    return _scalar(tp, value, path)


def _scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value          # an integer stays one: it is written back as it was read
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is _NONE:
        if value is None:
            return None
    else:
        raise TypeError(f"{path}: the codec has no rule for {tp!r}")
    raise CodecError(f"{path}: expected {_name(tp)}, got {_what(value)}")


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


_HINTS: dict[type, dict[str, Any]] = {}


def _record(cls: type, value: Any, mode: _Mode, path: str) -> Any:
    if not isinstance(value, dict):
        raise CodecError(f"{path}: expected an object ({cls.__name__}), got {_what(value)}")
    hints, fields = _hints(cls), dataclasses.fields(cls)
    if mode.strict:
        extra = set(value) - {f.name for f in fields}
        if extra:
            raise CodecError(f"{path}: {', '.join(sorted(map(str, extra)))} not a field of "
                             f"{cls.__name__}")
    made: Any = object.__new__(cls)     # every field typed here: no __init__ to re-check
    for f in fields:
        if f.name in value:
            v = _decode(hints[f.name], value[f.name], mode, f"{path}.{f.name}")
        elif f.default is not dataclasses.MISSING:
            v = f.default
        elif f.default_factory is not dataclasses.MISSING:
            v = f.default_factory()
        elif not mode.strict:
            v = _absent(hints[f.name], f"{path}.{f.name}")
        else:
            raise CodecError(f"{path}.{f.name}: missing")
        object.__setattr__(made, f.name, v)
    return made


def _absent(tp: Any, path: str) -> Any:
    """What an older report's missing key reads as: null, an empty list, map or text, false,
    or the record with every field absent; a missing number that may not be null is an
    error."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or (origin in (Union, types.UnionType) and _NONE in args):
        return None
    if origin is list:
        return []
    if origin is dict:
        return {}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _record(tp, {}, _Mode(False), path)
    if tp is bool:
        return False
    if tp is str:
        return ""
    raise CodecError(f"{path}: missing")


def _name(tp: Any) -> str:
    if isinstance(tp, type):
        return {"float": "a number", "int": "an integer", "str": "a string",
                "bool": "true or false", "NoneType": "null"}.get(tp.__name__, tp.__name__)
    return str(tp).replace("typing.", "")


# -- the JSON Schema ---------------------------------------------------------------------------

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", _NONE: "null"}


def schema(tp: Any, *, title: str | None = None, schema_id: str | None = None
           ) -> dict[str, Any]:
    """The JSON Schema of ``tp`` (module docstring), records in ``$defs``."""
    defs: dict[str, dict[str, Any]] = {}
    root = _schema(tp, defs)
    out: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    if schema_id:
        out["$id"] = schema_id
    if title:
        out["title"] = title
    out.update(root)
    out["$defs"] = dict(sorted(defs.items()))
    return out


def _schema(tp: Any, defs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return {}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin in (Union, types.UnionType):
        parts = [_schema(a, defs) for a in args]
        if all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            return {"type": [p["type"] for p in parts]}
        return {"anyOf": parts}
    if origin is list:
        return {"type": "array", "items": _schema(args[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1], defs)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}                 # a placeholder against recursion
            hints = _hints(tp)
            doc = " ".join((tp.__doc__ or "").split("\n\n")[0].split())
            defs[name] = {"type": "object", **({"description": doc} if doc else {}),
                          "properties": {f.name: _schema(hints[f.name], defs)
                                         for f in dataclasses.fields(tp)},
                          "required": [f.name for f in dataclasses.fields(tp)],
                          "additionalProperties": False}
        return {"$ref": f"#/$defs/{name}"}
    raise TypeError(f"the codec has no schema for {tp!r}")
