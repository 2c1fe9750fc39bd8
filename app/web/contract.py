"""``@endpoint``: the one declaration of a route's HTTP contract.

A view declares who may call it, the shapes of its query, headers and body
(pydantic models, app/contract.py) and what it answers.  The decorator
enforces it (authentication, parsing, the one 422 form, serialising, the seed
envelope) and keeps the declaration on the view for app/web/openapi.py: the
document comes from the objects that validate, so the two cannot disagree.
A view gets its path parameters plus ``query``, ``headers`` and ``body`` as
declared, and returns a Shape (a list of them, or JSON data), optionally with
a status and headers, or a flask Response that is passed through as is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import wraps
from typing import Any, Callable, Literal

from flask import Response, jsonify, request
from pydantic import BaseModel

from app.contract import Face, dump, parse
from app.errors import Forbidden
from app.tenancy.schemas import TENANT_PATTERN
from app.web.auth import current_principal, require_metrics_token
from app.web.body import json_object

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
            if spec.auth == "metrics":
                require_metrics_token()
            elif spec.auth in ("key", "admin"):
                if not current_principal().is_admin and spec.auth == "admin":
                    raise Forbidden("admin key required")
            extra = {}
            if spec.query is not None:
                extra["query"] = parse(spec.query, request.args.to_dict(), face=spec.face, message="invalid query")
            if spec.headers is not None:
                extra["headers"] = parse(spec.headers, _declared_headers(spec.headers), face="seed",
                                         message="invalid headers")
            if spec.body is not None:
                extra["body"] = _body(spec)
            return _answer(spec, view(**path_args, **extra))

        wrapper.endpoint = spec  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _declared_headers(model: type[BaseModel]) -> dict:
    """The request headers a model declares (by their HTTP names, its aliases)."""
    names = [info.alias or name for name, info in model.model_fields.items()]
    return {n: request.headers[n] for n in names if n in request.headers}


def _body(spec: Endpoint):
    empty = not spec.body_required and not request.get_data(cache=True).strip()
    data = {} if empty else json_object(nul_allowed=spec.nul_allowed)
    if isinstance(spec.body, dict):
        return data  # a free-form object (a job's payload): the service judges it
    return parse(spec.body, data, face=spec.face)


def _jsonable(value: Any, face: Face) -> Any:
    if isinstance(value, BaseModel):
        return dump(value, face)
    if isinstance(value, list):
        return [_jsonable(v, face) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v, face) for k, v in value.items()}
    return value


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
    resp = jsonify(data)
    resp.status_code = status
    resp.headers.update(headers)
    return resp
