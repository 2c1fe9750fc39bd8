"""NUL in a request's path or query string.  PostgreSQL text cannot hold
U+0000 (the driver refuses such a parameter outright), so no stored name or
id contains one: a path with it names nothing (404) and a query value with
it is refused (422) before any query is built."""
from __future__ import annotations

from flask import Flask, request

from app.errors import NotFound, ValidationFailed


def register(app: Flask) -> None:
    @app.before_request
    def refuse_nul():
        if "\x00" in request.path:
            raise NotFound("not found")
        bad = sorted({k for k, v in request.args.items(multi=True) if "\x00" in k or "\x00" in v})
        if bad:
            raise ValidationFailed("invalid query", [{"pointer": "/" + k.replace("\x00", ""),
                                                      "message": "must not contain NUL characters"}
                                                     for k in bad])
