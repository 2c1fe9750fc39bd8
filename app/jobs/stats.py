"""Usage stats (asynch_model_stat): one count per real call to a model
service, by day, tenant, creator and model.  One upsert, no read-back.
``usage`` is the read API: users see their own tenant, admins any."""
from __future__ import annotations

from datetime import date

from sqlalchemy import bindparam, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from app.errors import Forbidden
from app.infra.db import transaction
from app.infra.tables import model_stats
from app.jobs.usage_schemas import Usage, UsageQuery, UsageRow
from app.tenancy.keys import Principal


def count_call(conn: Connection, day: date, tenant_id: str, creator: str, model_name: str, n: int = 1) -> None:
    conn.execute(_upsert(conn.dialect.name), {"day": day, "tenant_id": tenant_id, "creator": creator or "",
                                               "model_name": model_name, "n": n})


_UPSERTS: dict[str, object] = {}


def _upsert(dialect: str):
    """The count upsert, built once per dialect (it runs once per completed
    job; building it per call cost more CPU than the rest of the worker's
    bookkeeping)."""
    stmt = _UPSERTS.get(dialect)
    if stmt is None:
        ins = pg_insert if dialect == "postgresql" else sqlite_insert
        base = ins(model_stats).values(day=bindparam("day"), tenant_id=bindparam("tenant_id"),
                                       creator=bindparam("creator"), model_name=bindparam("model_name"),
                                       request_count=bindparam("n"))
        stmt = _UPSERTS[dialect] = base.on_conflict_do_update(
            index_elements=["day", "tenant_id", "creator", "model_name"],
            set_={"request_count": model_stats.c.request_count + base.excluded.request_count},
        )
    return stmt


def read_stats(conn: Connection, *, day_from: date | None = None, day_to: date | None = None,
               tenant_id: str | None = None, model_name: str | None = None) -> list[dict]:
    q = select(model_stats)
    if day_from:
        q = q.where(model_stats.c.day >= day_from)
    if day_to:
        q = q.where(model_stats.c.day <= day_to)
    if tenant_id:
        q = q.where(model_stats.c.tenant_id == tenant_id)
    if model_name:
        q = q.where(model_stats.c.model_name == model_name)
    q = q.order_by(model_stats.c.day, model_stats.c.model_name, model_stats.c.tenant_id, model_stats.c.creator)
    return [{"day": r.day, "tenant_id": r.tenant_id, "creator": r.creator,
             "model_name": r.model_name, "request_count": int(r.request_count)} for r in conn.execute(q)]


def usage(principal: Principal, query: UsageQuery) -> Usage:
    """Counts by day/tenant/creator/model between two days (inclusive).
    Users see their own tenant (another: 403), admins any."""
    tenant = query.tenant
    if not principal.is_admin:
        if tenant and tenant != principal.tenant_id:
            raise Forbidden("admin key required to read another tenant's stats")
        tenant = principal.tenant_id
    with transaction() as conn:
        rows = read_stats(conn, day_from=query.day_from, day_to=query.day_to, tenant_id=tenant or None,
                          model_name=query.model or None)
    return Usage.model_construct(day_from=query.day_from, day_to=query.day_to,
                                 rows=[UsageRow.model_construct(**r) for r in rows],
                                 total=sum(r["request_count"] for r in rows))
