"""Webhook deliveries: a Standard Webhooks JSON POST per terminal state.

Enqueued by the terminal transition itself (app/infra/webhook_rows.py,
app/transitions.py): one asynch_webhook_delivery row per (job, receiver) --
the job's own webhook (subscription_id 0, signed with the tenant's callback
secret) and each tenant subscription whose filter has the event (signed
with the subscription's secret) -- committed in the same statement as the
state change, so a webhook is never lost and never written twice.  The
winner's effects (app/jobs/effects.py) ring a doorbell per job (``fan_out``); the sweep
(``deliver_due``, on beat) re-publishes due and abandoned deliveries.

Delivery is at least once, exactly as callbacks (app/callbacks/delivery.py):
a CAS claim with a lease (pending -> sending, attempt + 1), never past
ASYNCH_CALLBACK_MAX_ATTEMPTS; each attempt re-checks the URL with the SSRF
guard, connects to the checked address, has the callback deadline
(ASYNCH_CALLBACK_TIMEOUT_SECONDS) for the whole exchange, follows no
redirect, and is logged in asynch_webhook_attempt; failures back off with
the callbacks' backoff.  ``webhook-id`` is ``wh_<delivery id>``: the same on
every retry and replay (receivers deduplicate by it).

The body, frozen at the first attempt (retries and replays send the same
bytes): {"type": "job.<event>", "timestamp", "data": the poll body}
(no payload, no secret).

``replay`` puts a failed delivery back to pending with a fresh attempt
budget (its log keeps every earlier attempt).
"""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.engine import Connection, Row

from app.callbacks import secrets as callback_secrets
from app.callbacks import signing
from app.callbacks.delivery import Outcome, settle
from app.clock import as_utc
from app.clock import now as clock_now
from app.config import get_settings
from app.contract import dump, iso_z
from app.errors import Conflict, NotFound
from app.infra.celery_config import DELIVER_WEBHOOK_TASK
from app.infra.db import transaction
from app.infra.http import deadline, netguard
from app.infra.publisher import publish_task
from app.infra.tables import tasks, webhook_attempts, webhook_deliveries, webhook_subscriptions
from app.jobs.schemas import JobStatus
from app.tenancy.keys import Principal

log = logging.getLogger(__name__)

PENDING, SENDING, DELIVERED, FAILED = "pending", "sending", "delivered", "failed"
USER_AGENT = "model-asynch-webhook/1"
RESPONSE_READ_BYTES = 4096
D = webhook_deliveries.c
MAX_ID = 2 ** 63 - 1  # a larger id names no row (and is no bigint)


def message_id(delivery_id: int) -> str:
    return f"wh_{delivery_id}"


def fan_out(job_id: str) -> int:
    """A terminal job's doorbell: publish one delivery message per pending
    delivery of the job.  Returns how many."""
    with transaction() as conn:
        ids = [r.id for r in conn.execute(select(D.id).where(D.job_id == job_id, D.status == PENDING))]
    return sum(1 for i in ids if publish_task(DELIVER_WEBHOOK_TASK, [i]))


def _claim(conn: Connection, delivery_id: int, now: datetime) -> Row | None:
    s = get_settings()
    lease = now + timedelta(seconds=2 * s.callback_timeout_seconds + 30)
    return conn.execute(update(webhook_deliveries).where(
        D.id == delivery_id, D.attempts < s.callback_max_attempts,
        or_(and_(D.status == PENDING, D.next_attempt_at <= now),
            and_(D.status == SENDING, D.lease_until < now)),
    ).values(status=SENDING, attempts=D.attempts + 1, lease_until=lease, updated_at=now)
     .returning(*webhook_deliveries.c, callback_secrets.secret_of(D.tenant_id),
                callback_secrets.rotated_at_of(D.tenant_id))).first()


def _stuck_at_cap(now: datetime):
    cap = get_settings().callback_max_attempts
    return and_(D.attempts >= cap, or_(D.status == PENDING, and_(D.status == SENDING, D.lease_until < now)))


def _give_up(conn: Connection, now: datetime, delivery_id: int | None = None, limit: int = 500) -> int:
    ids = select(D.id).where(_stuck_at_cap(now))
    ids = ids.where(D.id == delivery_id) if delivery_id is not None else ids.limit(limit)
    gone = conn.execute(update(webhook_deliveries).where(D.id.in_(ids), _stuck_at_cap(now)).values(
        status=FAILED, lease_until=None, updated_at=now,
        last_error=f"gave up after {get_settings().callback_max_attempts} attempts (ASYNCH_CALLBACK_MAX_ATTEMPTS); "
                   "the last never finished or the cap was lowered").returning(D.id)).all()
    return len(gone)


def payload_of(conn: Connection, d: Row) -> str:
    """The delivery's JSON body: frozen on the row at its first attempt."""
    if d.payload is not None:
        return d.payload
    job = conn.execute(select(tasks).where(tasks.c.id == d.job_id)).first()
    data = dump(JobStatus.from_row(job)) if job is not None else {"job_id": d.job_id, "state": d.event}
    body = json.dumps({"type": f"job.{d.event}", "timestamp": iso_z(d.created_at), "data": data},
                      separators=(",", ":"), ensure_ascii=False)
    conn.execute(update(webhook_deliveries).where(D.id == d.id, D.payload.is_(None)).values(payload=body))
    return conn.execute(select(D.payload).where(D.id == d.id)).scalar_one()


def _secrets(conn: Connection, d: Row) -> list[str] | None:
    """Who signs: the subscription's own secret, or (the job's own webhook)
    the tenant's callback secret(s).  None: the subscription is gone."""
    if d.subscription_id:
        stored = conn.execute(select(webhook_subscriptions.c.secret).where(
            webhook_subscriptions.c.id == d.subscription_id)).scalar()
        return None if stored is None else [callback_secrets.plain(stored)]
    return callback_secrets.signing_secrets(conn, d.tenant_id, d.secret, d.secret_rotated_at)


def deliver(delivery_id: int) -> Outcome:
    """One attempt of one delivery (the deliver_webhook task)."""
    now = clock_now()
    with transaction() as conn:
        d = _claim(conn, delivery_id, now)
        if d is None:
            if _give_up(conn, now, delivery_id):
                return Outcome("failed")
            cur = conn.execute(select(D.status, D.next_attempt_at).where(D.id == delivery_id)).first()
            if cur is not None and cur.status == PENDING:
                return Outcome("retry", max(0.05, (as_utc(cur.next_attempt_at) - now).total_seconds()))
            return Outcome("skipped")
        body = payload_of(conn, d)
        keys = _secrets(conn, d)
    started = time.monotonic()
    address, http_status, error, transient = None, None, None, True
    if keys is None:
        error, transient = "the subscription was deleted", False
    else:
        try:
            target = netguard.check_url(d.url)
            address = str(target.addresses[0])
            http_status = _send(target, d, keys, body)
            if not 200 <= http_status < 300:
                error = f"HTTP {http_status}" + (" (redirects are not followed)" if 300 <= http_status < 400 else "")
        except netguard.UrlRefused as exc:
            error, transient = f"refused: {exc}", exc.transient
        except deadline.RequestError as exc:
            error, transient = f"{type(exc).__name__}: {exc}"[:500], not isinstance(exc, deadline.InvalidRequest)
        except Exception as exc:  # a bug of ours: still an attempt, logged, retried
            log.exception("webhook attempt crashed", extra={"job_id": d.job_id, "webhook_id": d.id})
            error = f"{type(exc).__name__}: {exc}"[:500]
    return _record(d, now, int((time.monotonic() - started) * 1000), address, http_status, error, transient)


def _send(target: netguard.Target, d: Row, keys: list[str], body: str) -> int:
    s = get_settings()
    ts = int(clock_now().timestamp())
    headers = {"User-Agent": USER_AGENT, "Content-Type": "application/json",
               **signing.sign_headers(keys, message_id(d.id), ts, body),
               "X-Asynch-Task-Id": d.job_id, "X-Asynch-Delivery": f"{d.id}.{d.attempts}"}
    resp = deadline.request("POST", d.url, headers=headers, body=body.encode(), address=str(target.addresses[0]),
                            timeout=s.callback_timeout_seconds, connect_timeout=min(5.0, s.callback_timeout_seconds),
                            max_bytes=RESPONSE_READ_BYTES, truncate=True)
    return resp.status


def _record(d: Row, started_at: datetime, duration_ms: int, address: str | None, http_status: int | None,
            error: str | None, transient: bool) -> Outcome:
    now = clock_now()
    values, out = settle(d.attempts, error, transient, now)
    with transaction() as conn:
        conn.execute(insert(webhook_attempts).values(
            delivery_id=d.id, attempt=d.attempts, started_at=started_at, duration_ms=duration_ms,
            address=address, http_status=http_status, error=error))
        won = conn.execute(update(webhook_deliveries).where(
            D.id == d.id, D.status == SENDING, D.attempts == d.attempts,
        ).values(lease_until=None, updated_at=now, **values).returning(D.id)).first()
    extra = {"job_id": d.job_id, "webhook_id": d.id, "attempt": d.attempts}
    if won is None:
        log.info("webhook attempt outlived its lease; outcome not recorded", extra=extra)
        return Outcome("skipped")
    if error:
        log.info("webhook attempt failed: %s", error, extra=extra)
    return out


def deliver_due(limit: int = 500) -> dict:
    """The sweep: fail the rows the attempt cap ends, re-publish due
    deliveries and those whose worker died (expired lease)."""
    now = clock_now()
    with transaction() as conn:
        failed = _give_up(conn, now, limit=limit)
    with transaction() as conn:
        left = D.attempts < get_settings().callback_max_attempts
        due = [r.id for r in conn.execute(select(D.id).where(
            left, or_(and_(D.status == PENDING, D.next_attempt_at <= now),
                      and_(D.status == SENDING, D.lease_until < now))).limit(limit))]
    published = sum(1 for i in due if publish_task(DELIVER_WEBHOOK_TASK, [i]))
    return {"processed": published + failed, "published": published, "failed": failed}


def _visible(principal: Principal):
    return [] if principal.is_admin else [D.tenant_id == principal.tenant_id]


def replay(principal: Principal, delivery_id: int) -> dict:
    """A failed delivery back to pending, due now, with a fresh attempt
    budget; 404 for another tenant's (or no) delivery, 409 unless failed.
    Publishes its message after the commit; returns the delivery's view."""
    if not 0 <= delivery_id <= MAX_ID:
        raise NotFound("no such webhook delivery")
    now = clock_now()
    with transaction() as conn:
        won = conn.execute(update(webhook_deliveries).where(
            D.id == delivery_id, D.status == FAILED, *_visible(principal),
        ).values(status=PENDING, attempts=0, next_attempt_at=now, lease_until=None, updated_at=now)
         .returning(D.id)).first()
        if won is None:
            cur = conn.execute(select(D.status).where(D.id == delivery_id, *_visible(principal))).first()
            if cur is None:
                raise NotFound("no such webhook delivery")
            raise Conflict(f"only a failed delivery is replayed (this one is {cur.status})")
    log.info("webhook delivery replayed", extra={"webhook_id": delivery_id})
    publish_task(DELIVER_WEBHOOK_TASK, [delivery_id])
    return delivery_view(principal, delivery_id)


def _view(d: Row, log_rows) -> dict:
    return {"id": d.id, "job_id": d.job_id, "tenant": d.tenant_id, "event": d.event, "url": d.url,
            "subscription_id": d.subscription_id or None, "status": d.status, "attempts": d.attempts,
            "next_attempt_at": d.next_attempt_at if d.status == PENDING else None,
            "delivered_at": d.delivered_at, "last_error": d.last_error,
            "log": [{"attempt": a.attempt, "at": a.started_at, "duration_ms": a.duration_ms,
                     "address": a.address, "http_status": a.http_status, "error": a.error} for a in log_rows]}


def _logs(conn: Connection, ids: list[int]) -> dict[int, list]:
    out: dict[int, list] = {i: [] for i in ids}
    if ids:
        for a in conn.execute(select(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(ids))
                              .order_by(webhook_attempts.c.id)):
            out[a.delivery_id].append(a)
    return out


def delivery_view(principal: Principal, delivery_id: int) -> dict:
    if not 0 <= delivery_id <= MAX_ID:
        raise NotFound("no such webhook delivery")
    with transaction() as conn:
        d = conn.execute(select(webhook_deliveries).where(D.id == delivery_id, *_visible(principal))).first()
        if d is None:
            raise NotFound("no such webhook delivery")
        return _view(d, _logs(conn, [d.id])[d.id])


def job_deliveries(principal: Principal, job_id: str) -> list[dict] | None:
    """A job's webhook deliveries with their logs; None if the principal
    may not see the job (another tenant's job does not exist)."""
    q = select(tasks.c.id).where(tasks.c.id == job_id)
    if not principal.is_admin:
        q = q.where(tasks.c.tenant_id == principal.tenant_id)
    with transaction() as conn:
        if conn.execute(q).first() is None:
            return None
        rows = conn.execute(select(webhook_deliveries).where(D.job_id == job_id).order_by(D.created_at, D.id)).all()
        logs = _logs(conn, [r.id for r in rows])
    return [_view(r, logs[r.id]) for r in rows]
