"""The OpenAPI 3.1 document, generated from the routes' ``@endpoint``
declarations (app/web/contract.py) and the pydantic shapes they name (a
component is the model's own draft 2020-12 schema), and GET /openapi.json.

Invariants:
- Every operation lists every status it can answer: the declared ones plus
  those its way in implies (401/503 behind a key, 403 admin, 404 path
  parameters, 400/413/422 a body, 422 a query, 429 always).  An undeclared
  route is an error here, so an undocumented route cannot exist.
- A build costs ~80 ms of CPU (under gevent it stalls the process): built once
  per (app, settings) under a lock (``BUILDS`` counts), served with a strong ETag.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any, Callable

from flask import Blueprint, Flask, Response, current_app, request
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from werkzeug.routing import IntegerConverter

from app.config import get_settings
from app.web.contract import Endpoint, Ok, endpoint
from app.web.schemas import ERROR_SHAPES

bp = Blueprint("docs", __name__)

_S = "#/components/schemas/"
_RETRY = {"Retry-After": "seconds to wait before trying again"}
_SCHEMA_KEYS = ("type", "anyOf", "allOf", "oneOf", "properties", "$ref", "enum", "items", "const")

# status: (response name, v1 schema, description, headers)
_ERRORS = {
    400: ("BadRequest", "Error", "the body is empty, not JSON, or not a JSON object", {}),
    401: ("Unauthorized", "Error", "missing or invalid API key", {"WWW-Authenticate": 'Bearer realm="asynch"'}),
    403: ("Forbidden", "Error", "an admin key is required", {}),
    404: ("NotFound", "Error", "no such resource (or it belongs to another tenant)", {}),
    405: ("MethodNotAllowed", "Error", "the path does not take this method", {"Allow": "the methods the path takes"}),
    409: ("Conflict", "Error", "the resource is in a state that refuses this", {}),
    410: ("Gone", "Error", "the stored result has been cleaned up", {}),
    413: ("TooLarge", "Error", "the body is over ASYNCH_MAX_BODY_BYTES", {}),
    422: ("Invalid", "ValidationError", "invalid fields, each with a JSON pointer", {}),
    429: ("TooMany", "Throttled", "a limit is reached (queue full, rate limit, waiters): try again after Retry-After",
          _RETRY),
    503: ("Unavailable", "Error", "a dependency (database, Redis) is down; nothing was changed", _RETRY),
}
# auth: (the security requirement, the statuses it implies)
_AUTH = {"none": ([], set()), "key": ([{"bearerAuth": []}], {401, 503}),
         "admin": ([{"bearerAuth": []}], {401, 403, 503}), "metrics": ([{}, {"metricsToken": []}], {401})}


class _Shapes:
    """Collects every model a document refers to, per face: the seed face's
    components are the same models by their camelCase aliases, named Seed*."""

    def __init__(self) -> None:
        self.wanted: dict[tuple[str, str], type[BaseModel]] = {}

    def ref(self, model: type[BaseModel], face: str, mode: str) -> dict:
        self.wanted[(face, model.__name__ + "|" + mode)] = model
        seed = face == "seed" and not model.__name__.startswith("Seed")
        return {"$ref": f"{_S}{'Seed' if seed else ''}{model.__name__}"}

    def components(self) -> dict:
        out: dict[str, Any] = {}
        for face, prefix in (("v1", ""), ("seed", "Seed")):
            items = [(m, key.split("|")[1]) for (f, key), m in self.wanted.items() if f == face]
            _, top = models_json_schema(items, by_alias=face == "seed", ref_template=_S + prefix + "{model}")
            defs = top.get("$defs", {})
            _wire_names(defs, {m for m, _ in items})  # a no-op on the seed face (by alias already)
            # A seed-only shape already named Seed* is not prefixed twice.
            out.update({(name if name.startswith("Seed") else prefix + name): schema for name, schema in defs.items()})
        return json.loads(json.dumps(out).replace(f'"{_S}SeedSeed', f'"{_S}Seed'))


def _wire_names(defs: dict, models: set[type[BaseModel]]) -> None:
    """A v1 shape that says its names are its aliases (``from``, ``to``)
    shows them in the document too."""
    seen: set[type[BaseModel]] = set()
    todo = list(models)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for info in m.model_fields.values():
            todo += [a for a in getattr(info.annotation, "__args__", ()) or (info.annotation,)
                     if isinstance(a, type) and issubclass(a, BaseModel)]
        if not m.model_config.get("serialize_by_alias") or m.__name__ not in defs:
            continue
        schema = defs[m.__name__]
        names = {n: (f.alias or n) for n, f in m.model_fields.items()}
        schema["properties"] = {names.get(k, k): v for k, v in schema.get("properties", {}).items()}
        if "required" in schema:
            schema["required"] = [names.get(k, k) for k in schema["required"]]


def _walk(node: Any, on_dict: Callable[[dict], dict]) -> Any:
    """A copy of a JSON tree with ``on_dict`` applied to every object, top-down."""
    if isinstance(node, dict):
        return {k: _walk(v, on_dict) for k, v in on_dict(node).items()}
    return [_walk(v, on_dict) for v in node] if isinstance(node, list) else node


def _cleaned(node: dict, settings) -> dict:
    """Settings fill in their bounds; our private keys and titles go."""
    out = {}
    schema_like = any(k in node for k in _SCHEMA_KEYS)
    for k, v in node.items():
        if k == "x-rule" or (k == "title" and schema_like) or (k == "default" and v is None and schema_like):
            continue  # (a null default of a field that may be absent says nothing, and is no value of its type)
        if k.startswith("x-") and k.endswith("-setting"):
            out[k[2:-8]] = getattr(settings, v)  # x-maximum-setting: name -> maximum: its value
        else:
            out[k] = v
    return out


def _parameters(model: type[BaseModel], face: str, where: str) -> list[dict]:
    """The query or header parameters of a model, inlined (no $refs)."""
    schema = model.model_json_schema(by_alias=face == "seed")
    defs = schema.get("$defs", {})
    out = []
    for name, info in model.model_fields.items():
        wire = info.alias if (face == "seed" or model.__name__.endswith("Headers")) and info.alias else name
        prop = schema["properties"][info.alias if face == "seed" and info.alias else name]
        prop = _not_null(_walk(prop, lambda d: defs[d["$ref"].rsplit("/", 1)[1]]
                                     if d.get("$ref", "").startswith("#/$defs/") else d))
        desc = prop.pop("description", "") or ""
        out.append({"name": wire, "in": where, "required": info.is_required(), "schema": prop, "description": desc})
    return out


def _not_null(prop: dict) -> dict:
    """A query or header parameter is absent or a string, never JSON null:
    drop a ``null`` alternative (None in the model means "not sent")."""
    alts = [a for a in prop.get("anyOf", []) if a != {"type": "null"}]
    if "anyOf" not in prop or len(alts) == len(prop["anyOf"]):
        return prop
    rest = {k: v for k, v in prop.items() if k != "anyOf"}
    return {**alts[0], **rest} if len(alts) == 1 else {**rest, "anyOf": alts}


def _response(ok: Ok, face: str, shapes: _Shapes) -> dict:
    resp: dict[str, Any] = {"description": ok.description}
    if ok.shape is not None:
        schema = shapes.ref(ok.shape, face, "serialization") if isinstance(ok.shape, type) else ok.shape
        if ok.many:
            schema = {"type": "array", "items": schema}
        if face == "seed" and ok.media_type == "application/json":
            schema = {"type": "object", "required": ["code", "message", "data"], "properties": {
                "code": {"const": 0}, "message": {"const": "ok"}, "data": schema}}
        resp["content"] = {ok.media_type: {"schema": schema}}
    if ok.headers:
        resp["headers"] = {k: {"description": v, "schema": {"type": "string"}} for k, v in ok.headers.items()}
    return resp


def _operation(rule, spec: Endpoint, shapes: _Shapes, fixed: set[str]) -> dict:
    # 429: every request is rate limited, by its key or, without one (or
    # with a key that fails), by its client address (app/web/ratelimit.py).
    security, implied = _AUTH[spec.auth]
    codes = set(spec.errors) | {429} | implied
    params = []
    for name in sorted(rule.arguments - fixed):  # each path parameter may name nothing: 404
        codes.add(404)
        integer = isinstance(rule._converters.get(name), IntegerConverter)
        declared = spec.path.get(name, {})
        schema = declared.get("schema", {"type": "integer", "minimum": 0} if integer else {"type": "string"})
        params.append({"name": name, "in": "path", "required": True, "schema": schema,
                       "description": declared.get("description", "")})
    if spec.query is not None:
        params += _parameters(spec.query, spec.face, "query")
        codes.add(422)
    if spec.headers is not None:
        params += _parameters(spec.headers, spec.face, "header")
    op: dict[str, Any] = {"summary": spec.summary + (" (admin)" if spec.auth == "admin" else ""),
                          "tags": [spec.tag], "security": security, "responses": {}}
    if spec.description:
        op["description"] = spec.description
    if params:
        op["parameters"] = params
    if spec.body is not None:
        codes |= {400, 413}
        schema = spec.body
        if isinstance(spec.body, type):
            codes.add(422)
            schema = shapes.ref(spec.body, spec.face, "validation")
        op["requestBody"] = {"required": spec.body_required, "content": {spec.body_media: {"schema": schema}}}
    for status, ok in sorted(spec.ok.items()):
        op["responses"][str(status)] = _response(ok, spec.face, shapes)
    prefix = "Seed" if spec.face == "seed" else ""
    for c in sorted(codes):
        op["responses"].setdefault(str(c), {"$ref": "#/components/responses/" + prefix + _ERRORS[c][0]})
    if spec.auth == "admin":
        op["x-admin-only"] = True
    return op


def openapi_path(rule: str) -> str:
    return re.sub(r"<(?:[a-z_]+(?:\([^)]*\))?:)?([A-Za-z_]+)>", r"{\1}", rule)


def _concrete_paths(rule) -> list[tuple[str, set[str]]]:
    """A rule's documented paths: an ``any(a, b)`` converter is documented as
    one concrete path per choice (and is not a parameter of them)."""
    m = re.search(r"<any\(([^)]*)\):([A-Za-z_]+)>", rule.rule)
    if not m:
        return [(openapi_path(rule.rule), set())]
    return [(openapi_path(rule.rule[:m.start()] + choice.strip() + rule.rule[m.end():]), {m.group(2)})
            for choice in m.group(1).split(",")]


def undocumented(app: Flask) -> list[str]:
    """Routes without an @endpoint declaration (static files aside)."""
    return sorted(r.rule for r in app.url_map.iter_rules()
                  if not r.endpoint.endswith("static")
                  and getattr(app.view_functions[r.endpoint], "endpoint", None) is None)


BUILDS = 0  # documents built by this process (tests count them)
_build_lock = threading.Lock()  # gevent patches it into a greenlet lock: the others wait, cooperatively


def served(app: Flask) -> tuple[bytes, str]:
    """The document as served (JSON bytes) and its strong ETag, built at the
    first call for this app and settings, then reused."""
    settings = get_settings()
    with _build_lock:
        cached = app.extensions.get("asynch.openapi")
        if cached is None or cached[0] is not settings:
            body = json.dumps(document(app), separators=(",", ":")).encode()
            cached = app.extensions["asynch.openapi"] = (settings, body, hashlib.sha256(body).hexdigest()[:32])
        return cached[1], cached[2]


def document(app: Flask) -> dict:
    global BUILDS
    BUILDS += 1
    if missing := undocumented(app):
        raise ValueError(f"routes without an @endpoint declaration: {missing}")
    shapes = _Shapes()
    paths: dict[str, dict] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if rule.endpoint.endswith("static"):
            continue
        spec: Endpoint = app.view_functions[rule.endpoint].endpoint
        for path, fixed in _concrete_paths(rule):
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                paths.setdefault(path, {})[method.lower()] = _operation(rule, spec, shapes, fixed)
    for model in ERROR_SHAPES:
        shapes.ref(model, "v1", "serialization")
    responses = {}
    for name, shape, description, headers in _ERRORS.values():
        seed_shape = "SeedValidationError" if shape == "ValidationError" else "SeedError"
        for prefix, schema in (("", shape), ("Seed", seed_shape)):  # an error is enveloped already
            responses[prefix + name] = _response(Ok({"$ref": _S + schema}, description, headers), "v1", shapes)
    schemes = {"bearerAuth": {"type": "http", "scheme": "bearer", "description": "an API key (ak_...)"},
               "metricsToken": {"type": "http", "scheme": "bearer", "description": "ASYNCH_METRICS_TOKEN"}}
    doc = {"openapi": "3.1.0", "info": {"title": "model-asynch", "version": "1.0.0", "description": DESCRIPTION},
           "security": [{"bearerAuth": []}], "paths": paths,
           "components": {"schemas": shapes.components(), "responses": responses, "securitySchemes": schemes}}
    settings = get_settings()
    return _walk(doc, lambda d: _cleaned(d, settings))


DESCRIPTION = (
    "Asynchronous model-inference jobs. Every error body has an `error` string; 422 adds "
    "`errors: [{pointer, message}]` (the seed-002 routes answer in their envelope "
    "`{code, message, data: null[, errors]}`). A method a path does not list answers 405 with `Allow`. "
    "No string may hold NUL (U+0000): in a path that is 404, in a query value or a JSON body 422 (a job's "
    "payload may: it is data for the model); unpaired surrogates in a JSON body are 400. JSON numbers with "
    "no fraction (2.0) are integers. Times are UTC ISO 8601 with a Z.")

_ETAG = {"ETag": "the document's strong validator"}


@bp.get("/openapi.json")
@endpoint("This document", tag="meta", auth="none",
          ok={200: Ok({"type": "object"}, "OpenAPI 3.1", _ETAG), 304: Ok(None, "If-None-Match names the current ETag",
                                                                          _ETAG)})
def openapi_json():
    body, etag = served(current_app)
    headers = {"ETag": f'"{etag}"', "Cache-Control": "no-cache"}
    if request.if_none_match.contains_weak(etag):  # RFC 9110 13.1.2: weak comparison
        return Response(status=304, headers=headers)
    return Response(body, status=200, mimetype="application/json", headers=headers)
