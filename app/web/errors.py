"""The one place errors become HTTP: every error body has an ``error`` string.
The seed-002 routes get the seed's envelope instead, with the same HTTP status
(ASYNCH_SEED_ERRORS_HTTP_200: 200, the status only in ``code``):
``{"code": <status>, "message": <text>, "data": null[, "errors": [...] camelCase]}``."""
from __future__ import annotations

import logging

import redis
from flask import Flask, has_request_context, jsonify, request
from pydantic.alias_generators import to_camel
from sqlalchemy.exc import OperationalError
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from app.config import get_settings
from app.errors import DomainError, RateLimited, Throttled, Unauthorized, ValidationFailed

log = logging.getLogger(__name__)

# URL prefixes of the seed routes: errors under them get the envelope form
# even when no route matched (404/405).
PATH_PREFIXES = ("/model/", "/modelType/", "/task/", "/stat/")


def camel_pointer(pointer: str) -> str:
    """The seed face's names are the v1 names' camelCase aliases: "/models_type" ->
    "/modelsType"; only the first segment (a payload's own names stay as they are)."""
    if not pointer.startswith("/"):
        return pointer
    head, sep, rest = pointer[1:].partition("/")
    return "/" + (to_camel(head) if "_" in head else head) + sep + rest


def _json(status: int, body: dict, headers: dict | None = None):
    seed = has_request_context() and (request.blueprint == "seed" or request.path.startswith(PATH_PREFIXES))
    if seed:
        extra = {k: v for k, v in body.items() if k not in ("error", "errors")}  # deadline_unmeetable's estimate
        envelope = {"code": status, "message": body["error"], "data": extra or None}
        if "errors" in body:
            envelope["errors"] = [{**e, "pointer": camel_pointer(e["pointer"])} for e in body["errors"]]
        body = envelope
    return jsonify(body), 200 if seed and get_settings().seed_errors_http_200 else status, headers or {}


def domain_answer(exc: BaseException) -> tuple[int, dict, dict]:
    """A domain error's status, v1 body and headers: the error handler's
    answer, and a batch item's (app/web/v1_jobs.py, jobs:batch), told as its
    own request would have been; any other error of an item is an internal
    error (logged)."""
    if not isinstance(exc, DomainError):
        log.error("batch item failed: %r", exc)
        return 500, {"error": "internal error"}, {}
    body, headers = {"error": exc.message}, {}
    if isinstance(exc, ValidationFailed):
        body["errors"] = exc.errors
    if isinstance(exc, Throttled):
        headers["Retry-After"] = str(exc.retry_after)
        body.update(getattr(exc, "body", {}))  # deadline_unmeetable's estimate
    if isinstance(exc, RateLimited):
        headers.update(exc.headers)
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="asynch"'
    if exc.status == 503:
        headers["Retry-After"] = "5"
    return exc.status, body, headers


def register(app: Flask) -> None:
    @app.errorhandler(DomainError)
    def domain_error(exc: DomainError):
        return _json(*domain_answer(exc))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if isinstance(exc, RequestEntityTooLarge):
            return _json(413, {"error": f"request body too large (max {request.max_content_length or get_settings().max_body_bytes} bytes)"})
        allow = {"Allow": ", ".join(sorted(exc.valid_methods or []))} if isinstance(exc, MethodNotAllowed) else {}
        return _json(exc.code or 500, {"error": exc.name.lower()}, allow)

    @app.errorhandler(OperationalError)
    @app.errorhandler(redis.RedisError)
    def dependency_down(exc):
        name = "redis" if isinstance(exc, redis.RedisError) else "database"
        return _json(503, {"error": f"{name} unavailable"}, {"Retry-After": "5"})

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        log.exception("unhandled error")
        return _json(500, {"error": "internal error"})
