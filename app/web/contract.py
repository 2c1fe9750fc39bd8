"""``@endpoint``: the one declaration of a route's HTTP contract.

A view declares who may call it, the shapes of its query, headers and body
(pydantic models, app/contract.py) and what it answers.  The decorator
enforces it (authentication, parsing, the one 422 form, serialising, the seed
envelope) and keeps the declaration on the view for app/web/openapi.py: the
document comes from the objects that validate, so the two cannot disagree.
A view gets its path parameters plus ``query``, ``headers`` and ``body`` as
declared, and returns a Shape (a list of them, or JSON data), optionally with
a status and headers (else the first declared status: a 204 view returns
nothing), or a flask Response that is passed through as is.

Input rules: a JSON object body (413 before reading too much; 400 for empty,
unparsable or non-object bodies).  NUL (U+0000): PostgreSQL text cannot hold
it (the driver refuses such a parameter outright), so no stored name or id
contains one: a path with it names nothing (404), a query value or a body
field with it is refused (422) before any query is built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import wraps
from typing import Any, Callable, Literal

from flask import Flask, Response, jsonify, request
from pydantic import BaseModel

from app.contract import Face, dump, parse, parse_json, pointer_token
from app.errors import BadRequest, Forbidden, NotFound, Unauthorized, ValidationFailed
from app.infra import metrics
from app.tenancy.schemas import TENANT_PATTERN
from app.web.auth import current_principal

Auth = Literal["none", "key", "admin", "metrics"]
# Path parameters several routes share: {name: {"description", "schema"}}.
TENANT_PATH = {"tenant": {"description": "tenant id", "schema": {"type": "string", "pattern": TENANT_PATTERN}}}
JOB_ID_PATH = {"job_id": {"description": "job id (job_...)"}}


@dataclass(frozen=True)
class Ok:
    """A success answer: its shape (a model, or a raw JSON schema), what it
    means, its headers ({name: description}) and its media type."""

    shape: type[BaseModel] | dict | None = None
    description: str = "ok"
    headers: dict[str, str] = field(default_factory=dict)
    media_type: str = "application/json"
    many: bool = False  # a JSON array of ``shape``


@dataclass(frozen=True)
class Endpoint:
    summary: str
    tag: str
    ok: dict[int, Ok]
    auth: Auth = "key"
    face: Face = "v1"
    errors: tuple[int, ...] = ()
    query: type[BaseModel] | None = None
    headers: type[BaseModel] | None = None
    body: type[BaseModel] | dict | None = None
    body_required: bool = True
    # Another media type (multipart/form-data: /v1/files) is only documented; the view reads its own body.
    body_media: str = "application/json"
    # JSON pointers under which a body may hold NUL (a job's payload is data).
    nul_allowed: tuple[str, ...] = ()
    path: dict[str, dict] = field(default_factory=dict)  # {name: {"description", "schema"}}
    description: str | None = None


def endpoint(summary: str, *, tag: str, ok: dict[int, Ok] | Ok | None = None, **kw: Any) -> Callable:
    ok = {200: ok or Ok()} if not isinstance(ok, dict) else ok
    spec = Endpoint(summary=summary, tag=tag, ok=ok, **kw)

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(**path_args):
            if spec.auth == "metrics":  # ASYNCH_METRICS_TOKEN, when set, as a Bearer token
                if problem := metrics.token_problem(request.headers.get("Authorization", "")):
                    raise Unauthorized(problem)
            elif spec.auth in ("key", "admin"):
                if not current_principal().is_admin and spec.auth == "admin":
                    raise Forbidden("admin key required")
            extra = {}
            if spec.query is not None:
                extra["query"] = parse(spec.query, request.args.to_dict(), face=spec.face, message="invalid query")
            if spec.headers is not None:  # the ones it declares, by their HTTP names (its aliases)
                names = [info.alias or name for name, info in spec.headers.model_fields.items()]
                given = {n: request.headers[n] for n in names if n in request.headers}
                extra["headers"] = parse(spec.headers, given, face="seed", message="invalid headers")
            if spec.body is not None and spec.body_media == "application/json":
                extra["body"] = _body(spec)
            return _answer(spec, view(**path_args, **extra))

        wrapper.endpoint = spec  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _body(spec: Endpoint):
    """The body as a JSON object, parsed into the declared shape.  A NUL anywhere
    but under ``spec.nul_allowed`` is a 422: those are a job's payload (stored
    as JSON text, where NUL is escaped, and forwarded as data) and bodies that
    are only read ("" for the whole body)."""
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    if not raw.strip() and spec.body_required:
        raise BadRequest("request body is empty")
    try:
        data = parse_json(raw) if raw.strip() else {}  # an optional body left out: {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    if (where := nul_pointer(data, raw, spec.nul_allowed)) is not None:
        raise ValidationFailed("invalid request body", [{"pointer": where, "message": _NUL}])
    if isinstance(spec.body, dict):
        return data  # a free-form object (a job's payload): the service judges it
    return parse(spec.body, data, face=spec.face)


def _jsonable(value: Any, face: Face) -> Any:
    if isinstance(value, BaseModel):
        return dump(value, face)
    if isinstance(value, list):
        return [_jsonable(v, face) for v in value]
    return {k: _jsonable(v, face) for k, v in value.items()} if isinstance(value, dict) else value


def _answer(spec: Endpoint, out: Any):
    if isinstance(out, Response):
        return out
    status, headers = next(iter(spec.ok)), {}
    if isinstance(out, tuple):
        out, status, *rest = out
        headers = rest[0] if rest else {}
    if status == 204:
        return Response(status=204, headers=headers)
    data = _jsonable(out, spec.face)
    if spec.face == "seed":
        data = {"code": 0, "message": "ok", "data": data}
    return jsonify(data), status, headers


_NUL = "must not contain NUL characters"


def nul_pointer(data, raw: str | bytes, allowed: tuple[str, ...] = ()) -> str | None:
    """The JSON pointer of the first key or string holding U+0000, outside the
    subtrees at ``allowed``.  JSON can only carry it escaped, so bodies without
    that escape are not walked."""
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


def register_nul_guard(app: Flask) -> None:
    @app.before_request
    def refuse_nul():
        if "\x00" in request.path:
            raise NotFound("not found")
        if bad := sorted({k for k, v in request.args.items(multi=True) if "\x00" in k or "\x00" in v}):
            raise ValidationFailed("invalid query", [{"pointer": "/" + k.replace("\x00", ""), "message": _NUL}
                                                     for k in bad])
