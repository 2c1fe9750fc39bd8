"""Usage stats (asynch_model_stat): one count per real call to a model
service, by day, tenant, creator and model.  One upsert, no read-back.
``usage`` is the read API: users see their own tenant, admins any; its
query and answer are declared here too."""
from __future__ import annotations

import base64
import binascii
import json
from collections import Counter
from datetime import date
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError
from sqlalchemy import Date, Integer, String, bindparam, cast, func, select, tuple_
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from app.contract import Day, Int, Params, Shape, Text, rule
from app.errors import Forbidden, ValidationFailed
from app.infra.db import transaction
from app.infra.tables import model_stats
from app.tenancy.keys import Principal


def _day(v: Any) -> Any:
    if v is None or v == "":
        return None
    try:
        return date.fromisoformat(v)
    except (TypeError, ValueError):
        raise PydanticCustomError("day", "must be a date YYYY-MM-DD") from None


QueryDay = Annotated[date | None, BeforeValidator(_day), WithJsonSchema(
    {"anyOf": [{"type": "string", "format": "date"}, {"const": ""}]})]


class UsageQuery(Params):
    day_from: QueryDay = Field(None, alias="from", description="first day (inclusive), YYYY-MM-DD")
    day_to: QueryDay = Field(None, alias="to", description="last day (inclusive), YYYY-MM-DD")
    tenant: Text | None = Field(None, description="users: only their own (another: 403)")
    model: Text | None = None
    # Pages in (day, model, tenant, creator) order; ``total`` stays the whole filter's sum.
    limit: Int(1, 10000, query=True) = rule("from 1 to 10000", 1000)
    cursor: Text | None = Field(None, description="next_cursor of the previous page")

    @field_validator("day_to")
    @classmethod
    def _ordered(cls, v: date | None, info) -> date | None:
        start = info.data.get("day_from")
        if v and start and start > v:
            raise PydanticCustomError("order", "must not be before from")
        return v


class UsageRow(Shape):
    model_config = {"alias_generator": None}

    day: Day
    tenant_id: str
    creator: str
    model_name: str
    request_count: int = Field(ge=0)


class Usage(Shape):
    model_config = {"alias_generator": None, "serialize_by_alias": True}

    day_from: Day | None = Field(alias="from")
    day_to: Day | None = Field(alias="to")
    rows: list[UsageRow]
    total: int = Field(ge=0, description="request_count summed over every row the filter matches (all pages)")
    next_cursor: str | None = Field(None, description="pass as cursor for the next page; null on the last")


def call_counted(conn: Connection, day: date, tenant_id: str, creator: str, model_name: str,
                 n: int = 1) -> tuple[object, dict]:
    """The count as (statement, params), for a transition to carry along
    (app/transitions.py ``alongside``: one statement with the done write)."""
    return calls_counted(conn, day, Counter({(tenant_id, creator, model_name): n}))


def calls_counted(conn: Connection, day: date, counts: Counter) -> tuple[object, dict]:
    """A group's calls, ``counts`` by (tenant, creator, model), as ONE upsert (statement, params): one
    row per key, so no row is updated twice by the statement.  The rows in one order for every writer (sorted
    keys): two processes' done statements counting the same tenants in opposite orders deadlocked."""
    keys = sorted(counts, key=lambda k: (k[0], k[1] or "", k[2]))
    return _UPSERT, {"stat_day": day, "stat_tenant": [k[0] for k in keys], "stat_creator": [k[1] or "" for k in keys],
                     "stat_model": [k[2] for k in keys], "stat_n": [counts[k] for k in keys]}


# Built once: it runs once per group of completed jobs, and building it per call cost
# more CPU than the rest of the worker's bookkeeping.  Parameter names no
# table has as a column: carried along an UPDATE of asynch_task, a
# "tenant_id" parameter would be taken by SQLAlchemy as a value to SET there.
_ROWS = func.unnest(*[cast(bindparam(f"stat_{n}"), ARRAY(t)) for n, t in (
    ("tenant", String), ("creator", String), ("model", String), ("n", Integer))]).table_valued(
    "tenant", "creator", "model", "n").render_derived(name="s")
_INSERT = pg_insert(model_stats).from_select(
    ["day", "tenant_id", "creator", "model_name", "request_count"],
    select(cast(bindparam("stat_day"), Date), _ROWS.c.tenant, _ROWS.c.creator, _ROWS.c.model, _ROWS.c.n))
_UPSERT = _INSERT.on_conflict_do_update(index_elements=["day", "tenant_id", "creator", "model_name"], set_={
    "request_count": model_stats.c.request_count + _INSERT.excluded.request_count})
_ORDER = (model_stats.c.day, model_stats.c.model_name, model_stats.c.tenant_id, model_stats.c.creator)


def _cursor(row) -> str:
    key = [row.day.isoformat(), row.model_name, row.tenant_id, row.creator]
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
    """Counts by day/tenant/creator/model between two days (inclusive), in
    pages.  Users see their own tenant (another: 403), admins any."""
    tenant = query.tenant
    if not principal.is_admin:
        if tenant and tenant != principal.tenant_id:
            raise Forbidden("admin key required to read another tenant's stats")
        tenant = principal.tenant_id
    after = _after(query.cursor)
    c, where = model_stats.c, []
    if query.day_from:
        where.append(c.day >= query.day_from)
    if query.day_to:
        where.append(c.day <= query.day_to)
    if tenant:
        where.append(c.tenant_id == tenant)
    if query.model:
        where.append(c.model_name == query.model)
    page = select(model_stats).where(*where)
    if after is not None:
        page = page.where(tuple_(*_ORDER) > tuple_(*after))
    with transaction() as conn:
        rows = conn.execute(page.order_by(*_ORDER).limit(query.limit + 1)).all()
        total = conn.execute(select(func.coalesce(func.sum(c.request_count), 0)).where(*where)).scalar_one()
    more, rows = len(rows) > query.limit, rows[:query.limit]
    return Usage.model_construct(day_from=query.day_from, day_to=query.day_to, total=int(total),  # sum(): numeric
                                 rows=[UsageRow.model_construct(**{k: getattr(r, k) for k in UsageRow.model_fields})
                                       for r in rows], next_cursor=_cursor(rows[-1]) if more else None)
