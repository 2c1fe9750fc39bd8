"""One JSON log line per request, carrying the model, job_id and tenant the
request is about (bound for everything logged while it runs).  Never the
headers, the query string or the body: they may hold keys and secrets."""
from __future__ import annotations

import logging
import time

from flask import Flask, g, request

from app.infra.logs import bind, reset

log = logging.getLogger("asynch.request")


def register(app: Flask) -> None:
    @app.before_request
    def _start():
        va = request.view_args or {}
        g._log_token = bind(model=va.get("model") or va.get("name"), job_id=va.get("job_id"))
        g._t0 = time.monotonic()

    @app.after_request
    def _line(resp):
        ms = int((time.monotonic() - g.get("_t0", time.monotonic())) * 1000)
        log.info("%s %s %s %dms", request.method, request.path, resp.status_code, ms)
        return resp

    @app.teardown_request
    def _end(_exc):
        token = g.pop("_log_token", None)
        if token is not None:
            reset(token)
