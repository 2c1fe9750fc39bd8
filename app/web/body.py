"""Reading a JSON object body: 413 before reading too much, 400 for empty,
unparsable or non-object bodies."""
from __future__ import annotations

import json
import re

from flask import request

from app.errors import BadRequest, ValidationFailed


def _not_json(name: str):
    # Python's json takes NaN/Infinity, which JSON has not (and PostgreSQL's jsonb refuses).
    raise ValueError(f"{name} is not JSON")


# A \\uD800-\\uDFFF escape: the only way a surrogate gets into parsed JSON
# (raw UTF-8 cannot carry one: decoding would fail first).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(raw: str | bytes):
    """Strict JSON; ValueError for anything else: NaN/Infinity, nesting too
    deep for the parser (else a RecursionError and a 500), and strings with
    an unpaired surrogate (not Unicode text: PostgreSQL cannot store it)."""
    try:
        data = json.loads(raw, parse_constant=_not_json)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    if _SURROGATE_ESCAPE.search(text):  # rare: only then pay for a full check
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, RecursionError) as exc:
            raise ValueError("a string has an unpaired surrogate (not Unicode text)") from exc
    return data


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def nul_pointer(data, raw: str | bytes, allowed: tuple[str, ...] = ()) -> str | None:
    """The JSON pointer of the first key or string holding U+0000, outside
    the subtrees at ``allowed``.  PostgreSQL text cannot store it (the driver
    refuses it even as a query parameter), so no stored name, id or setting
    may contain one.  JSON can only carry it escaped, so bodies without that
    escape are not walked."""
    if "" in allowed or (b"\\u0000" if isinstance(raw, bytes) else "\\u0000") not in raw:
        return None
    stack = [("", data)]
    while stack:
        ptr, v = stack.pop()
        if ptr in allowed:
            continue
        if isinstance(v, str):
            if "\x00" in v:
                return ptr
        elif isinstance(v, dict):
            for k, item in v.items():
                if "\x00" in k:
                    return ptr + "/" + _escape(k).replace("\x00", "")
                stack.append((ptr + "/" + _escape(k), item))
        elif isinstance(v, list):
            stack.extend((f"{ptr}/{i}", item) for i, item in enumerate(v))
    return None


def json_object(*, nul_allowed: tuple[str, ...] = ()) -> dict:
    """The body as a JSON object; a NUL character anywhere but under the
    pointers in ``nul_allowed`` is a 422.  Those are a job's payload (stored
    as JSON text, where NUL is escaped, and forwarded to the model as data)
    and bodies that are only read ("" for the whole body)."""
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    if not raw or not raw.strip():
        raise BadRequest("request body is empty")
    try:
        data = parse_json(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    where = nul_pointer(data, raw, nul_allowed)
    if where is not None:
        raise ValidationFailed("invalid request body", [{"pointer": where, "message": "must not contain NUL characters"}])
    return data
