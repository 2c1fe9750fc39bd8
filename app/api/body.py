"""Reading a JSON object body: 413 before reading too much, 400 for empty,
unparsable or non-object bodies."""
from __future__ import annotations

import json

from flask import request

from app.errors import BadRequest


def json_object() -> dict:
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    if not raw or not raw.strip():
        raise BadRequest("request body is empty")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data
