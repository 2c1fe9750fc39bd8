"""v1 administration: models (read for every key, write for admins) and
API keys (admins)."""
from __future__ import annotations

from flask import Blueprint

from app.catalog import registry
from app.catalog.schemas import ModelInput, ModelList, ModelPatch, model_view
from app.tenancy import keys
from app.tenancy.schemas import (
    ApiKeyCreated,
    ApiKeyInput,
    ApiKeyList,
    ApiKeyView,
    KeysQuery,
)
from app.web.auth import current_principal
from app.web.contract import Ok, endpoint

bp = Blueprint("v1_admin", __name__, url_prefix="/v1")

_NAME = {"name": {"description": "model_name"}}


@bp.get("/models")
@endpoint("List models (users: enabled ones, fewer fields)", tag="models", ok=Ok(ModelList, "models"))
def list_models():
    p = current_principal()
    return ModelList.model_construct(models=[model_view(r, p.is_admin) for r in registry.visible_models(p)])


@bp.post("/models")
@endpoint("Create a model", tag="models", auth="admin", body=ModelInput, errors=(409,),
          ok={201: Ok(model_view.admin, "created")})
def create_model(body: ModelInput):
    return model_view(registry.create_model(body), True), 201


@bp.get("/models/<name>")
@endpoint("A model (users: enabled ones, fewer fields)", tag="models", path=_NAME,
          ok=Ok(model_view.any, "the model"))
def get_model(name: str):
    p = current_principal()
    return model_view(registry.get_model(p, name), p.is_admin)


@bp.route("/models/<name>", methods=["PUT", "PATCH"])
@endpoint("Update a model (only the fields given change)", tag="models", auth="admin", body=ModelPatch,
          path=_NAME, ok=Ok(model_view.admin, "updated"))
def update_model(name: str, body: ModelPatch):
    return model_view(registry.update_model(name, body), True)


@bp.delete("/models/<name>")
@endpoint("Delete a model (409 while it has active jobs)", tag="models", auth="admin", errors=(409,), path=_NAME,
          ok={204: Ok(description="deleted")})
def delete_model(name: str):
    registry.delete_model(name)
    return None, 204


@bp.post("/keys")
@endpoint("Create an API key; the key is shown once", tag="keys", auth="admin", body=ApiKeyInput,
          ok={201: Ok(ApiKeyCreated, "created")})
def create_key(body: ApiKeyInput):
    key, row = keys.create_key(body.tenant, body.effective_role, body.name)
    return ApiKeyCreated.model_construct(**ApiKeyView.values(row), key=key), 201


@bp.get("/keys")
@endpoint("List API keys (never the secrets)", tag="keys", auth="admin", query=KeysQuery, ok=Ok(ApiKeyList, "keys"))
def list_keys(query: KeysQuery):
    return ApiKeyList.model_construct(keys=[ApiKeyView.from_row(r) for r in keys.list_keys(query.tenant)])


@bp.delete("/keys/<int:key_id>")
@endpoint("Revoke an API key", tag="keys", auth="admin", ok=Ok(ApiKeyView, "revoked"))
def revoke_key(key_id: int):
    return ApiKeyView.from_row(keys.revoke_key(key_id))
