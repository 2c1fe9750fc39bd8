"""Model types (table asynch_models_type): the ids a model's ``models_type``
comma list refers to (seed 002).  A type in use by a model cannot be deleted."""
from __future__ import annotations

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.clock import now as clock_now
from app.errors import Conflict, NotFound, ValidationFailed
from app.infra.tables import model_types, models
from app.catalog.values import as_int

FIELDS = ("type_id", "type_name", "remark")


MAX_TYPE_ID = 2**31 - 1  # the column is an INTEGER


def _check(data: dict, partial: bool) -> dict:
    if not isinstance(data, dict):
        raise ValidationFailed("model type must be a JSON object", [{"pointer": "", "message": "must be an object"}])
    errs, clean = [], {}
    for k in sorted(set(data) - set(FIELDS)):
        errs.append({"pointer": "/" + k, "message": "unknown field"})
    if "type_id" in data and data["type_id"] is not None:
        v = as_int(data["type_id"])
        if v is None or not 1 <= v <= MAX_TYPE_ID:
            errs.append({"pointer": "/type_id", "message": f"must be an integer from 1 to {MAX_TYPE_ID}"})
        else:
            clean["type_id"] = v
    if "type_name" in data or not partial:
        v = data.get("type_name")
        if not isinstance(v, str) or not v.strip() or len(v) > 128 or any(ord(c) < 0x20 for c in v):
            errs.append({"pointer": "/type_name", "message": "is required: 1-128 characters"})
        else:
            clean["type_name"] = v.strip()
    if "remark" in data:
        v = data["remark"] if data["remark"] is not None else ""
        if not isinstance(v, str) or len(v) > 4000:
            errs.append({"pointer": "/remark", "message": "must be a string of at most 4000 characters"})
        else:
            clean["remark"] = v
    if errs:
        raise ValidationFailed("invalid model type", errs)
    return clean


def view(row) -> dict:
    return {"type_id": row.type_id, "type_name": row.type_name, "remark": row.remark,
            "created_at": row.created_at.isoformat() if row.created_at else None}


def create_type(conn: Connection, data: dict) -> dict:
    """Without a type_id the next free id is taken (max + 1)."""
    clean = _check(data, partial=False)
    clean.setdefault("remark", "")
    given = "type_id" in clean
    for _ in range(5):
        if not given:
            clean["type_id"] = _free_id(conn)
        try:
            with conn.begin_nested():
                row = conn.execute(insert(model_types).values(created_at=clock_now(), **clean)
                                   .returning(*model_types.c)).one()
            return view(row)
        except IntegrityError:
            if given:
                raise Conflict(f"model type already exists: {clean['type_id']}")
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


def update_type(conn: Connection, type_id, data: dict) -> dict:
    type_id = as_int(type_id)
    if type_id is None:
        raise ValidationFailed("invalid model type", [{"pointer": "/type_id", "message": "must be an integer"}])
    data = dict(data)
    given = data.pop("type_id", None)
    if given is not None and as_int(given) != type_id:
        raise ValidationFailed("invalid model type", [{"pointer": "/type_id", "message": "cannot be changed"}])
    clean = _check(data, partial=True)
    if not clean:
        row = conn.execute(select(model_types).where(model_types.c.type_id == type_id)).first()
    else:
        row = conn.execute(update(model_types).where(model_types.c.type_id == type_id).values(**clean)
                           .returning(*model_types.c)).first()
    if row is None:
        raise NotFound(f"model type not found: {type_id}")
    return view(row)


def list_types(conn: Connection) -> list[dict]:
    return [view(r) for r in conn.execute(select(model_types).order_by(model_types.c.type_id))]


def _users_of(conn: Connection, type_id: int) -> list[str]:
    # models_type is a short comma list on a small table: parse it here.
    rows = conn.execute(select(models.c.model_name, models.c.models_type).where(models.c.models_type != ""))
    return [r.model_name for r in rows if str(type_id) in r.models_type.split(",")]


def delete_type(conn: Connection, type_id) -> None:
    type_id = as_int(type_id)
    if type_id is None:
        raise ValidationFailed("invalid model type", [{"pointer": "/type_id", "message": "must be an integer"}])
    # Lock the type first so a model saved concurrently either sees it gone or blocks us.
    if conn.execute(select(model_types.c.type_id).where(model_types.c.type_id == type_id)
                    .with_for_update()).first() is None:
        raise NotFound(f"model type not found: {type_id}")
    users = _users_of(conn, type_id)
    if users:
        raise Conflict(f"model type {type_id} is used by: {', '.join(sorted(users))}")
    conn.execute(delete(model_types).where(model_types.c.type_id == type_id))


def unknown_ids(conn: Connection, ids: list[int]) -> list[int]:
    """Ids of ``ids`` that are not model types (locks the known ones against
    a concurrent delete until the caller commits)."""
    storable = [i for i in ids if 1 <= i <= 2**31 - 1]
    if not storable:
        return list(ids)
    known = {r.type_id for r in conn.execute(select(model_types.c.type_id)
                                             .where(model_types.c.type_id.in_(storable)).with_for_update(read=True))}
    return [i for i in ids if i not in known]
