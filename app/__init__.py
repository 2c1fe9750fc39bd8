"""model-asynch: asynchronous model-inference job middleware.

The map of the package is in docs/architecture.md ("Where things are").
``create_app`` is imported lazily so that importing any part of ``app``
(a worker, the CLI) does not pull in the web layer.
"""
from __future__ import annotations


def create_app(settings=None):
    """The Flask application (see app/web/application.py)."""
    from app.web.application import create_app as _create_app

    return _create_app(settings)
