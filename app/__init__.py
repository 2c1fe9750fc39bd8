"""model-asynch: asynchronous model-inference job middleware."""
from __future__ import annotations

from flask import Flask

from app.config import Settings, get_settings, set_settings


def create_app(settings: Settings | None = None) -> Flask:
    """Application factory: settings, blueprints, one JSON error handler."""
    if settings is not None:
        set_settings(settings)
    settings = get_settings()
    from app.logging_setup import configure_logging

    configure_logging(settings.log_level)

    flask_app = Flask(__name__)
    # Werkzeug refuses larger bodies with 413 before reading them.
    flask_app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    flask_app.json.sort_keys = False

    from app.api import (docs, errors, health, input_guard, metrics, request_log, seed, seed_maintenance,
                         v1_admin, v1_business, v1_jobs, v1_maintenance, v1_observe)

    errors.register(flask_app)
    request_log.register(flask_app)
    input_guard.register(flask_app)
    flask_app.register_blueprint(health.bp)
    flask_app.register_blueprint(v1_jobs.bp)
    flask_app.register_blueprint(v1_admin.bp)
    flask_app.register_blueprint(v1_maintenance.bp)
    flask_app.register_blueprint(seed_maintenance.bp)
    flask_app.register_blueprint(v1_business.bp)
    flask_app.register_blueprint(seed.bp)

    flask_app.register_blueprint(docs.bp)
    flask_app.register_blueprint(metrics.bp)
    flask_app.register_blueprint(v1_observe.bp)
    from app.console import bp as console_bp

    flask_app.register_blueprint(console_bp)

    # The per-process listener (wake-ups, cache invalidations): started here
    # so invalidations reach a process before its first long-poll; it
    # re-starts itself after a fork.
    from app.services.waiters import hub

    @flask_app.before_request
    def _listener():
        hub.ensure_started(ready_timeout=0)

    return flask_app
