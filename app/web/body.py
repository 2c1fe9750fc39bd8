"""Request input rules.  A JSON object body: 413 before reading too much,
400 for empty, unparsable or non-object bodies.  NUL (U+0000): PostgreSQL
text cannot hold it (the driver refuses such a parameter outright), so no
stored name or id contains one: a path with it names nothing (404), a query
value or a body field with it is refused (422) before any query is built."""
from __future__ import annotations

from flask import Flask, request

from app.contract import parse_json, pointer_token
from app.errors import BadRequest, NotFound, ValidationFailed

_NUL = "must not contain NUL characters"


def nul_pointer(data, raw: str | bytes, allowed: tuple[str, ...] = ()) -> str | None:
    """The JSON pointer of the first key or string holding U+0000, outside
    the subtrees at ``allowed``.  PostgreSQL text cannot store it (the driver
    refuses it), so no stored name, id or setting may contain one.  JSON can
    only carry it escaped, so bodies without that escape are not walked."""
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
                    return ptr + "/" + pointer_token(k).replace("\x00", "")
                stack.append((ptr + "/" + pointer_token(k), item))
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
        raise ValidationFailed("invalid request body", [{"pointer": where, "message": _NUL}])
    return data


def register(app: Flask) -> None:
    @app.before_request
    def refuse_nul():
        if "\x00" in request.path:
            raise NotFound("not found")
        bad = sorted({k for k, v in request.args.items(multi=True) if "\x00" in k or "\x00" in v})
        if bad:
            raise ValidationFailed("invalid query", [{"pointer": "/" + k.replace("\x00", ""), "message": _NUL}
                                                     for k in bad])
