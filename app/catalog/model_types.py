"""Model types (table asynch_models_type): the ids a model's ``models_type``
comma list refers to (seed 002).  A type in use by a model cannot be
deleted; without a type_id a new type takes the next free id.  Each public
function is its own unit of work (see app/catalog/registry.py)."""
from __future__ import annotations

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from app.catalog.schemas import MAX_TYPE_ID, ModelTypeInput, ModelTypePatch
from app.clock import now as clock_now
from app.errors import Conflict, NotFound, ValidationFailed
from app.infra.db import transaction
from app.infra.tables import model_types, models


def create_type(spec: ModelTypeInput) -> Row:
    """Without a type_id the next free id is taken (max + 1)."""
    values = spec.values()
    given = values.get("type_id") is not None
    for _ in range(5):
        with transaction() as conn:
            if not given:
                values["type_id"] = _free_id(conn)
            try:
                with conn.begin_nested():
                    return conn.execute(insert(model_types).values(created_at=clock_now(), **values)
                                        .returning(*model_types.c)).one()
            except IntegrityError:
                if given:
                    raise Conflict(f"model type already exists: {values['type_id']}") from None
    raise Conflict("could not allocate a model type id; retry")


def _free_id(conn: Connection) -> int:
    """max + 1; once that would not fit the column, the lowest free id."""
    top = conn.execute(select(func.coalesce(func.max(model_types.c.type_id), 0))).scalar_one()
    if top < MAX_TYPE_ID:
        return top + 1
    t, u = model_types.alias("t"), model_types.alias("u")
    gap = conn.execute(select(func.min(t.c.type_id + 1)).select_from(
        t.outerjoin(u, u.c.type_id == t.c.type_id + 1)).where(u.c.type_id.is_(None), t.c.type_id < MAX_TYPE_ID)
    ).scalar()
    if conn.execute(select(model_types.c.type_id).where(model_types.c.type_id == 1)).first() is None:
        return 1
    if gap is None:
        raise Conflict("no free model type id")
    return gap


def update_type(type_id: int, change: ModelTypePatch) -> Row:
    values = change.values(only_given=True)
    if (given := values.pop("type_id", None)) is not None and given != type_id:
        raise ValidationFailed("invalid model type", [{"pointer": "/type_id", "message": "cannot be changed"}])
    with transaction() as conn:
        q = update(model_types).values(**values).returning(*model_types.c) if values else select(model_types)
        row = conn.execute(q.where(model_types.c.type_id == type_id)).first()
    if row is None:
        raise NotFound(f"model type not found: {type_id}")
    return row


def list_types() -> list[Row]:
    with transaction() as conn:
        return list(conn.execute(select(model_types).order_by(model_types.c.type_id)).all())


def delete_type(type_id: int) -> None:
    with transaction() as conn:
        # Lock the type first so a model saved concurrently either sees it gone or blocks us.
        if conn.execute(select(model_types.c.type_id).where(model_types.c.type_id == type_id)
                        .with_for_update()).first() is None:
            raise NotFound(f"model type not found: {type_id}")
        # models_type is a short comma list on a small table: parse it here.
        rows = conn.execute(select(models.c.model_name, models.c.models_type).where(models.c.models_type != ""))
        if users := [r.model_name for r in rows if str(type_id) in r.models_type.split(",")]:
            raise Conflict(f"model type {type_id} is used by: {', '.join(sorted(users))}")
        conn.execute(delete(model_types).where(model_types.c.type_id == type_id))


def unknown_ids(conn: Connection, ids: list[int]) -> list[int]:
    """Ids of ``ids`` that are not model types (locks the known ones against
    a concurrent delete until the caller commits)."""
    storable = [i for i in ids if 1 <= i <= MAX_TYPE_ID]
    if not storable:
        return list(ids)
    known = {r.type_id for r in conn.execute(select(model_types.c.type_id)
                                             .where(model_types.c.type_id.in_(storable)).with_for_update(read=True))}
    return [i for i in ids if i not in known]
