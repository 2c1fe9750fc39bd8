"""Database tables (SQLAlchemy Core).  Alembic creates them; this module
only describes them so queries can be written against names, not strings."""
from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from app.states import JobState as S

metadata = MetaData()

JsonType = JSONB()
TS = DateTime(timezone=True)


def _in(*states: S) -> str:
    return f"state = {int(states[0])}" if len(states) == 1 else f"state IN ({', '.join(str(int(x)) for x in states)})"


def _partial(name: str, cols: list[str], where: str) -> Index:
    """An index over the rows ``where`` holds.  The queries must spell the predicate with literal states for the planner
    to use it; psycopg2 sends bound values inline, so ``state IN (...)``
    built from parameters qualifies."""
    return Index(name, *cols, postgresql_where=text(where))


models = Table(
    "asynch_models", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("model_name", String(128), nullable=False, unique=True),
    Column("models_type", String(512), nullable=False, server_default=""),
    Column("form", JsonType, nullable=True),
    Column("base_url", String(1024), nullable=False),
    Column("route", String(1024), nullable=False, server_default=""),
    Column("http_method", String(8), nullable=False, server_default="POST"),
    Column("head_msg", Text, nullable=False, server_default=""),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("max_concurrency", Integer, nullable=False, server_default="5"),
    Column("queue_limit", Integer, nullable=False, server_default="20"),
    Column("timeout_seconds", Integer, nullable=False, server_default="1800"),
    Column("expected_seconds", Integer, nullable=False, server_default="600"),
    Column("retry_times", Integer, nullable=False, server_default="3"),
    Column("retry_queue_max_seconds", Integer, nullable=False, server_default="600"),
    Column("auto_clean_seconds", Integer, nullable=False, server_default="3600"),
    Column("remark", Text, nullable=False, server_default=""),
    # Slots of queue_limit one tenant may hold; NULL: ASYNCH_TENANT_QUEUE_SHARE of it (revision 0006).
    Column("tenant_queue_limit", Integer, nullable=True),
    # Header names a job's modelKey may set ("*": any unprotected one); '' none (revision 0011).
    Column("model_key_headers", Text, nullable=False, server_default=""),
    # Done/claimed jobs kept per model (seed 000 async_max_completed); 0: no cap (revision 0012_seed_dropin).
    Column("max_completed", Integer, nullable=False, server_default="0"),
    Column("created_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
)

model_types = Table(
    "asynch_models_type", metadata,
    Column("type_id", Integer, primary_key=True, autoincrement=False),
    Column("type_name", String(128), nullable=False),
    Column("remark", Text, nullable=False, server_default=""),
    Column("created_at", TS, nullable=False),
)

tasks = Table(
    "asynch_task", metadata,
    Column("id", String(40), primary_key=True),
    Column("tenant_id", String(64), nullable=False),
    Column("creator", String(128), nullable=False, server_default=""),
    Column("model_name", String(128), nullable=False),
    Column("biz_name", String(128), nullable=False, server_default=""),
    Column("callback_url", Text, nullable=True),
    # Per-job header override (seed: modelKey).  Secret: never returned.
    Column("model_key", Text, nullable=True),
    # Headers passed through to the OSS file service (JSON object: its
    # Authorization and X-User-Info).  Secret: never returned or logged;
    # cleared when the job reaches a terminal state.
    Column("passthrough_headers", Text, nullable=True),
    # JSON text as received: jsonb would refuse \u0000, which JSON allows.
    Column("request_payload", Text, nullable=False),
    # sha256 of the canonical payload + options: idempotent replays compare it.
    Column("request_hash", String(64), nullable=False),
    Column("idempotency_key", String(255), nullable=True),
    Column("state", SmallInteger, nullable=False),
    # Claims so far (the CAS token): attempt n+1 is claimed from attempt n.
    Column("attempt", Integer, nullable=False, server_default="0"),
    # Retries taken (seed: retry_count, not counting the first try).
    Column("retry_count", Integer, nullable=False, server_default="0"),
    # Attempts the upstream answered busy (429/503) and that went back to
    # pending unspent (revision 0022): retries count ``attempt - busy_count``.
    Column("busy_count", Integer, nullable=False, server_default="0"),
    # 0-9, 9 first: orders dispatch within the tenant's share (revision 0013).
    Column("priority", SmallInteger, nullable=False, server_default="5"),
    # What the tenant sees: "<code>: <short message>" (app/states.py JOB_ERROR_CODES).
    Column("error", Text, nullable=True),
    # The internals behind it (exception text, the model's error body): admin views only (revision 0011).
    Column("error_detail", Text, nullable=True),
    Column("result_location", Text, nullable=True),
    Column("result_content_type", String(255), nullable=True),
    Column("result_size", BigInteger, nullable=True),
    # A small result kept in the row (location ``inline:``; revision 0010).
    Column("result_inline", LargeBinary, nullable=True),
    # The Celery node running the current attempt (revision 0010): recovery
    # fails the attempt as soon as that node's heartbeat is gone.
    Column("worker", String(255), nullable=True),
    Column("created_at", TS, nullable=False),
    # Queue order; a retry resets it (tail) or backdates it (head).
    Column("enqueue_at", TS, nullable=False),
    Column("started_at", TS, nullable=True),
    Column("finished_at", TS, nullable=True),
    Column("lease_expires_at", TS, nullable=True),
    Column("next_retry_at", TS, nullable=True),
    # Job budget: pending/running past it becomes timeout.
    Column("deadline_at", TS, nullable=True),
    # The caller's deadline (X-Deadline, revision 0019): still pending past it becomes expired.
    Column("caller_deadline_at", TS, nullable=True),
    Column("claimed_at", TS, nullable=True),
    # When the result was last read (0012_seed_dropin): max_completed evicts the least recently read.
    Column("last_read_at", TS, nullable=True),
    Column("expire_at", TS, nullable=True),
    Column("updated_at", TS, nullable=False),
    # When a pending retry was published at high priority (revision 0003).
    Column("promoted_at", TS, nullable=True),
    # The job's own webhook (revision 0015): a JSON POST on each terminal
    # state whose bit is in webhook_events (app/infra/outbox_rows.py EVENT_BITS).
    Column("webhook_url", Text, nullable=True),
    Column("webhook_events", SmallInteger, nullable=True),
    # One job per (tenant, Idempotency-Key); rows without a key stay out of it (revision 0005).
    Index("uq_asynch_task_idempotency", "tenant_id", "idempotency_key", unique=True,
          postgresql_where=text("idempotency_key IS NOT NULL")),
    # Listing: a tenant's jobs newest first, optionally by model; every
    # tenant's (an admin's listing) in its own sort order (revision 0014).
    Index("ix_asynch_task_created", "created_at", "id"),
    Index("ix_asynch_task_tenant_created", "tenant_id", "created_at"),
    Index("ix_asynch_task_tenant_model_created", "tenant_id", "model_name", "created_at"),
    # Gate reconcile / depth: active rows of a model.
    Index("ix_asynch_task_model_state", "model_name", "state"),
    # A tenant's event stream (GET /v1/events): its jobs changed since a time (revision 0013).
    Index("ix_asynch_task_tenant_updated", "tenant_id", "updated_at"),
    # Maintenance scans (revision 0004): each a partial index over the
    # state it looks for, so a row version enters only its own state's index.
    _partial("ix_asynch_task_retry_due", ["next_retry_at"], _in(S.RETRY_WAIT)),
    _partial("ix_asynch_task_running_lease", ["lease_expires_at"], _in(S.RUNNING)),
    _partial("ix_asynch_task_pending_enqueue", ["enqueue_at", "id"], _in(S.PENDING)),
    _partial("ix_asynch_task_slot_deadline", ["deadline_at"], _in(S.PENDING, S.RUNNING)),
    _partial("ix_asynch_task_claimed_expire", ["expire_at"], _in(S.CLAIMED)),
    _partial("ix_asynch_task_ended_finished", ["finished_at"],
             _in(S.DONE, S.FAILED, S.TIMEOUT, S.CANCELED, S.EXPIRED)),
    # The expiry pass: pending jobs with a caller's deadline (revision 0019).
    _partial("ix_asynch_task_pending_caller_deadline", ["caller_deadline_at"],
             f"{_in(S.PENDING)} AND caller_deadline_at IS NOT NULL"),
    # Autotune reads a model's recently finished jobs.
    _partial("ix_asynch_task_finished_by_model", ["model_name", "finished_at"], "finished_at IS NOT NULL"),
    # Retries waiting at the tail of a model's queue (promotion scan, revision 0003).
    _partial("ix_asynch_task_retry_promote", ["model_name", "enqueue_at"],
             f"{_in(S.PENDING)} AND retry_count > 0 AND promoted_at IS NULL"),
)
# A model's done/claimed jobs, least recently read first: the max_completed
# eviction every submit to a capped model runs (app/jobs/retention.py, revision 0018).
Index("ix_asynch_task_completed_read", tasks.c.model_name, func.coalesce(tasks.c.last_read_at, tasks.c.finished_at),
      postgresql_where=text(_in(S.DONE, S.CLAIMED)))

# One row per ended attempt (revision 0015): running -> done / retry_wait /
# failed, appended by the transition's own statement (app/transitions.py).
task_attempts = Table(
    "asynch_task_attempt", metadata,
    Column("id", BigInteger(), primary_key=True, autoincrement=True),
    Column("job_id", String(40), ForeignKey("asynch_task.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker", String(255), nullable=True),
    Column("started_at", TS, nullable=True),
    Column("ended_at", TS, nullable=False),
    # The state the attempt left the job in (app/states.py JobState).
    Column("outcome", SmallInteger, nullable=False),
    Column("error", Text, nullable=True),
    # Admin views only, as asynch_task.error_detail.
    Column("error_detail", Text, nullable=True),
    Index("ix_asynch_task_attempt_job", "job_id", "attempt"),
)

model_stats = Table(
    "asynch_model_stat", metadata,
    Column("id", BigInteger(), primary_key=True, autoincrement=True),
    Column("day", Date, nullable=False),
    Column("tenant_id", String(64), nullable=False),
    Column("creator", String(128), nullable=False, server_default=""),
    Column("model_name", String(128), nullable=False),
    Column("request_count", BigInteger, nullable=False, server_default="0"),
    UniqueConstraint("day", "tenant_id", "creator", "model_name", name="uq_asynch_model_stat"),
    Index("ix_asynch_model_stat_model_day", "model_name", "day"),
    Index("ix_asynch_model_stat_tenant_day", "tenant_id", "day"),
)

BigId = BigInteger()
# Ids tenants see (callback and webhook deliveries, subscriptions): random in
# [1, 2**53), not a sequence that shows every tenant the platform's volume
# (revision 0017; exact as a JSON number).
RANDOM_ID = text("(floor(random() * 9007199254740990) + 1)::bigint")

# Webhooks (revision 0015): a tenant's subscriptions (URL, event bits, its
# own whsec_ secret encrypted with app/infra/secretbox.py).
webhook_subscriptions = Table(
    "asynch_webhook_subscription", metadata,
    Column("id", BigId, primary_key=True, autoincrement=False, server_default=RANDOM_ID),
    Column("tenant_id", String(64), nullable=False),
    Column("url", Text, nullable=False),
    Column("events", SmallInteger, nullable=False),
    Column("secret", String(128), nullable=False),
    Column("created_at", TS, nullable=False),
    Index("ix_asynch_webhook_subscription_tenant", "tenant_id"),
)

# The outbox (revision 0021): one row per (job, receiver) a terminal
# transition's own statement wrote (app/infra/outbox_rows.py), of either kind:
# "callback" (the seed's GET on done, subscription_id 0) or "webhook" (a JSON
# POST; subscription_id 0 is the job's own webhook).  pending -> sending (a
# lease) -> delivered | pending (backoff) | failed (app/delivery/outbox.py).
deliveries = Table(
    "asynch_delivery", metadata,
    Column("id", BigId, primary_key=True, autoincrement=False, server_default=RANDOM_ID),
    Column("kind", String(16), nullable=False),
    Column("job_id", String(40), ForeignKey("asynch_task.id", ondelete="CASCADE"), nullable=False),
    Column("tenant_id", String(64), nullable=False),
    Column("subscription_id", BigInteger, nullable=False, server_default="0"),
    Column("event", String(16), nullable=False),
    # The request as first sent, frozen at the first attempt (retries and
    # replays send the same bytes): a callback's full URL (its payload is
    # empty: the signature covers the request target), a webhook's JSON body.
    Column("url", Text, nullable=False),
    Column("payload", Text, nullable=True),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", TS, nullable=False),
    Column("lease_until", TS, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("delivered_at", TS, nullable=True),
    Column("created_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    UniqueConstraint("job_id", "kind", "subscription_id", name="uq_asynch_delivery_receiver"),
    # The claim and the sweep: due pending rows, sending rows by lease (a tenant's in-flight count).
    Index("ix_asynch_delivery_status_next", "status", "next_attempt_at"),
    Index("ix_asynch_delivery_status_lease", "status", "tenant_id", "lease_until"),
)

# The delivery log: one row per attempt.
delivery_attempts = Table(
    "asynch_delivery_attempt", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("delivery_id", BigId, ForeignKey("asynch_delivery.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("started_at", TS, nullable=False),
    Column("duration_ms", Integer, nullable=False),
    Column("address", String(64), nullable=True),
    Column("http_status", Integer, nullable=True),
    Column("error", Text, nullable=True),
    Index("ix_asynch_delivery_attempt_delivery", "delivery_id", "attempt"),
)

# Per-tenant callback signing secrets, generated on first use.
tenant_secrets = Table(
    "asynch_tenant_secret", metadata,
    Column("tenant_id", String(64), primary_key=True),
    Column("secret", String(128), nullable=False),
    Column("created_at", TS, nullable=False),
    Column("rotated_at", TS, nullable=True),
)

api_keys = Table(
    "asynch_api_keys", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("name", String(128), nullable=False, server_default=""),
    # The public, non-secret part of the key: lets a lookup find one row.
    Column("prefix", String(16), nullable=False, unique=True),
    # HMAC-SHA256(pepper, key), hex.  The key itself is never stored.
    Column("key_hash", String(64), nullable=False),
    Column("created_at", TS, nullable=False),
    Column("revoked_at", TS, nullable=True),
    Index("ix_asynch_api_keys_tenant", "tenant_id"),
)

# Per-tenant limits (revision 0006): the tenant-wide row has model_name ''
# (dispatch weight, request rate, long-poll cap); a row per model holds the
# tenant's queue cap on that model.  NULL: the default.
tenant_limits = Table(
    "asynch_tenant_limits", metadata,
    Column("tenant_id", String(64), primary_key=True),
    Column("model_name", String(128), primary_key=True, server_default=""),
    Column("weight", Integer, nullable=True),
    Column("rate_per_second", Float, nullable=True),
    Column("burst", Integer, nullable=True),
    Column("max_waiters", Integer, nullable=True),
    Column("queue_limit", Integer, nullable=True),
    Column("min_concurrency", Integer, nullable=True),    # revision 0020: per-model rows
    Column("burst_concurrency", Integer, nullable=True),
    Column("updated_at", TS, nullable=False),
)

# Every runtime-limit change autotune applied (revision 0003).
autotune_log = Table(
    "asynch_autotune_log", metadata,
    Column("id", BigInteger(), primary_key=True, autoincrement=True),
    Column("model_name", String(128), nullable=False),
    Column("old_max_concurrency", Integer, nullable=False),
    Column("new_max_concurrency", Integer, nullable=False),
    Column("old_queue_limit", Integer, nullable=False),
    Column("new_queue_limit", Integer, nullable=False),
    Column("action", String(16), nullable=False),
    Column("p90_seconds", Float, nullable=False),
    Column("throughput_per_second", Float, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("queued", Integer, nullable=False),
    Column("window_seconds", Integer, nullable=False),
    Column("created_at", TS, nullable=False),
    Index("ix_asynch_autotune_log_model_created", "model_name", "created_at"),
)
