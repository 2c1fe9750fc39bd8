"""Reading a JSON object body: 413 before reading too much, 400 for empty,
unparsable or non-object bodies."""
from __future__ import annotations

import json

from flask import request

from app.errors import BadRequest


def _not_json(name: str):
    # Python's json takes NaN/Infinity, which JSON has not (and PostgreSQL's jsonb refuses).
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: str | bytes):
    """Strict JSON; ValueError for anything else, also nesting too deep for
    the parser (which would otherwise be a RecursionError and a 500)."""
    try:
        return json.loads(raw, parse_constant=_not_json)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


def json_object() -> dict:
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    if not raw or not raw.strip():
        raise BadRequest("request body is empty")
    try:
        data = parse_json(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data
