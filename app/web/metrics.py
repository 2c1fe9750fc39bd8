"""Prometheus endpoints, text format.  No API key; when ASYNCH_METRICS_TOKEN
is set, the scraper must send it as a Bearer token (both paths).

GET /metrics           this API server's counters and histograms (its gunicorn
                       workers summed): scrape every pod, sum in PromQL.
GET /metrics/cluster   gauges read from PostgreSQL and Redis, the same on every
                       pod: scrape once per cluster (docs/operations.md).
"""
from __future__ import annotations

from flask import Blueprint, Response

from app.infra import metrics
from app.observe import cluster
from app.web.contract import Ok, endpoint

bp = Blueprint("metrics", __name__)
_TEXT = Ok({"type": "string"}, "metrics", media_type="text/plain")


@bp.get("/metrics")
@endpoint("This API server's counters and histograms (Prometheus text format)", tag="meta", auth="metrics",
          ok=_TEXT, description="No API key. When ASYNCH_METRICS_TOKEN is set, send it as `Authorization: Bearer "
          "<token>` (401 otherwise). Counters and histograms of the gunicorn processes of the server that answers "
          "(not the cluster's): scrape every API pod and sum in PromQL. Worker nodes serve theirs on "
          "ASYNCH_WORKER_METRICS_PORT.")
def prometheus_metrics():
    return _text(metrics.render())


@bp.get("/metrics/cluster")
@endpoint("The cluster's gauges (Prometheus text format)", tag="meta", auth="metrics", ok=_TEXT,
          description="No API key; ASYNCH_METRICS_TOKEN as for /metrics. Jobs by model and state, the oldest "
          "pending job's age, gate depth and limits, running vs concurrency, runtime overrides, worker liveness: "
          "read from PostgreSQL and Redis at scrape time, the same on every API pod, so scrape it once per "
          "cluster (through the Service), not per pod. `asynch_metrics_source_up` says which source answered.")
def prometheus_cluster_metrics():
    return _text(cluster.render())


def _text(rendered: tuple[bytes, str]) -> Response:
    body, ctype = rendered
    return Response(body, status=200, content_type=ctype)
