"""Model configurations (table asynch_models): create, change, read, delete.

Each public function is a unit of work that raises domain errors; the
``_``-prefixed ones take a connection, so an import does many in one
transaction (app/catalog/transfer.py).  Rules that live here only: a
disabled model does not exist for users' reads (404 "model not found") and
takes no submission (404 "model disabled"), a name cannot change,
models_type ids must exist, a model with active jobs cannot be deleted, a
redacted head_msg sent back keeps the stored secret, head_msg is stored
encrypted.  Writers drop the per-process cache of model rows (admission
reads through it) and tell the other processes to.
"""
from __future__ import annotations

from contextlib import suppress

import redis
from cachetools import TTLCache
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from app.catalog.model_types import unknown_ids
from app.catalog.schemas import ModelInput, ModelPatch
from app.clock import now as clock_now
from app.config import get_settings
from app.errors import Conflict, NotFound, ValidationFailed
from app.infra import caches, secretbox
from app.infra.db import transaction
from app.infra.http.headers import redact
from app.infra.redis import dispatch as redis_dispatch
from app.infra.redis.events import publish_invalidate
from app.infra.tables import models, tasks
from app.states import ACTIVE_STATES
from app.tenancy.keys import Principal

# model_name -> row (or None), for the submit path only; see docs/architecture.md, "Caches".
_cache = caches.register(lambda: TTLCache(maxsize=10_000, ttl=max(1e-6, get_settings().model_cache_seconds)),
                         enabled=lambda: get_settings().model_cache_seconds > 0)


def _invalidate(name: str, row: Row | None = None) -> None:
    _cache.pop(name)
    publish_invalidate("models")
    if row is not None:
        with suppress(redis.RedisError):  # the next claim writes it; the periodic kick passes it on
            redis_dispatch.set_cap(name, row.max_concurrency, row.expected_seconds)


def _check_types(conn: Connection, types: str | None) -> None:
    """models_type must name existing asynch_models_type ids."""
    if types:
        if missing := unknown_ids(conn, [int(x) for x in types.split(",")]):
            raise ValidationFailed("invalid model configuration", [
                {"pointer": "/models_type", "message": "unknown model type ids: " + ", ".join(map(str, missing))}])


def _row(conn: Connection, name: str) -> Row | None:
    return conn.execute(select(models).where(models.c.model_name == name)).first()


def _sealed(values: dict) -> dict:
    """head_msg values are secrets: stored encrypted (app/infra/secretbox.py)."""
    if values.get("head_msg"):
        values["head_msg"] = secretbox.encrypt(values["head_msg"])
    return values


def _create(conn: Connection, spec: ModelInput) -> Row:
    values = _sealed(spec.values())
    _check_types(conn, values["models_type"])
    now = clock_now()
    try:
        with conn.begin_nested():
            return conn.execute(insert(models).values(created_at=now, updated_at=now, **values)
                                .returning(*models.c)).one()
    except IntegrityError as exc:
        raise Conflict(f"model already exists: {spec.model_name}") from exc


def _update(conn: Connection, name: str, change: ModelPatch) -> Row:
    values = change.values(only_given=True)
    if values.pop("model_name", name) != name:
        raise ValidationFailed("invalid model configuration",
                               [{"pointer": "/model_name", "message": "cannot be changed"}])
    _check_types(conn, values.get("models_type"))
    if "head_msg" in values:
        current = _row(conn, name)
        shown = redact(secretbox.decrypt(current.head_msg)) if current is not None and current.head_msg else None
        if shown is not None and values["head_msg"] == shown:
            del values["head_msg"]  # a view sent back (values shown as ***) keeps the stored secrets
    _sealed(values)
    row = conn.execute(update(models).where(models.c.model_name == name)
                       .values(updated_at=clock_now(), **values).returning(*models.c)).first()
    if row is None:
        raise NotFound(f"model not found: {name}")
    return row


def create_model(spec: ModelInput) -> Row:
    with transaction() as conn:
        row = _create(conn, spec)
    _invalidate(row.model_name, row)
    return row


def update_model(name: str, change: ModelPatch) -> Row:
    with transaction() as conn:
        row = _update(conn, name, change)
    _invalidate(name, row)
    return row


def delete_model(name: str) -> None:
    with transaction() as conn:
        active = conn.execute(select(func.count()).select_from(tasks).where(
            tasks.c.model_name == name, tasks.c.state.in_([int(s) for s in ACTIVE_STATES]))).scalar_one()
        if active:
            raise Conflict(f"model {name} has {active} active jobs; disable it and let them finish first")
        deleted = conn.execute(delete(models).where(models.c.model_name == name)).rowcount
    _invalidate(name)
    if deleted == 0:
        raise NotFound(f"model not found: {name}")


def get_model(principal: Principal, name: str) -> Row:
    with transaction() as conn:
        row = _row(conn, name)
    if row is None or not (principal.is_admin or row.enabled):
        raise NotFound(f"model not found: {name}")
    return row


def visible_models(principal: Principal) -> list[Row]:
    q = select(models).order_by(models.c.model_name)
    if not principal.is_admin:
        q = q.where(models.c.enabled.is_(True))
    with transaction() as conn:
        return list(conn.execute(q).all())


def model_row(name: str) -> Row | None:
    """A model's row (None: none), through the per-process cache (ASYNCH_MODEL_CACHE_SECONDS): the admission
    path, and a worker's claims (whose processes drop it by its TTL alone)."""
    row = _cache.get(name, caches.MISSING)
    if row is caches.MISSING:
        token = _cache.token()  # a change during the read keeps it out of the cache
        with transaction() as conn:
            row = _row(conn, name)
        _cache.set(name, row, token)
    return row


def enabled_model(name: str) -> Row:
    """The model a job is submitted to, through the per-process cache
    (admission path): 404 for an unknown one and for a disabled one, which
    says so (the caller's name is right; an admin can enable it)."""
    row = model_row(name)
    if row is None:
        raise NotFound(f"model not found: {name}")
    if not row.enabled:
        raise NotFound(f"model disabled: {name}")
    return row


def reencrypt_head_msgs(conn: Connection) -> int:
    """`asynch secrets rotate`: every head_msg re-encrypted with the first
    ASYNCH_SECRETS_KEYS key (plaintext rows from before encryption
    encrypted).  Returns how many rows were rewritten; drops the caches."""
    rows = conn.execute(select(models.c.model_name, models.c.head_msg).where(models.c.head_msg != "")).all()
    for row in rows:
        conn.execute(update(models).where(models.c.model_name == row.model_name)
                     .values(head_msg=secretbox.rotate(row.head_msg)))
        _cache.pop(row.model_name)
    if rows:
        publish_invalidate("models")
    return len(rows)
