"""v1 administration: models (read for every key, write for admins) and
API keys (admins)."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from app.web.auth import current_principal, require_admin, require_key
from app.web.body import json_object
from app.infra.db import transaction
from app.errors import NotFound, ValidationFailed
from app.tenancy import keys
from app.catalog import registry as model_registry

bp = Blueprint("v1_admin", __name__, url_prefix="/v1")

def _for_caller(m: dict) -> dict:
    return model_registry.view_for(m, current_principal().is_admin)


@bp.get("/models")
@require_key
def list_models():
    with transaction() as conn:
        items = model_registry.visible_models(conn, current_principal())
    return jsonify({"models": [_for_caller(m) for m in items]})


@bp.post("/models")
@require_admin
def create_model():
    with transaction() as conn:
        m = model_registry.create_model(conn, json_object())
    return jsonify(m), 201


@bp.get("/models/<name>")
@require_key
def get_model(name: str):
    with transaction() as conn:
        m = model_registry.get_model(conn, name)
    if not current_principal().is_admin and not m["enabled"]:
        raise NotFound(f"model not found: {name}")
    return jsonify(_for_caller(m))


@bp.route("/models/<name>", methods=["PUT", "PATCH"])
@require_admin
def update_model(name: str):
    with transaction() as conn:
        m = model_registry.update_model(conn, name, json_object())
    return jsonify(m)


@bp.delete("/models/<name>")
@require_admin
def delete_model(name: str):
    with transaction() as conn:
        model_registry.delete_model(conn, name)
    return "", 204


@bp.post("/keys")
@require_admin
def create_key():
    body = json_object()
    if body.get("admin") is not None and not isinstance(body["admin"], bool):
        raise ValidationFailed("invalid API key request", [{"pointer": "/admin", "message": "must be true or false"}])
    role = "admin" if body.get("admin") is True else body.get("role", "user")
    with transaction() as conn:
        key, view = keys.create_key(conn, body.get("tenant"), role, body.get("name", ""))
    return jsonify({**view, "key": key}), 201


@bp.get("/keys")
@require_admin
def list_keys():
    with transaction() as conn:
        return jsonify({"keys": keys.list_keys(conn, request.args.get("tenant"))})


@bp.delete("/keys/<int:key_id>")
@require_admin
def revoke_key(key_id: int):
    with transaction() as conn:
        return jsonify(keys.revoke_key(conn, key_id))
