"""The Flask application factory: settings, blueprints, one JSON error handler,
and one JSON log line per request carrying the model, job_id and tenant it is
about (bound for everything logged while it runs), never its headers, query
string or body: they may hold keys and secrets."""
from __future__ import annotations

import logging
import time

from flask import Flask, g, request

from app.config import Settings, get_settings, set_settings
from app.infra import tracing
from app.infra.logs import bind, configure_logging, reset
from app.infra.wakeups import hub
from app.web import (contract, errors, metrics, openapi, ratelimit, seed, seed000, v1_admin, v1_batches, v1_business,
                     v1_files, v1_jobs)
from app.web.console import bp as console_bp


def create_app(settings: Settings | None = None) -> Flask:
    if settings is not None:
        set_settings(settings)
    settings = get_settings()
    configure_logging(settings.log_level)

    flask_app = Flask("app")
    # Werkzeug refuses larger bodies with 413 before reading them.
    flask_app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    flask_app.json.sort_keys = False

    errors.register(flask_app)

    @flask_app.before_request
    def _log_start():
        va = request.view_args or {}
        g._log_token = bind(model=va.get("model") or va.get("name"), job_id=va.get("job_id"))
        g._t0 = time.monotonic()
        # A submission's W3C trace context, for the jobs it makes (every face: app/infra/tracing.py).
        g._trace_token = tracing.accept(request.headers.get("traceparent"), request.headers.get("tracestate"))

    @flask_app.after_request
    def _nosniff_and_log(resp):
        # Every answer: a browser never guesses a type we did not send (a
        # model's result, an error body).  A parked wait keeps these headers
        # (app/infra/parking.py sends the ones the app gave).
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        ms = int((time.monotonic() - g.get("_t0", time.monotonic())) * 1000)
        logging.getLogger("asynch.request").info("%s %s %s %dms", request.method, request.path, resp.status_code, ms)
        return resp

    @flask_app.teardown_request
    def _log_end(_exc):
        if (token := g.pop("_log_token", None)) is not None:
            reset(token)
        if (token := g.pop("_trace_token", None)) is not None:
            tracing.forget(token)

    contract.register_nul_guard(flask_app)  # NUL in a path or query
    ratelimit.register(flask_app)  # anonymous requests, per client address
    for bp in (metrics.bp, v1_jobs.bp, v1_admin.bp, v1_business.bp, v1_files.bp, v1_batches.bp, seed.bp, seed000.bp,
               openapi.bp, console_bp):
        flask_app.register_blueprint(bp)

    # The per-process listener (wake-ups, cache invalidations): started here
    # so invalidations reach a process before its first long-poll; it
    # re-starts itself after a fork.
    @flask_app.before_request
    def _listener():
        hub.ensure_started(ready_timeout=0)

    return flask_app
