"""Callbacks on done (seed 002): GET {callbackUrl}/{bizName}?task_id&state&oss_file&file_type.

Durable: the winner of the done transition inserts one asynch_callback row
(unique per job) right after its commit and publishes a doorbell on the
callback queue (ASYNCH_CALLBACK_QUEUE_NAME, consumed by `asynch
callback-worker` only, so a stalling receiver never holds a job worker); a
sweep (``deliver_due_callbacks``, on beat) re-publishes due and abandoned
deliveries and backfills the row if the winner died between its commit and
the insert.  At least once: a delivery is claimed with a CAS and a lease
(pending -> sending); a worker that dies mid-delivery leaves an expired lease
the sweep picks up, so a receiver may see a callback twice (deduplicate by
task_id).  Every attempt is logged (asynch_callback_attempt).

Each attempt re-checks the target (app/infra/http/netguard.py), connects to
the checked address and has a hard wall-clock deadline,
ASYNCH_CALLBACK_TIMEOUT_SECONDS, for the WHOLE attempt: connect, send,
status, headers and body (app/infra/http/deadline.py), so a receiver that
trickles bytes costs one callback process that long and no more.  Redirects
are never followed (a 3xx is a failed attempt).  Failures back off
exponentially with jitter.  Requests are signed with the tenant's secret
the Standard Webhooks way (app/callbacks/signing.py; webhook-id is the
task_id, the signed payload the request target: path and query) and with the legacy
X-Asynch-Signature (app/callbacks/secrets.py).

ASYNCH_CALLBACK_MAX_ATTEMPTS bounds attempts everywhere: the claim never
takes a row that used them all, and a row at the cap that is still pending
(the cap was lowered) or whose last attempt never finished (lease expired)
is marked failed, by the next delivery message for it or by the sweep,
instead of being tried again.

Metric ``asynch_callback_deliveries`` (metrics.callback_delivered) counts
SETTLED callbacks, once each: delivered (ok) or failed for good.  An attempt
that fails and will be retried is not counted (it is in the attempt log and
the log line); so delivered + failed is the number of callbacks decided and
failed / (delivered + failed) the share lost.  The model label is the job's
model_name, read in the claim's own statement.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from sqlalchemy import and_, exists, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Row

from app.callbacks import secrets as callback_secrets
from app.callbacks import signing
from app.clock import as_utc
from app.clock import now as clock_now
from app.config import get_settings
from app.infra import metrics
from app.infra.celery_config import DELIVER_CALLBACK_TASK
from app.infra.db import transaction
from app.infra.http import deadline, netguard
from app.infra.publisher import publish_task
from app.infra.storage import public_location
from app.infra.tables import callback_attempts, callbacks, tasks
from app.states import JobState, seed_code
from app.tenancy.keys import Principal

log = logging.getLogger(__name__)

PENDING, SENDING, DELIVERED, FAILED = "pending", "sending", "delivered", "failed"
USER_AGENT = "model-asynch-callback/1"
# Bytes of the receiver's answer read (the rest is dropped): only the status counts.
RESPONSE_READ_BYTES = 4096
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
                       ("oss_file", public_location(row.result_location, row.model_name, row.id) or ""),
                       ("file_type", row.result_content_type or "")])
    if parts.query:
        query = parts.query + "&" + query
    return urlunsplit((parts.scheme, parts.netloc, path or "/", query, ""))


def _insert_for(conn: Connection, row: Row) -> int | None:
    """The callback row for a done job; None if it already exists."""
    now = clock_now()
    stmt = pg_insert(callbacks).values(job_id=row.id, tenant_id=row.tenant_id, url=callback_url_for(row),
                                       status=PENDING, attempts=0, next_attempt_at=now, created_at=now, updated_at=now)
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


# The job's model (the metric's label) and the tenant's secret, read by the
# claim's own UPDATE ... RETURNING: no extra query per delivery.
_MODEL_NAME = (select(tasks.c.model_name).where(tasks.c.id == callbacks.c.job_id)
               .correlate(callbacks).scalar_subquery().label("model_name"))


def _at_cap_and_stuck(now: datetime, max_attempts: int):
    """Rows the cap ends: attempts used up, still pending (the cap was
    lowered) or sending with an expired lease (the last attempt never finished)."""
    return and_(callbacks.c.attempts >= max_attempts,
                or_(callbacks.c.status == PENDING,
                    and_(callbacks.c.status == SENDING, callbacks.c.lease_until < now)))


def claim_delivery(conn: Connection, callback_id: int, now: datetime) -> Row | None:
    """pending and due, or sending with an expired lease -> sending (attempt + 1),
    never past ASYNCH_CALLBACK_MAX_ATTEMPTS."""
    s = get_settings()
    lease = now + timedelta(seconds=2 * s.callback_timeout_seconds + 30)
    return conn.execute(update(callbacks).where(
        callbacks.c.id == callback_id,
        callbacks.c.attempts < s.callback_max_attempts,
        or_(and_(callbacks.c.status == PENDING, callbacks.c.next_attempt_at <= now),
            and_(callbacks.c.status == SENDING, callbacks.c.lease_until < now)),
    ).values(status=SENDING, attempts=callbacks.c.attempts + 1, lease_until=lease, updated_at=now)
     .returning(*callbacks.c, _MODEL_NAME, callback_secrets.secret_of(callbacks.c.tenant_id),
                callback_secrets.rotated_at_of(callbacks.c.tenant_id))).first()


def give_up_at_cap(conn: Connection, now: datetime, callback_id: int | None = None, limit: int = 500) -> int:
    """Mark failed the rows the cap ends (one, or up to ``limit``); counts them
    in the metric.  Returns how many."""
    s = get_settings()
    ids = select(callbacks.c.id).where(_at_cap_and_stuck(now, s.callback_max_attempts))
    ids = ids.where(callbacks.c.id == callback_id) if callback_id is not None else ids.limit(limit)
    gone = conn.execute(update(callbacks).where(
        callbacks.c.id.in_(ids), _at_cap_and_stuck(now, s.callback_max_attempts),
    ).values(status=FAILED, lease_until=None, updated_at=now,
             last_error=f"gave up after {s.callback_max_attempts} attempts (ASYNCH_CALLBACK_MAX_ATTEMPTS); "
                        "the last never finished or the cap was lowered")
     .returning(callbacks.c.id, callbacks.c.job_id, _MODEL_NAME)).all()
    for row in gone:
        log.warning("callback failed: attempt cap reached", extra={"job_id": row.job_id, "callback_id": row.id})
        metrics.callback_delivered(row.model_name, False)
    return len(gone)


def deliver(callback_id: int) -> Outcome:
    """One delivery attempt of one callback (the deliver_callback task)."""
    now = clock_now()
    with transaction() as conn:
        cb = claim_delivery(conn, callback_id, now)
        if cb is None:
            if give_up_at_cap(conn, now, callback_id):
                return Outcome("failed")
            cur = conn.execute(select(callbacks.c.status, callbacks.c.next_attempt_at)
                               .where(callbacks.c.id == callback_id)).first()
            if cur is not None and cur.status == PENDING:
                # Woken early: come back when it is due.
                wait = (as_utc(cur.next_attempt_at) - now).total_seconds()
                return Outcome("retry", max(0.05, wait))
            return Outcome("skipped")
        # The secret is created on a tenant's first use; usually it exists
        # already.  The previous one signs too during the rotation overlap.
        secrets = callback_secrets.signing_secrets(conn, cb.tenant_id, cb.secret, cb.secret_rotated_at)
    started = time.monotonic()
    address, http_status, error, transient = None, None, None, True
    try:
        target = netguard.check_url(cb.url)
        address = str(target.addresses[0])
        http_status = _send(target, cb, secrets)
        if not 200 <= http_status < 300:
            error = f"HTTP {http_status}" + (" (redirects are not followed)" if 300 <= http_status < 400 else "")
    except netguard.UrlRefused as exc:
        error, transient = f"refused: {exc}", exc.transient
    except deadline.RequestError as exc:  # connect, TLS, deadline, broken answer: retried
        error, transient = f"{type(exc).__name__}: {exc}"[:500], not isinstance(exc, deadline.InvalidRequest)
    except Exception as exc:  # a bug of ours: still an attempt, logged, retried
        log.exception("callback attempt crashed", extra={"job_id": cb.job_id, "callback_id": cb.id})
        error = f"{type(exc).__name__}: {exc}"[:500]
    duration_ms = int((time.monotonic() - started) * 1000)
    return _record(cb, now, duration_ms, address, http_status, error, transient)


def _send(target: netguard.Target, cb: Row, secrets: list[str]) -> int:
    """The request, to the checked address, within the attempt's deadline.
    deadline.request sends the URL's Host and verifies TLS for its host name.
    Signed the Standard Webhooks way over the request target as sent, path
    and query (signing.py), and the legacy way with the current secret."""
    s = get_settings()
    ts = int(clock_now().timestamp())
    headers = {
        "User-Agent": USER_AGENT,
        **signing.sign_headers(secrets, cb.job_id, ts, deadline.request_target(cb.url)),
        "X-Asynch-Task-Id": cb.job_id,
        "X-Asynch-Timestamp": str(ts),
        "X-Asynch-Signature": callback_secrets.sign(secrets[0], cb.job_id, ts, cb.url),
        "X-Asynch-Delivery": f"{cb.id}.{cb.attempts}",
    }
    resp = deadline.request("GET", cb.url, headers=headers, address=str(target.addresses[0]),
                            timeout=s.callback_timeout_seconds, connect_timeout=min(5.0, s.callback_timeout_seconds),
                            max_bytes=RESPONSE_READ_BYTES, truncate=True)
    return resp.status


def settle(attempts: int, error: str | None, transient: bool, now: datetime) -> tuple[dict, Outcome]:
    """What a finished try makes of a delivery (a callback or a webhook, which
    share their statuses, attempt cap and backoff): the columns to write and
    the outcome.  Delivered; due again after the backoff (a transient error
    under ASYNCH_CALLBACK_MAX_ATTEMPTS); or failed."""
    if error is None:
        return {"status": DELIVERED, "delivered_at": now, "last_error": None}, Outcome("delivered")
    if transient and attempts < get_settings().callback_max_attempts:
        delay = backoff_seconds(attempts)
        return ({"status": PENDING, "next_attempt_at": now + timedelta(seconds=delay), "last_error": error},
                Outcome("retry", delay))
    return {"status": FAILED, "last_error": error}, Outcome("failed")


def _record(cb: Row, started_at: datetime, duration_ms: int, address: str | None,
            http_status: int | None, error: str | None, transient: bool) -> Outcome:
    now = clock_now()
    values, out = settle(cb.attempts, error, transient, now)
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
    if out.status != "retry":  # settled: counted once (see the module docstring)
        metrics.callback_delivered(cb.model_name, out.status == "delivered")
    return out


def deliver_due_callbacks(limit: int = 500) -> dict:
    """The sweep: backfill missing callback rows, fail the rows the attempt
    cap ends, re-publish due deliveries and deliveries whose worker died
    (expired lease) that have attempts left."""
    s = get_settings()
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
        failed = give_up_at_cap(conn, now, limit=limit)
    with transaction() as conn:
        left = callbacks.c.attempts < s.callback_max_attempts
        due = [r.id for r in conn.execute(select(callbacks.c.id).where(
            callbacks.c.status == PENDING, callbacks.c.next_attempt_at <= now, left).limit(limit))]
        due += [r.id for r in conn.execute(select(callbacks.c.id).where(
            callbacks.c.status == SENDING, callbacks.c.lease_until < now, left).limit(limit))]
    published = sum(1 for cid in due if publish_task(DELIVER_CALLBACK_TASK, [cid]))
    return {"processed": published + failed, "backfilled": backfilled, "published": published, "failed": failed}


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
