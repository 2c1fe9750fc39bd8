"""model-asynch: asynchronous model-inference job middleware (map: docs/architecture.md,
"Where things are").  ``create_app`` is imported lazily: a worker or the CLI
importing ``app`` does not pull in the web layer."""
from __future__ import annotations


def create_app(settings=None):
    """The Flask application (see app/web/application.py)."""
    from app.web.application import create_app as _create_app

    return _create_app(settings)
