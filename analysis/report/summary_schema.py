"""The JSON Schema of summary.json, generated from ``model.Summary`` by ``codec.schema``: every
record closed (``additionalProperties: false``, every field required), maps keyed by data typed
through ``additionalProperties``. Shipped as ``schemas/summary.schema.json`` beside this module
and as docs/summary.schema.json (tests/test_summary_schema.py holds both equal to what this
generates); ``meshscope schema summary`` prints it. Only the standard library is imported.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

from meshscope.analysis.report import codec
from meshscope.analysis.report.model import REPORT_SCHEMA_VERSION, Summary

#: The shipped copy (package data).
SHIPPED = pathlib.Path(__file__).with_name("schemas") / "summary.schema.json"


def schema() -> dict[str, Any]:
    """summary.json's JSON Schema (draft 2020-12) for ``REPORT_SCHEMA_VERSION``."""
    out = codec.schema(
        Summary, title=f"meshscope summary.json, schema version {REPORT_SCHEMA_VERSION}",
        schema_id=f"https://meshscope.invalid/schemas/summary-v{REPORT_SCHEMA_VERSION}.json")
    out["properties"] = {"schema_version": {"const": REPORT_SCHEMA_VERSION}}
    return out


def text() -> str:
    """The schema as the shipped file holds it."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"
