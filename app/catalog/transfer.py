"""Model configurations as JSON files (``asynch models export|import``).

Export writes every configured field; head_msg is a secret and is left out
unless asked for.  Import creates or updates each model through the same
validation as the API, all in the caller's transaction: one bad entry and
nothing is changed.
"""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Connection

from app.errors import ValidationFailed
from app.infra.tables import models
from app.catalog import registry as model_registry
from app.infra.http.headers import REDACTED, HeaderSpecError, parse_header_spec


def export_models(conn: Connection, names: list[str] | None = None, with_secrets: bool = False) -> list[dict]:
    q = select(models).order_by(models.c.model_name)
    if names:
        q = q.where(models.c.model_name.in_(names))
    out = []
    for row in conn.execute(q):
        d = {k: getattr(row, k) for k in model_registry.FIELDS}
        if not with_secrets:
            d.pop("head_msg")
        out.append(d)
    return out


def _redacted(spec) -> bool:
    try:
        values = parse_header_spec(spec).values() if isinstance(spec, str) else []
    except HeaderSpecError:
        return False
    return bool(values) and all(v == REDACTED for v in values)


def import_models(conn: Connection, data) -> dict:
    """``data``: a list of models or {"models": [...]} (what GET /v1/models answers)."""
    items = data.get("models") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ValidationFailed("invalid models file", [{"pointer": "", "message": "must be a list of models "
                                                        "or an object with a models list"}])
    errs, created, updated = [], [], []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            errs.append({"pointer": f"/{i}", "message": "must be an object"})
            continue
        item = {k: v for k, v in item.items() if k not in ("created_at", "updated_at")}
        if _redacted(item.get("head_msg")):
            errs.append({"pointer": f"/{i}/head_msg", "message": "is redacted (K:***); export with --with-secrets "
                                                                  "or leave head_msg out"})
            continue
        name = item.get("model_name")
        try:
            with conn.begin_nested():
                if isinstance(name, str) and model_registry.get_model_row(conn, name) is not None:
                    model_registry.update_model(conn, name, item)
                    updated.append(name)
                else:
                    model_registry.create_model(conn, item)
                    created.append(name)
        except ValidationFailed as exc:
            errs.extend({"pointer": f"/{i}{e['pointer']}", "message": e["message"]} for e in exc.errors)
    if errs:
        raise ValidationFailed("invalid models file", errs)
    return {"created": created, "updated": updated}
