"""Operational endpoints, no API key: liveness, readiness, and the Prometheus
text of this server (/metrics) and of the cluster (/metrics/cluster); each
route's description says how to scrape it."""
from __future__ import annotations

from flask import Blueprint, Response
from sqlalchemy import text

from app.infra import metrics
from app.infra.db import get_engine
from app.infra.redis.client import get_redis
from app.observe import cluster
from app.web.contract import Ok, endpoint
from app.web.schemas import Health, Ready

bp = Blueprint("metrics", __name__)
_TEXT = Ok({"type": "string"}, "metrics", media_type="text/plain")


@bp.get("/metrics")
@endpoint("This API server's counters and histograms (Prometheus text format)", tag="meta", auth="metrics",
          ok=_TEXT, description="No API key. When ASYNCH_METRICS_TOKEN is set, send it as `Authorization: Bearer "
          "<token>` (401 otherwise). Counters and histograms of the gunicorn processes of the server that answers "
          "(not the cluster's): scrape every API pod and sum in PromQL. Worker nodes serve theirs on "
          "ASYNCH_WORKER_METRICS_PORT.")
def prometheus_metrics():
    body, ctype = metrics.render()
    return Response(body, status=200, content_type=ctype)


@bp.get("/metrics/cluster")
@endpoint("The cluster's gauges (Prometheus text format)", tag="meta", auth="metrics", ok=_TEXT,
          description="No API key; ASYNCH_METRICS_TOKEN as for /metrics. Jobs by model and state, the oldest "
          "pending job's age, gate depth and limits, running vs concurrency, runtime overrides, worker liveness: "
          "read from PostgreSQL and Redis at scrape time, the same on every API pod, so scrape it once per "
          "cluster (through the Service), not per pod. `asynch_metrics_source_up` says which source answered.")
def prometheus_cluster_metrics():
    body, ctype = cluster.render()
    return Response(body, status=200, content_type=ctype)


@bp.get("/healthz")
@endpoint("Liveness: the process answers", tag="health", auth="none", ok=Ok(Health, "alive"))
def healthz():
    return Health(status="ok")


@bp.get("/readyz")
@endpoint("Readiness: PostgreSQL and Redis answer", tag="health", auth="none",
          ok={200: Ok(Ready, "ready"), 503: Ok(Ready, "a dependency is down")})
def readyz():
    checks = {}
    try:
        with get_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        get_redis().ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}"
    if all(v == "ok" for v in checks.values()):
        return Ready(status="ok", checks=checks)
    return Ready(status="unavailable", checks=checks, error="not ready"), 503
