"""Reading a JSON object body: 413 before reading too much, 400 for empty,
unparsable or non-object bodies."""
from __future__ import annotations

from flask import request

from app.contract import parse_json
from app.errors import BadRequest, ValidationFailed


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
