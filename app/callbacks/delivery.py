"""Callbacks on done (seed 002): GET {callbackUrl}/{bizName}?task_id&state&oss_file&file_type.

Durable: the winner of the done transition inserts one asynch_callback row
(unique per job) right after its commit and publishes a doorbell; a sweep
(``deliver_due_callbacks``, on beat) re-publishes due and abandoned
deliveries and backfills the row if the winner died between its commit and
the insert.  At least once: a delivery is claimed with a CAS and a lease
(pending -> sending); a worker that dies mid-delivery leaves an expired lease
the sweep picks up, so a receiver may see a callback twice (deduplicate by
task_id).  Every attempt is logged (asynch_callback_attempt).

Each attempt re-checks the target (app/services/netguard.py) and connects to
the checked address; redirects are never followed (a 3xx is a failed
attempt).  Failures back off exponentially with jitter up to
ASYNCH_CALLBACK_MAX_ATTEMPTS.  Requests are signed with the tenant's secret
(app/services/callback_secrets.py).
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import urllib3
from sqlalchemy import and_, exists, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Row

from app.infra.celery_config import DELIVER_CALLBACK_TASK
from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.infra.db import transaction
from app.infra.tables import callback_attempts, callbacks, tasks
from app.infra.publisher import publish_task
from app.callbacks import secrets as callback_secrets
from app.infra.http import netguard
from app.tenancy.keys import Principal
from app.states import JobState, seed_code

log = logging.getLogger(__name__)

PENDING, SENDING, DELIVERED, FAILED = "pending", "sending", "delivered", "failed"
USER_AGENT = "model-asynch-callback/1"
# The sweep backfills rows only for jobs finished this recently (older ones
# were handled by earlier sweeps), and leaves the winner a moment first.
BACKFILL_WINDOW = timedelta(days=1)
BACKFILL_GRACE = timedelta(seconds=60)


def callback_url_for(row: Row) -> str:
    """callbackUrl/{bizName} with the seed's query fields appended."""
    parts = urlsplit(row.callback_url)
    path = parts.path.rstrip("/")
    if row.biz_name:
        path += "/" + quote(row.biz_name, safe="")
    query = urlencode([("task_id", row.id), ("state", seed_code(JobState.DONE)),
                       ("oss_file", row.result_location or ""), ("file_type", row.result_content_type or "")])
    if parts.query:
        query = parts.query + "&" + query
    return urlunsplit((parts.scheme, parts.netloc, path or "/", query, ""))


def _insert_for(conn: Connection, row: Row) -> int | None:
    """The callback row for a done job; None if it already exists."""
    ins = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    now = clock_now()
    stmt = ins(callbacks).values(job_id=row.id, tenant_id=row.tenant_id, url=callback_url_for(row), status=PENDING,
                                 attempts=0, next_attempt_at=now, created_at=now, updated_at=now)
    return conn.execute(stmt.on_conflict_do_nothing(index_elements=["job_id"]).returning(callbacks.c.id)).scalar()


def schedule_for(row: Row) -> None:
    """After the winning done commit: record the callback and ring the bell.
    Never raises (the job is done either way); the sweep repairs a miss."""
    if not row.callback_url:
        return
    try:
        with transaction() as conn:
            cid = _insert_for(conn, row)
        if cid is not None:
            publish_task(DELIVER_CALLBACK_TASK, [cid])
    except Exception:
        log.exception("callback not scheduled; the sweep will", extra={"job_id": row.id})


def backoff_seconds(attempt: int) -> float:
    """base * 2**(attempt-1), capped, with "equal jitter" (half fixed, half random)."""
    s = get_settings()
    d = min(s.callback_backoff_max_seconds, s.callback_backoff_seconds * (2 ** max(0, attempt - 1)))
    return d / 2 + random.uniform(0, d / 2)


@dataclass(frozen=True)
class Outcome:
    status: str                  # delivered | retry | failed | skipped
    retry_in: float | None = None


def claim_delivery(conn: Connection, callback_id: int, now: datetime) -> Row | None:
    """pending and due, or sending with an expired lease -> sending (attempt + 1)."""
    lease = now + timedelta(seconds=2 * get_settings().callback_timeout_seconds + 30)
    return conn.execute(update(callbacks).where(
        callbacks.c.id == callback_id,
        or_(and_(callbacks.c.status == PENDING, callbacks.c.next_attempt_at <= now),
            and_(callbacks.c.status == SENDING, callbacks.c.lease_until < now)),
    ).values(status=SENDING, attempts=callbacks.c.attempts + 1, lease_until=lease, updated_at=now)
     .returning(*callbacks.c)).first()


def deliver(callback_id: int) -> Outcome:
    """One delivery attempt of one callback (the deliver_callback task)."""
    now = clock_now()
    with transaction() as conn:
        cb = claim_delivery(conn, callback_id, now)
        if cb is None:
            cur = conn.execute(select(callbacks.c.status, callbacks.c.next_attempt_at)
                               .where(callbacks.c.id == callback_id)).first()
            if cur is not None and cur.status == PENDING:
                # Woken early: come back when it is due.
                wait = (as_utc(cur.next_attempt_at) - now).total_seconds()
                return Outcome("retry", max(0.05, wait))
            return Outcome("skipped")
        secret = callback_secrets.tenant_secret(conn, cb.tenant_id)["secret"]
    started = time.monotonic()
    address, http_status, error, transient = None, None, None, True
    try:
        target = netguard.check_url(cb.url)
        address = str(target.addresses[0])
        http_status = _send(target, cb, secret)
        if not 200 <= http_status < 300:
            error = f"HTTP {http_status}" + (" (redirects are not followed)" if 300 <= http_status < 400 else "")
    except netguard.UrlRefused as exc:
        error, transient = f"refused: {exc}", exc.transient
    except Exception as exc:  # connection refused, timeout, TLS, protocol errors
        error = f"{type(exc).__name__}: {exc}"[:500]
    duration_ms = int((time.monotonic() - started) * 1000)
    return _record(cb, now, duration_ms, address, http_status, error, transient)


def _send(target: netguard.Target, cb: Row, secret: str) -> int:
    s = get_settings()
    ts = int(clock_now().timestamp())
    host = f"[{target.host}]" if ":" in target.host else target.host
    default_port = 443 if target.scheme == "https" else 80
    headers = {
        "Host": host if target.port == default_port else f"{host}:{target.port}",
        "User-Agent": USER_AGENT,
        "X-Asynch-Task-Id": cb.job_id,
        "X-Asynch-Timestamp": str(ts),
        "X-Asynch-Signature": callback_secrets.sign(secret, cb.job_id, ts, cb.url),
        "X-Asynch-Delivery": f"{cb.id}.{cb.attempts}",
    }
    kw: dict = {"host": str(target.addresses[0]), "port": target.port, "maxsize": 1, "retries": False,
                "timeout": urllib3.Timeout(connect=min(5.0, s.callback_timeout_seconds),
                                           read=s.callback_timeout_seconds)}
    if target.scheme == "https":
        # Connect to the checked address but verify the certificate for the name.
        pool = urllib3.HTTPSConnectionPool(server_hostname=target.host, assert_hostname=target.host, **kw)
    else:
        pool = urllib3.HTTPConnectionPool(**kw)
    with pool:
        resp = pool.urlopen("GET", target.path_and_query, headers=headers, redirect=False, retries=False,
                            preload_content=False, assert_same_host=False)
        try:
            resp.read(4096)
        finally:
            resp.release_conn()
        return resp.status


def _record(cb: Row, started_at: datetime, duration_ms: int, address: str | None,
            http_status: int | None, error: str | None, transient: bool) -> Outcome:
    s = get_settings()
    now = clock_now()
    if error is None:
        values, out = {"status": DELIVERED, "delivered_at": now, "last_error": None}, Outcome("delivered")
    elif transient and cb.attempts < s.callback_max_attempts:
        delay = backoff_seconds(cb.attempts)
        values = {"status": PENDING, "next_attempt_at": now + timedelta(seconds=delay), "last_error": error}
        out = Outcome("retry", delay)
    else:
        values, out = {"status": FAILED, "last_error": error}, Outcome("failed")
    with transaction() as conn:
        conn.execute(insert(callback_attempts).values(
            callback_id=cb.id, attempt=cb.attempts, started_at=started_at, duration_ms=duration_ms,
            address=address, http_status=http_status, error=error))
        # Only the attempt that holds the lease records its outcome.
        won = conn.execute(update(callbacks).where(
            callbacks.c.id == cb.id, callbacks.c.status == SENDING, callbacks.c.attempts == cb.attempts,
        ).values(lease_until=None, updated_at=now, **values).returning(callbacks.c.id)).first()
    extra = {"job_id": cb.job_id, "callback_id": cb.id, "attempt": cb.attempts}
    if won is None:
        log.info("callback attempt outlived its lease; outcome not recorded", extra=extra)
        return Outcome("skipped")
    if error:
        log.info("callback attempt failed: %s", error, extra=extra)
    return out


def deliver_due_callbacks(limit: int = 500) -> dict:
    """The sweep: backfill missing callback rows, re-publish due deliveries
    and deliveries whose worker died (expired lease)."""
    now = clock_now()
    with transaction() as conn:
        missing = conn.execute(select(tasks).where(
            tasks.c.state.in_([int(JobState.DONE), int(JobState.CLAIMED)]),
            tasks.c.finished_at < now - BACKFILL_GRACE, tasks.c.finished_at > now - BACKFILL_WINDOW,
            tasks.c.callback_url.is_not(None),
            ~exists().where(callbacks.c.job_id == tasks.c.id),
        ).limit(limit)).all()
        backfilled = sum(1 for row in missing if _insert_for(conn, row) is not None)
    with transaction() as conn:
        due = [r.id for r in conn.execute(select(callbacks.c.id).where(
            callbacks.c.status == PENDING, callbacks.c.next_attempt_at <= now).limit(limit))]
        due += [r.id for r in conn.execute(select(callbacks.c.id).where(
            callbacks.c.status == SENDING, callbacks.c.lease_until < now).limit(limit))]
    published = sum(1 for cid in due if publish_task(DELIVER_CALLBACK_TASK, [cid]))
    return {"processed": published, "backfilled": backfilled, "published": published}


def delivery_view(principal: Principal, job_id: str) -> dict | None:
    """The callback of a job the principal may see, with its delivery log."""
    q = select(callbacks).join(tasks, tasks.c.id == callbacks.c.job_id).where(callbacks.c.job_id == job_id)
    if not principal.is_admin:
        q = q.where(tasks.c.tenant_id == principal.tenant_id)
    with transaction() as conn:
        cb = conn.execute(q).first()
        if cb is None:
            return None
        log_rows = conn.execute(select(callback_attempts).where(callback_attempts.c.callback_id == cb.id)
                                .order_by(callback_attempts.c.attempt, callback_attempts.c.id)).all()

    def iso(dt):
        return as_utc(dt).isoformat().replace("+00:00", "Z") if dt else None

    return {"job_id": cb.job_id, "url": cb.url, "status": cb.status, "attempts": cb.attempts,
            "next_attempt_at": iso(cb.next_attempt_at) if cb.status == PENDING else None,
            "delivered_at": iso(cb.delivered_at), "last_error": cb.last_error,
            "log": [{"attempt": a.attempt, "at": iso(a.started_at), "duration_ms": a.duration_ms,
                     "address": a.address, "http_status": a.http_status, "error": a.error} for a in log_rows]}
