"""Prometheus endpoints, text format.  No API key; when ASYNCH_METRICS_TOKEN
is set, the scraper must send it as a Bearer token (both paths).

GET /metrics           this API server's counters and histograms (its gunicorn
                       workers summed): scrape every pod, sum in PromQL.
GET /metrics/cluster   gauges read from PostgreSQL and Redis, the same on every
                       pod: scrape once per cluster (docs/operations.md).
"""
from __future__ import annotations

from flask import Blueprint, Response, request

from app.errors import Unauthorized
from app.infra import metrics
from app.observe import cluster

bp = Blueprint("metrics", __name__)


def _check_token() -> None:
    problem = metrics.token_problem(request.headers.get("Authorization", ""))
    if problem:
        raise Unauthorized(problem)


@bp.get("/metrics")
def prometheus_metrics():
    _check_token()
    body, ctype = metrics.render()
    return Response(body, status=200, content_type=ctype)


@bp.get("/metrics/cluster")
def prometheus_cluster_metrics():
    _check_token()
    body, ctype = cluster.render()
    return Response(body, status=200, content_type=ctype)
