"""The outbox: callbacks and webhooks, two kinds of one durable delivery.

A ``callback`` is the seed's GET {callbackUrl}/{bizName}?task_id&state&oss_file&file_type
on done; a ``webhook`` a Standard Webhooks JSON POST on a terminal state
({"type": "job.<event>", "timestamp", "data": the poll body}) to the job's
own webhook (subscription_id 0) or a tenant subscription.  The terminal
transition's own statement writes the rows (app/infra/delivery_rows.py): never
lost, never written twice; its effects ring one pump token per row.

Invariants:
- At least once: a claim is a CAS with a lease (pending -> sending, attempt
  + 1); an expired lease is claimed again (receivers deduplicate by task_id
  / webhook-id).  Only the lease's holder records the outcome; every attempt
  is logged (asynch_delivery_attempt).
- ASYNCH_DELIVERY_MAX_ATTEMPTS bounds attempts: the claim never takes a row
  that used them all; one at the cap still pending (the cap was lowered) or
  whose last attempt never finished is marked failed.
- A tenant's share: a pump token names no row; it claims the fairest due row
  (of the tenants below their cap in flight, the one with the fewest, its
  oldest) under one advisory lock, so the cap holds exactly, and claims
  again until none is left.  The cap (``tenant_cap``) is
  ASYNCH_DELIVERY_TENANT_INFLIGHT and never more than the claiming node's
  pool processes - 1: every claim leaves a process of the delivery pool
  (which has at least that node's) free of any one tenant, so another
  tenant's row never waits for a slow receiver's deadline.
- Each attempt re-checks the target (app/infra/http/netguard.py), connects to
  the checked address within one deadline (ASYNCH_DELIVERY_TIMEOUT_SECONDS)
  and follows no redirect; failures back off exponentially with jitter.
- The request (url, payload) is frozen at the first attempt: retries and
  replays send the same bytes, signed (app/delivery/signing.py): a callback
  with the tenant's secret(s), webhook-id the task_id, its request target
  signed (plus the legacy X-Asynch-Signature); a webhook with its
  subscription's (the job's own: the tenant's), webhook-id ``wh_<id>``, its body.
- ``asynch_deliveries{kind, model, outcome}`` counts each delivery once, when
  settled (a retried attempt is only logged).
"""
from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from types import SimpleNamespace
from datetime import datetime, timedelta
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Row

from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.contract import dump, iso_z
from app.delivery import signing_secrets as tenant_secrets, signing
from app.errors import Conflict, NotFound
from app.infra import metrics, tracing
from app.infra.celery_config import DELIVER_TASK
from app.infra.db import transaction
from app.infra.http import deadline, netguard
from app.infra.delivery_rows import CALLBACK, WEBHOOK
from app.infra.publisher import publish_task
from app.infra.storage import public_location
from app.infra.tables import deliveries, delivery_attempts, tasks, webhook_subscriptions
from app.jobs.schemas import JobStatus
from app.states import JobState, seed_code
from app.tenancy.keys import Principal

log = logging.getLogger(__name__)

PENDING, SENDING, DELIVERED, FAILED = "pending", "sending", "delivered", "failed"
USER_AGENT = {CALLBACK: "model-asynch-callback/1", WEBHOOK: "model-asynch-webhook/1"}
RESPONSE_READ_BYTES = 4096  # of the receiver's answer (the rest is dropped): only the status counts
MAX_ID = 2 ** 63 - 1  # a larger id names no row (and is no bigint)
PUMP_MOST = 100  # deliveries one token makes before it hands over to a fresh one
D = deliveries.c
# The job's model (the metric's label), read by the claim's own UPDATE ... RETURNING.
_MODEL_NAME = (select(tasks.c.model_name).where(tasks.c.id == D.job_id)
               .correlate(deliveries).scalar_subquery().label("model_name"))
# The job's trace context (app/infra/tracing.py): each attempt is a span of the job's trace and sends it on.
_TRACE = [select(c).where(tasks.c.id == D.job_id).correlate(deliveries).scalar_subquery().label(c.name)
          for c in (tasks.c.traceparent, tasks.c.tracestate)]


@dataclass(frozen=True)
class Outcome:
    status: str                  # delivered | retry | failed | skipped | idle (nothing claimable)
    retry_in: float | None = None


def callback_url_for(row: Row) -> str:
    """callbackUrl/{bizName} with the seed's query fields appended."""
    parts = urlsplit(row.callback_url)
    path = parts.path.rstrip("/")
    if row.biz_name:
        path += "/" + quote(row.biz_name, safe="")
    query = urlencode([("task_id", row.id), ("state", seed_code(JobState.DONE)),
                       ("oss_file", public_location(row.result_location, row.model_name, row.id) or ""),
                       ("file_type", row.result_content_type or "")])
    if parts.query:
        query = parts.query + "&" + query
    return urlunsplit((parts.scheme, parts.netloc, path or "/", query, ""))


def backoff_seconds(attempt: int) -> float:
    """base * 2**(attempt-1), capped, with "equal jitter" (half fixed, half random)."""
    s = get_settings()
    d = min(s.delivery_backoff_max_seconds, s.delivery_backoff_seconds * (2 ** max(0, attempt - 1)))
    return d / 2 + random.uniform(0, d / 2)


def wake(tokens: int = 1, countdown: float | None = None) -> int:
    """Publish pump tokens on the delivery queue; returns how many went out."""
    return sum(1 for _ in range(tokens) if publish_task(DELIVER_TASK, [], countdown=countdown))


_pool_processes: int | None = None  # this node's delivery processes (workers/celery_app.py), None: unknown


def set_pool_processes(n: int | None) -> None:
    """The pool size of the worker node this process belongs to (its worker_init; forked children inherit it)."""
    global _pool_processes
    _pool_processes = n


def tenant_cap() -> int:
    """Deliveries one tenant may have in flight: the setting, lowered to leave one of this node's processes
    free of it (a node of one process cannot, and keeps the setting)."""
    cap = get_settings().delivery_tenant_inflight
    if _pool_processes is not None and _pool_processes >= 2:
        cap = min(cap, _pool_processes - 1)
    return max(1, cap)


def _due(c, now: datetime, cap: int):
    """Claimable: attempts left, and pending and due, or sending with an expired lease."""
    return and_(c.attempts < cap, or_(and_(c.status == PENDING, c.next_attempt_at <= now),
                                      and_(c.status == SENDING, c.lease_until < now)))


def claim(conn: Connection, now: datetime, delivery_id: int | None = None) -> Row | None:
    """The fairest claimable row, or ``delivery_id`` if claimable -> sending,
    attempt + 1, leased; with its model name and its tenant's stored secret."""
    s = get_settings()
    cap = s.delivery_max_attempts
    if delivery_id is None:
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtext("asynch-outbox-claim"))))
        d, b = deliveries.alias("d"), deliveries.alias("b")
        busy = (select(b.c.tenant_id, func.count().label("n")).where(b.c.status == SENDING, b.c.lease_until >= now)
                .group_by(b.c.tenant_id).subquery())
        n = func.coalesce(busy.c.n, 0)
        pick = (select(d.c.id).select_from(d.outerjoin(busy, busy.c.tenant_id == d.c.tenant_id))
                .where(_due(d.c, now, cap), n < tenant_cap())
                .order_by(n, d.c.next_attempt_at).limit(1).with_for_update(of=d, skip_locked=True))
        which = D.id == pick.scalar_subquery()
    else:
        which = D.id == delivery_id
    lease = now + timedelta(seconds=2 * s.delivery_timeout_seconds + 30)
    return conn.execute(update(deliveries).where(which, _due(D, now, cap))
                        .values(status=SENDING, attempts=D.attempts + 1, lease_until=lease, updated_at=now)
                        .returning(*deliveries.c, _MODEL_NAME, *_TRACE, *tenant_secrets.stored_of(D.tenant_id))).first()


def give_up_at_cap(conn: Connection, now: datetime, delivery_id: int | None = None, limit: int = 500) -> int:
    """Mark failed the rows the cap ends (one, or up to ``limit``), counted in the metric."""
    cap = get_settings().delivery_max_attempts
    stuck = and_(D.attempts >= cap, or_(D.status == PENDING, and_(D.status == SENDING, D.lease_until < now)))
    ids = select(D.id).where(stuck)
    ids = ids.where(D.id == delivery_id) if delivery_id is not None else ids.limit(limit)
    gone = conn.execute(update(deliveries).where(D.id.in_(ids), stuck).values(
        status=FAILED, lease_until=None, updated_at=now,
        last_error=f"gave up after {cap} attempts (ASYNCH_DELIVERY_MAX_ATTEMPTS); "
                   "the last never finished or the cap was lowered")
        .returning(D.id, D.job_id, D.kind, _MODEL_NAME)).all()
    for row in gone:
        log.warning("delivery failed: attempt cap reached", extra={"job_id": row.job_id, "delivery_id": row.id})
        metrics.delivery_settled(row.kind, row.model_name, False)
    return len(gone)


def pump(delivery_id: int | None = None) -> str:
    """What a token does (the deliver task): one attempt (of ``delivery_id``,
    if named), then the fairest due row, and again, until none is claimable."""
    out = deliver(delivery_id)
    for _ in range(PUMP_MOST):
        if out.status == "retry":
            wake(countdown=out.retry_in)  # someone comes back when it is due
        if out.status == "idle":
            return "idle"
        out = deliver()
    wake()
    return out.status


def deliver(delivery_id: int | None = None) -> Outcome:
    """One delivery attempt: of the fairest claimable row, or of ``delivery_id``."""
    now = clock_now()
    with transaction() as conn:
        d = claim(conn, now, delivery_id)
        if d is None:
            if delivery_id is None:
                return Outcome("idle")
            if give_up_at_cap(conn, now, delivery_id):
                return Outcome("failed")
            cur = conn.execute(select(D.status, D.next_attempt_at).where(D.id == delivery_id)).first()
            if cur is not None and cur.status == PENDING:  # woken early: come back when it is due
                return Outcome("retry", max(0.05, (as_utc(cur.next_attempt_at) - now).total_seconds()))
            return Outcome("skipped")
        url, body = _frozen(conn, d)
        keys = _secrets(conn, d)
    started = time.monotonic()
    address, http_status, error, transient = None, None, None, True
    try:
        if keys is None:
            raise netguard.UrlRefused("the subscription was deleted", transient=False)
        target = netguard.check_url(url)
        address = str(target.addresses[0])
        with tracing.client_call("asynch.delivery", SimpleNamespace(
                id=d.job_id, model_name=d.model_name, tenant_id=d.tenant_id, traceparent=d.traceparent,
                tracestate=d.tracestate), "GET" if d.kind == CALLBACK else "POST", url, {
                "asynch.delivery.kind": d.kind, "asynch.delivery.id": d.id,
                "asynch.delivery.attempt": d.attempts}) as traced:
            http_status = _send(target, d, url, body, keys, traced.headers)
            traced.answered(http_status)
        if not 200 <= http_status < 300:
            error = f"HTTP {http_status}" + (" (redirects are not followed)" if 300 <= http_status < 400 else "")
    except netguard.UrlRefused as exc:
        error, transient = (f"refused: {exc}" if keys else str(exc)), exc.transient
    except deadline.RequestError as exc:  # connect, TLS, deadline, broken answer: retried
        error, transient = f"{type(exc).__name__}: {exc}"[:500], not isinstance(exc, deadline.InvalidRequest)
    except Exception as exc:  # a bug of ours: still an attempt, logged, retried
        log.exception("delivery attempt crashed", extra={"job_id": d.job_id, "delivery_id": d.id})
        error = f"{type(exc).__name__}: {exc}"[:500]
    return _record(d, now, int((time.monotonic() - started) * 1000), address, http_status, error, transient)


def _frozen(conn: Connection, d: Row) -> tuple[str, str]:
    """The request's URL and payload, frozen on the row at its first attempt."""
    if d.payload is not None:
        return d.url, d.payload
    job = conn.execute(select(tasks).where(tasks.c.id == d.job_id)).one()
    if d.kind == CALLBACK:
        url, body = callback_url_for(job), ""
    else:
        url, body = d.url, json.dumps({"type": f"job.{d.event}", "timestamp": iso_z(d.created_at),
                                       "data": dump(JobStatus.from_row(job))}, separators=(",", ":"),
                                      ensure_ascii=False)
    conn.execute(update(deliveries).where(D.id == d.id, D.payload.is_(None)).values(url=url, payload=body))
    return tuple(conn.execute(select(D.url, D.payload).where(D.id == d.id)).one())


def _secrets(conn: Connection, d: Row) -> list[str] | None:
    """A subscription's own secret, else the tenant's (None: the subscription is gone)."""
    if d.subscription_id:
        stored = conn.execute(select(webhook_subscriptions.c.secret).where(
            webhook_subscriptions.c.id == d.subscription_id)).scalar()
        return None if stored is None else [tenant_secrets.plain(stored)]
    # Created on a tenant's first use; the previous one signs too during the rotation overlap.
    return tenant_secrets.signing_secrets(conn, d.tenant_id, d.secret, d.secret_rotated_at)


def _send(target: netguard.Target, d: Row, url: str, body: str, keys: list[str], trace: dict | None = None) -> int:
    """The request, to the checked address, within the attempt's deadline
    (deadline.request sends the URL's Host and verifies TLS for its name)."""
    s = get_settings()
    ts = int(clock_now().timestamp())
    callback = d.kind == CALLBACK
    signed = (d.job_id, deadline.request_target(url)) if callback else (f"wh_{d.id}", body)
    headers = {"User-Agent": USER_AGENT[d.kind], **signing.sign_headers(keys, signed[0], ts, signed[1]),
               "X-Asynch-Task-Id": d.job_id, "X-Asynch-Delivery": f"{d.id}.{d.attempts}", **(trace or {})}
    if callback:
        headers.update({"X-Asynch-Timestamp": str(ts),
                        "X-Asynch-Signature": tenant_secrets.sign(keys[0], d.job_id, ts, url)})
    else:
        headers["Content-Type"] = "application/json"
    return deadline.request("GET" if callback else "POST", url, headers=headers,
                            body=None if callback else body.encode(), address=str(target.addresses[0]),
                            timeout=s.delivery_timeout_seconds, connect_timeout=min(5.0, s.delivery_timeout_seconds),
                            max_bytes=RESPONSE_READ_BYTES, truncate=True).status


def _record(d: Row, started_at: datetime, duration_ms: int, address: str | None, http_status: int | None,
            error: str | None, transient: bool) -> Outcome:
    """The attempt logged; the row delivered, due again after the backoff
    (a transient error under the cap), or failed."""
    now = clock_now()
    if error is None:
        values, out = {"status": DELIVERED, "delivered_at": now, "last_error": None}, Outcome("delivered")
    elif transient and d.attempts < get_settings().delivery_max_attempts:
        out = Outcome("retry", backoff_seconds(d.attempts))
        values = {"status": PENDING, "next_attempt_at": now + timedelta(seconds=out.retry_in), "last_error": error}
    else:
        values, out = {"status": FAILED, "last_error": error}, Outcome("failed")
    with transaction() as conn:
        conn.execute(insert(delivery_attempts).values(
            delivery_id=d.id, attempt=d.attempts, started_at=started_at, duration_ms=duration_ms,
            address=address, http_status=http_status, error=error))
        won = conn.execute(update(deliveries).where(D.id == d.id, D.status == SENDING, D.attempts == d.attempts)
                           .values(lease_until=None, updated_at=now, **values).returning(D.id)).first()
    extra = {"job_id": d.job_id, "delivery_id": d.id, "attempt": d.attempts}
    if won is None:
        log.info("%s attempt outlived its lease; outcome not recorded", d.kind, extra=extra)
        return Outcome("skipped")
    if error:
        log.info("%s attempt failed: %s", d.kind, error, extra=extra)
    if out.status != "retry":  # settled: counted once
        metrics.delivery_settled(d.kind, d.model_name, out.status == "delivered")
    return out


def deliver_due(limit: int = 500) -> dict:
    """The sweep: fail the rows the attempt cap ends; give every tenant with
    claimable rows (due, or lease expired) a token a row, up to its cap."""
    s = get_settings()
    now = clock_now()
    with transaction() as conn:
        failed = give_up_at_cap(conn, now, limit=limit)
    with transaction() as conn:
        per = (select(func.least(func.count(), tenant_cap()).label("n"))
               .where(_due(D, now, s.delivery_max_attempts)).group_by(D.tenant_id).subquery())
        due = min(limit, int(conn.execute(select(func.coalesce(func.sum(per.c.n), 0))).scalar_one()))
    published = wake(due)
    return {"processed": published + failed, "published": published, "failed": failed}


def replay(principal: Principal, delivery_id: int) -> dict:
    """A failed webhook delivery back to pending, due now, with a fresh
    attempt budget (its log kept); 404 for another tenant's, 409 unless failed."""
    if not 0 <= delivery_id <= MAX_ID:  # an id no row can have
        raise NotFound("no such webhook delivery")
    mine = [D.id == delivery_id, D.kind == WEBHOOK]  # the webhook delivery, if the principal may see it
    mine += [] if principal.is_admin else [D.tenant_id == principal.tenant_id]
    now = clock_now()
    with transaction() as conn:
        won = conn.execute(update(deliveries).where(*mine, D.status == FAILED).values(
            status=PENDING, attempts=0, next_attempt_at=now, lease_until=None, updated_at=now)
            .returning(*deliveries.c)).first()
        if won is None:
            if (cur := conn.execute(select(D.status).where(*mine)).first()) is None:
                raise NotFound("no such webhook delivery")
            raise Conflict(f"only a failed delivery is replayed (this one is {cur.status})")
        view = _views(conn, [won], principal.is_admin)[0]  # as replayed: pending, before a pump can claim it
    log.info("webhook delivery replayed", extra={"delivery_id": delivery_id})
    wake()
    return view


def _views(conn: Connection, rows: list, admin: bool) -> list[dict]:
    """Rows as their service views, each with its attempt log.  An attempt's
    ``address`` is the resolved IP we connected to for admins only; a tenant
    sees the host of the URL it gave (what an allowlisted name such as
    ``localhost`` resolves to is ours, not theirs), or null when the attempt
    connected nowhere."""
    logs: dict[int, list] = {r.id: [] for r in rows}
    hosts = {r.id: urlsplit(r.url or "").hostname for r in rows}
    if rows:
        for a in conn.execute(select(delivery_attempts).where(delivery_attempts.c.delivery_id.in_(list(logs)))
                              .order_by(delivery_attempts.c.id)):
            address = a.address if admin or a.address is None else hosts[a.delivery_id]
            logs[a.delivery_id].append({"attempt": a.attempt, "at": a.started_at, "duration_ms": a.duration_ms,
                                        "address": address, "http_status": a.http_status, "error": a.error})
    return [{"id": d.id, "kind": d.kind, "job_id": d.job_id, "tenant": d.tenant_id, "event": d.event, "url": d.url,
             "subscription_id": d.subscription_id or None, "status": d.status, "attempts": d.attempts,
             "next_attempt_at": d.next_attempt_at if d.status == PENDING else None,
             "delivered_at": d.delivered_at, "last_error": d.last_error, "log": logs[d.id]} for d in rows]


def job_deliveries(principal: Principal, job_id: str, kind: str | None = WEBHOOK) -> list[dict] | None:
    """A job's deliveries of ``kind`` (None: both) with their logs; None if the principal may not see the job."""
    q = select(tasks.c.id).where(tasks.c.id == job_id)
    if not principal.is_admin:
        q = q.where(tasks.c.tenant_id == principal.tenant_id)
    with transaction() as conn:
        if conn.execute(q).first() is None:
            return None
        which = [D.job_id == job_id] + ([D.kind == kind] if kind else [])
        # Ids are random: of rows written by one statement (the terminal transition's), the callback comes first.
        return _views(conn, conn.execute(select(deliveries).where(*which).order_by(D.created_at, D.kind, D.id)).all(),
                      principal.is_admin)


def callback_view(principal: Principal, job_id: str) -> dict | None:
    """The callback of a job the principal may see, with its log; None: none."""
    return next(iter(job_deliveries(principal, job_id, CALLBACK) or []), None)
