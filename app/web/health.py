"""Liveness (/healthz, no auth, no dependencies) and readiness (/readyz:
the database and Redis answer)."""
from __future__ import annotations

from flask import Blueprint, jsonify
from sqlalchemy import text

from app.infra.db import get_engine
from app.infra.redis_scripts import get_redis

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


@bp.get("/readyz")
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
    ok = all(v == "ok" for v in checks.values())
    body = {"status": "ok" if ok else "unavailable", "checks": checks}
    if not ok:
        body["error"] = "not ready"
    return jsonify(body), (200 if ok else 503)
