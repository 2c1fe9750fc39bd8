"""Usage stats (asynch_model_stat): one count per real call to a model
service, by day, tenant, creator and model.  One upsert, no read-back.
``usage`` is the read API: users see their own tenant, admins any."""
from __future__ import annotations

import base64
import binascii
import json
from datetime import date

from sqlalchemy import bindparam, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from app.errors import Forbidden, ValidationFailed
from app.infra.db import transaction
from app.infra.tables import model_stats
from app.jobs.usage_schemas import Usage, UsageQuery, UsageRow
from app.tenancy.keys import Principal


def count_call(conn: Connection, day: date, tenant_id: str, creator: str, model_name: str, n: int = 1) -> None:
    conn.execute(*call_counted(conn, day, tenant_id, creator, model_name, n))


def call_counted(conn: Connection, day: date, tenant_id: str, creator: str, model_name: str,
                 n: int = 1) -> tuple[object, dict]:
    """The count as (statement, params), for a transition to carry along
    (app/transitions.py ``alongside``: one statement with the done write)."""
    return _UPSERT, {"stat_day": day, "stat_tenant": tenant_id, "stat_creator": creator or "",
                                        "stat_model": model_name, "stat_n": n}


def _build_upsert():
    """The count upsert, built once (it runs once per completed job;
    building it per call cost more CPU than the rest of the worker's
    bookkeeping)."""
    # Parameter names no table has as a column: carried along an UPDATE of
    # asynch_task (app/transitions.py), a "tenant_id" parameter would be
    # taken by SQLAlchemy as a value to SET there.
    base = pg_insert(model_stats).values(day=bindparam("stat_day"), tenant_id=bindparam("stat_tenant"),
                                         creator=bindparam("stat_creator"), model_name=bindparam("stat_model"),
                                         request_count=bindparam("stat_n"))
    return base.on_conflict_do_update(
        index_elements=["day", "tenant_id", "creator", "model_name"],
        set_={"request_count": model_stats.c.request_count + base.excluded.request_count},
    )


_UPSERT = _build_upsert()


_ORDER = (model_stats.c.day, model_stats.c.model_name, model_stats.c.tenant_id, model_stats.c.creator)


def _filters(day_from, day_to, tenant_id, model_name) -> list:
    where = []
    if day_from:
        where.append(model_stats.c.day >= day_from)
    if day_to:
        where.append(model_stats.c.day <= day_to)
    if tenant_id:
        where.append(model_stats.c.tenant_id == tenant_id)
    if model_name:
        where.append(model_stats.c.model_name == model_name)
    return where


def read_stats(conn: Connection, *, day_from: date | None = None, day_to: date | None = None,
               tenant_id: str | None = None, model_name: str | None = None,
               after: tuple | None = None, limit: int | None = None) -> list[dict]:
    """Rows in (day, model, tenant, creator) order; ``after``: the key of the
    previous page's last row (keyset pagination), ``limit``: at most this many."""
    q = select(model_stats).where(*_filters(day_from, day_to, tenant_id, model_name))
    if after is not None:
        q = q.where(tuple_(*_ORDER) > tuple_(*after))
    q = q.order_by(*_ORDER)
    if limit is not None:
        q = q.limit(limit)
    return [{"day": r.day, "tenant_id": r.tenant_id, "creator": r.creator,
             "model_name": r.model_name, "request_count": int(r.request_count)} for r in conn.execute(q)]


def _cursor(row: dict) -> str:
    key = [row["day"].isoformat(), row["model_name"], row["tenant_id"], row["creator"]]
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def _after(cursor: str | None) -> tuple | None:
    if not cursor:
        return None
    try:
        day, model, tenant, creator = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not all(isinstance(v, str) and "\x00" not in v for v in (day, model, tenant, creator)):
            raise ValueError
        return (date.fromisoformat(day), model, tenant, creator)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed("invalid query", [{"pointer": "/cursor", "message": "must be a next_cursor "
                                                  "of this listing"}]) from None


def usage(principal: Principal, query: UsageQuery) -> Usage:
    """Counts by day/tenant/creator/model between two days (inclusive).
    Users see their own tenant (another: 403), admins any."""
    tenant = query.tenant
    if not principal.is_admin:
        if tenant and tenant != principal.tenant_id:
            raise Forbidden("admin key required to read another tenant's stats")
        tenant = principal.tenant_id
    after = _after(query.cursor)
    filters = dict(day_from=query.day_from, day_to=query.day_to, tenant_id=tenant or None,
                   model_name=query.model or None)
    with transaction() as conn:
        rows = read_stats(conn, after=after, limit=query.limit + 1, **filters)
        total = conn.execute(select(func.coalesce(func.sum(model_stats.c.request_count), 0))
                             .where(*_filters(**filters))).scalar_one()
    more = len(rows) > query.limit
    rows = rows[:query.limit]
    return Usage.model_construct(day_from=query.day_from, day_to=query.day_to,
                                 rows=[UsageRow.model_construct(**r) for r in rows], total=int(total),
                                 next_cursor=_cursor(rows[-1]) if more else None)
