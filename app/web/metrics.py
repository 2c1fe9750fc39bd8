"""GET /metrics: Prometheus text format.  No API key; when
ASYNCH_METRICS_TOKEN is set, the scraper must send it as a Bearer token."""
from __future__ import annotations

import hmac

from flask import Blueprint, Response, request

from app.infra import metrics
from app.config import get_settings
from app.errors import Unauthorized

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def prometheus_metrics():
    token = get_settings().metrics_token
    if token:
        h = request.headers.get("Authorization", "")
        given = h[7:].strip() if h[:7].lower() == "bearer " else ""
        if not given:
            raise Unauthorized("missing metrics token")
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise Unauthorized("invalid metrics token")
    body, ctype = metrics.render()
    return Response(body, status=200, content_type=ctype)
