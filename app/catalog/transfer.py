"""Model configurations as JSON files (``asynch models export|import``).
head_msg, a secret, is exported only when asked for.  Import goes through
the API's declaration (app/catalog/schemas.py), in one transaction: one bad
entry and nothing changes.
"""
from __future__ import annotations

from sqlalchemy import select

from app.catalog import registry
from app.catalog.schemas import ModelInput, ModelPatch
from app.contract import parse
from app.errors import ValidationFailed
from app.infra import secretbox
from app.infra.db import transaction
from app.infra.http.headers import REDACTED, HeaderSpecError, parse_header_spec
from app.infra.tables import models

FIELDS = tuple(n for n in ModelInput.model_fields if n not in ("created_at", "updated_at"))


def export_models(names: list[str] | None = None, with_secrets: bool = False) -> list[dict]:
    q = select(models).order_by(models.c.model_name)
    if names:
        q = q.where(models.c.model_name.in_(names))
    with transaction() as conn:
        return [{k: secretbox.decrypt(row.head_msg) if k == "head_msg" else getattr(row, k)
                 for k in FIELDS if _exported(row, k, with_secrets)} for row in conn.execute(q)]


def _exported(row, field: str, with_secrets: bool) -> bool:
    if field == "head_msg":
        return with_secrets
    # Never set (NULL): left out, so the imported model follows its own deployment's default too.
    return field != "model_key_headers" or row.model_key_headers is not None


def _redacted(spec) -> bool:
    try:
        values = parse_header_spec(spec).values() if isinstance(spec, str) else []
    except HeaderSpecError:
        return False
    return bool(values) and all(v == REDACTED for v in values)


def import_models(data) -> dict:
    """``data``: a list of models or {"models": [...]} (what GET /v1/models answers)."""
    items = data.get("models") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ValidationFailed("invalid models file", [{"pointer": "", "message": "must be a list of models "
                                                        "or an object with a models list"}])
    errs, created, updated = [], [], []
    with transaction() as conn:
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                errs.append({"pointer": f"/{i}", "message": "must be an object"})
                continue
            if _redacted(item.get("head_msg")):
                errs.append({"pointer": f"/{i}/head_msg", "message": "is redacted (K:***); export with "
                                                                      "--with-secrets or leave head_msg out"})
                continue
            name = item.get("model_name")
            try:
                with conn.begin_nested():
                    if isinstance(name, str) and registry._row(conn, name) is not None:
                        registry._update(conn, name, parse(ModelPatch, item))
                        updated.append(name)
                    else:
                        registry._create(conn, parse(ModelInput, item))
                        created.append(name)
            except ValidationFailed as exc:
                errs.extend({"pointer": f"/{i}{e['pointer']}", "message": e["message"]} for e in exc.errors)
        if errs:
            raise ValidationFailed("invalid models file", errs)
    for name in created + updated:
        registry._invalidate(name)
    return {"created": created, "updated": updated}
