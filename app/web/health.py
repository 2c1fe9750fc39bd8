"""Liveness (/healthz, no auth, no dependencies) and readiness (/readyz:
the database and Redis answer)."""
from __future__ import annotations

from flask import Blueprint
from sqlalchemy import text

from app.infra.db import get_engine
from app.infra.redis.client import get_redis
from app.web.contract import Ok, endpoint
from app.web.schemas import Health, Ready

bp = Blueprint("health", __name__)


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
