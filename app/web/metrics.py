"""GET /metrics: Prometheus text format.  No API key; when
ASYNCH_METRICS_TOKEN is set, the scraper must send it as a Bearer token."""
from __future__ import annotations

from flask import Blueprint, Response

from app.infra import metrics
from app.web.contract import Ok, endpoint

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
@endpoint("Prometheus metrics (text exposition format)", tag="meta", auth="metrics",
          ok=Ok({"type": "string"}, "metrics", media_type="text/plain"),
          description="No API key. When ASYNCH_METRICS_TOKEN is set, send it as `Authorization: Bearer <token>` "
                      "(401 otherwise).")
def prometheus_metrics():
    body, ctype = metrics.render()
    return Response(body, status=200, content_type=ctype)
