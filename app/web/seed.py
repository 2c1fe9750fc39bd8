"""The seed-002 routes (seeds/002: model-asynch's README) over the same
service layer as v1: camelCase fields mapped at the edge (app/api/seed_fields.py),
answers in the envelope {"code": 0, "message": "ok", "data": ...}; errors are
enveloped by app/api/errors.py.  Same Bearer API keys; model and model-type
writes need an admin key."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from app.web import job_context
from app.web.auth import current_principal, require_admin, require_key
from app.web.body import json_object, parse_json
from app.web.seed_fields import to_camel, to_snake
from app.infra.db import transaction
from app.errors import NotFound, ValidationFailed
from app.jobs import claims
from app.jobs import service as jobs
from app.catalog import registry as model_registry
from app.catalog import model_types
from app.jobs import stats
from app.jobs.service import SubmitOptions

bp = Blueprint("seed", __name__)


def ok(data):
    return jsonify({"code": 0, "message": "ok", "data": data})


def _model_view(m: dict) -> dict:
    m = to_camel(model_registry.view_for(m, current_principal().is_admin))
    m["enabled"] = 1 if m["enabled"] else 0  # the seed's 0/1
    return m


def _required_str(value, pointer: str, errs: list) -> str | None:
    if not isinstance(value, str) or not value:
        errs.append({"pointer": pointer, "message": "is required: a non-empty string"})
        return None
    return value


def _optional_str(body: dict, name: str, errs: list) -> str | None:
    v = body.get(name)
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        errs.append({"pointer": "/" + name, "message": "must be a string"})
        return None
    return v


def _arg(name: str) -> str:
    v = request.args.get(name)
    if not v:
        raise ValidationFailed("invalid query", [{"pointer": "/" + name, "message": "is required"}])
    return v


# --- models -------------------------------------------------------------------------

@bp.post("/model/createModel")
@require_admin
def create_model():
    with transaction() as conn:
        return ok(_model_view(model_registry.create_model(conn, to_snake(json_object()))))


@bp.post("/model/updateModel")
@require_admin
def update_model():
    data = to_snake(json_object())
    errs: list = []
    name = _required_str(data.pop("model_name", None), "/model_name", errs)
    if errs:
        raise ValidationFailed("invalid model configuration", errs)
    with transaction() as conn:
        return ok(_model_view(model_registry.update_model(conn, name, data)))


@bp.get("/model/getModel")
@require_key
def get_model():
    name = _arg("modelName")
    with transaction() as conn:
        m = model_registry.get_model(conn, name)
    if not current_principal().is_admin and not m["enabled"]:
        raise NotFound(f"model not found: {name}")
    return ok(_model_view(m))


@bp.get("/model/listModel")
@require_key
def list_models():
    with transaction() as conn:
        items = model_registry.visible_models(conn, current_principal())
    return ok([_model_view(m) for m in items])


@bp.post("/model/deleteModel")
@require_admin
def delete_model():
    errs: list = []
    name = _required_str(json_object().get("modelName"), "/model_name", errs)
    if errs:
        raise ValidationFailed("invalid request", errs)
    with transaction() as conn:
        model_registry.delete_model(conn, name)
    return ok({"modelName": name})


# --- model types --------------------------------------------------------------------

@bp.post("/modelType/create")
@require_admin
def create_type():
    with transaction() as conn:
        return ok(to_camel(model_types.create_type(conn, to_snake(json_object()))))


@bp.post("/modelType/update")
@require_admin
def update_type():
    data = to_snake(json_object())
    with transaction() as conn:
        return ok(to_camel(model_types.update_type(conn, data.get("type_id"), data)))


@bp.get("/modelType/list")
@require_key
def list_types():
    with transaction() as conn:
        return ok([to_camel(t) for t in model_types.list_types(conn)])


@bp.post("/modelType/delete")
@require_admin
def delete_type():
    type_id = json_object().get("typeId")
    with transaction() as conn:
        model_types.delete_type(conn, type_id)
    return ok({"typeId": type_id})


# --- tasks --------------------------------------------------------------------------

def _payload(body: dict, errs: list):
    """requestPayload: a JSON object (or a string holding one)."""
    v = body.get("requestPayload", {})
    if isinstance(v, str):
        try:
            v = parse_json(v)
        except ValueError:
            v = None
    if not isinstance(v, dict):
        errs.append({"pointer": "/requestPayload", "message": "must be a JSON object"})
        return None
    return v


@bp.post("/task/createTask")
@require_key
def create_task():
    body = json_object(nul_allowed=("/requestPayload",))
    errs: list = []
    model = _required_str(body.get("modelName"), "/modelName", errs)
    payload = _payload(body, errs)
    biz = _optional_str(body, "bizName", errs) or ""
    callback_url = _optional_str(body, "callbackUrl", errs)
    model_key = _optional_str(body, "modelKey", errs)
    creator = _optional_str(body, "creator", errs)
    if errs:
        raise ValidationFailed("invalid task", errs)
    opts = SubmitOptions(idempotency_key=request.headers.get("Idempotency-Key"), creator=job_context.creator(creator),
                         biz_name=biz, callback_url=callback_url, model_key=model_key,
                         passthrough=job_context.passthrough(), pointer_base="/requestPayload")
    out = jobs.submit(current_principal(), model, payload, opts)
    return ok({"task_id": out.row.id})


@bp.post("/task/getTaskBatch")
@require_key
def get_task_batch():
    body = to_snake(json_object())
    if "task_ids" not in body:
        raise ValidationFailed("invalid task ids", [{"pointer": "/task_ids", "message": "is required"}])
    return ok(claims.get_task_batch(current_principal(), body["task_ids"]))


@bp.get("/task/getTaskResult")
@require_key
def get_task_result():
    task_id = _arg("taskId")
    return ok(claims.task_view(jobs.get_job(current_principal(), task_id)))


# --- stats --------------------------------------------------------------------------

@bp.get("/stat/getModelStat")
@require_key
def model_stat():
    a = request.args
    return ok(stats.usage(current_principal(), day_from=a.get("from"), day_to=a.get("to"),
                          tenant=a.get("tenant"), model=a.get("model")))
