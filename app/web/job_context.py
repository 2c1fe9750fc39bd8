"""What a job carries from the submitting request besides its payload, read
the same way by both faces: the creator (app/services/identity.py decides
whether a gateway's X-User-Info counts) and the headers passed through to the
OSS file service.  Our own Authorization header is the middleware's API key
and never leaves the middleware: the caller's credential for the file
service comes in X-Oss-Authorization and is sent on as Authorization."""
from __future__ import annotations

from flask import request

from app.tenancy.identity import creator_for


def creator(explicit: str | None = None) -> str:
    given = explicit if explicit else request.headers.get("X-Creator", "")
    return creator_for(given, request.headers.get("X-User-Info"))


def passthrough() -> dict[str, str] | None:
    out = {}
    if request.headers.get("X-Oss-Authorization"):
        out["Authorization"] = request.headers["X-Oss-Authorization"]
    if request.headers.get("X-User-Info"):
        out["X-User-Info"] = request.headers["X-User-Info"]
    return out or None
