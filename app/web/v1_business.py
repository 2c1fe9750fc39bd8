"""v1 routes for the seed-002 features: usage stats, model types, a job's
callback delivery log, and the tenants' callback signing secrets."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from app.web.auth import current_principal, require_admin, require_key
from app.web.body import json_object
from app.infra.db import transaction
from app.errors import Forbidden, NotFound
from app.callbacks import secrets as callback_secrets
from app.callbacks import delivery as callbacks
from app.jobs import service as jobs
from app.catalog import model_types
from app.jobs import stats

bp = Blueprint("v1_business", __name__, url_prefix="/v1")


@bp.get("/stats")
@require_key
def usage():
    a = request.args
    return jsonify(stats.usage(current_principal(), day_from=a.get("from"), day_to=a.get("to"),
                               tenant=a.get("tenant"), model=a.get("model")))


@bp.get("/model-types")
@require_key
def list_types():
    with transaction() as conn:
        return jsonify({"model_types": model_types.list_types(conn)})


@bp.post("/model-types")
@require_admin
def create_type():
    with transaction() as conn:
        return jsonify(model_types.create_type(conn, json_object())), 201


@bp.route("/model-types/<int:type_id>", methods=["PUT", "PATCH"])
@require_admin
def update_type(type_id: int):
    with transaction() as conn:
        return jsonify(model_types.update_type(conn, type_id, json_object()))


@bp.delete("/model-types/<int:type_id>")
@require_admin
def delete_type(type_id: int):
    with transaction() as conn:
        model_types.delete_type(conn, type_id)
    return "", 204


@bp.get("/jobs/<job_id>/callback")
@require_key
def job_callback(job_id: str):
    principal = current_principal()
    jobs.get_job(principal, job_id)  # 404 for unknown and other tenants' jobs
    view = callbacks.delivery_view(principal, job_id)
    if view is None:
        raise NotFound(f"no callback for job: {job_id}")
    return jsonify(view)


def _own_or_admin(tenant: str) -> None:
    p = current_principal()
    if not p.is_admin and p.tenant_id != tenant:
        raise Forbidden("admin key required")


@bp.get("/tenants/<tenant>/callback-secret")
@require_key
def read_secret(tenant: str):
    _own_or_admin(tenant)
    with transaction() as conn:
        return jsonify(callback_secrets.tenant_secret(conn, tenant))


@bp.post("/tenants/<tenant>/callback-secret/rotate")
@require_admin
def rotate_secret(tenant: str):
    with transaction() as conn:
        return jsonify(callback_secrets.rotate_secret(conn, tenant))
