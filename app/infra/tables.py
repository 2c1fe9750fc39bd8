"""Database tables (SQLAlchemy Core).  Alembic creates them; this module
only describes them so queries can be written against names, not strings."""
from __future__ import annotations

from sqlalchemy import (BigInteger, Boolean, Column, Date, DateTime, Float, ForeignKey, Index, Integer, LargeBinary,
                        MetaData, SmallInteger, String, Table, Text, UniqueConstraint, func, literal, text)
from sqlalchemy.dialects.postgresql import JSONB

from app.clock import now as clock_now
from app.states import JobState as S

metadata = MetaData()

TS = DateTime(timezone=True)


def _in(*states: S) -> str:
    return f"state = {int(states[0])}" if len(states) == 1 else f"state IN ({', '.join(str(int(x)) for x in states)})"


def read_at():
    """A column for a job read: when the read began (this process's clock, taken as the statement is built).  A
    job that has not ended shows its elapsed time up to its read (app/jobs/schemas.py), not up to whenever the
    row is rendered: a long-poll's last row is answered at the end of its budget, maybe after the job ended."""
    return literal(clock_now(), TS).label("read_at")


def _cols(type_, *names: str, **kw) -> list[Column]:
    return [Column(name, type_, **kw) for name in names]


def _partial(name: str, cols: list[str], where: str) -> Index:
    """An index over the rows ``where`` holds.  The planner uses it only for a predicate with literal
    states; psycopg2 sends bound values inline, so ``state IN (...)`` from parameters qualifies."""
    return Index(name, *cols, postgresql_where=text(where))


models = Table(
    "asynch_models", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("model_name", String(128), nullable=False, unique=True),
    Column("models_type", String(512), nullable=False, server_default=""),
    Column("form", JSONB()),
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
    Column("tenant_queue_limit", Integer),  # one tenant's slots; NULL: ASYNCH_TENANT_QUEUE_SHARE of queue_limit
    # What a modelKey sets ("*": any unprotected); NULL, never set: ASYNCH_MODEL_KEY_HEADERS_DEFAULT (revision 0024).
    Column("model_key_headers", Text),
    Column("max_completed", Integer, nullable=False, server_default="0"),  # done/claimed jobs kept; 0: no cap
    Column("streaming", Boolean, nullable=False, server_default=text("false")),  # output forwarded live (0026)
    *_cols(TS, "created_at", "updated_at", nullable=False),
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
    Column("callback_url", Text),
    Column("model_key", Text),  # per-job header override (seed: modelKey).  Secret: never returned.
    # Headers passed through to the OSS file service (JSON: Authorization, X-User-Info).  Secret:
    # never returned or logged; cleared when the job reaches a terminal state.
    Column("passthrough_headers", Text),
    # JSON text as received: jsonb would refuse \u0000, which JSON allows.
    Column("request_payload", Text, nullable=False),
    Column("request_hash", String(64), nullable=False),  # sha256 of payload + options: replays compare it
    Column("idempotency_key", String(255)),
    Column("state", SmallInteger, nullable=False),
    Column("attempt", Integer, nullable=False, server_default="0"),  # claims so far, the CAS token
    Column("retry_count", Integer, nullable=False, server_default="0"),  # retries taken, not the first try
    # Attempts the upstream answered busy (429/503), back to pending unspent: retries are attempt - busy_count.
    Column("busy_count", Integer, nullable=False, server_default="0"),
    Column("priority", SmallInteger, nullable=False, server_default="5"),  # 0-9, 9 first within the tenant's share
    Column("error", Text),  # what the tenant sees: "<code>: <short message>" (app/states.py JOB_ERROR_CODES)
    Column("error_detail", Text),  # the internals behind it (exception, the model's body): admin views only
    Column("result_location", Text),
    Column("result_content_type", String(255)),
    Column("result_size", BigInteger),
    Column("result_inline", LargeBinary),  # a small result kept in the row (location ``inline:``)
    Column("worker", String(255)),  # the node of the current attempt: recovery fails it when its heartbeat goes
    Column("created_at", TS, nullable=False),
    Column("enqueue_at", TS, nullable=False),  # queue order; a retry resets it (tail) or backdates it (head)
    *_cols(TS, "started_at", "finished_at", "lease_expires_at", "next_retry_at"),
    Column("deadline_at", TS),  # the job's budget: pending/running past it becomes timeout
    Column("caller_deadline_at", TS),  # X-Deadline: still pending past it becomes expired
    *_cols(TS, "claimed_at", "last_read_at", "expire_at"),  # last read: max_completed evicts the oldest
    Column("updated_at", TS, nullable=False),
    Column("promoted_at", TS),  # when a pending retry was published at high priority
    # The job's own webhook: a JSON POST on each terminal state whose bit is in webhook_events.
    Column("webhook_url", Text),
    Column("webhook_events", SmallInteger),
    # The payload by reference (X-Payload-File, a batch line's payload_file_id): an uploaded file of the job's
    # tenant whose bytes the worker streams to the upstream; request_payload is then {} (app/jobs/references.py).
    Column("payload_file_id", String(40)),
    # The job's W3C trace context (revision 0027, app/infra/tracing.py): what its spans join and its calls send.
    Column("traceparent", String(55)),
    Column("tracestate", String(512)),
    # One job per (tenant, Idempotency-Key); rows without a key stay out of it.
    Index("uq_asynch_task_idempotency", "tenant_id", "idempotency_key", unique=True,
          postgresql_where=text("idempotency_key IS NOT NULL")),
    # Listing: a tenant's jobs newest first, optionally by model; an admin's, every tenant's.
    Index("ix_asynch_task_created", "created_at", "id"),
    Index("ix_asynch_task_tenant_created", "tenant_id", "created_at"),
    Index("ix_asynch_task_tenant_model_created", "tenant_id", "model_name", "created_at"),
    Index("ix_asynch_task_model_state", "model_name", "state"),  # gate reconcile / depth: a model's active rows
    Index("ix_asynch_task_tenant_updated", "tenant_id", "updated_at"),  # a tenant's event stream (GET /v1/events)
    # Maintenance scans: a partial index per state, so a row version enters only its state's index.
    _partial("ix_asynch_task_retry_due", ["next_retry_at"], _in(S.RETRY_WAIT)),
    _partial("ix_asynch_task_running_lease", ["lease_expires_at"], _in(S.RUNNING)),
    _partial("ix_asynch_task_pending_enqueue", ["enqueue_at", "id"], _in(S.PENDING)),
    _partial("ix_asynch_task_pending_model_enqueue", ["model_name", "enqueue_at"], _in(S.PENDING)),  # queue heads
    _partial("ix_asynch_task_slot_deadline", ["deadline_at"], _in(S.PENDING, S.RUNNING)),
    _partial("ix_asynch_task_claimed_expire", ["expire_at"], _in(S.CLAIMED)),
    _partial("ix_asynch_task_ended_finished", ["finished_at"],
             _in(S.DONE, S.FAILED, S.TIMEOUT, S.CANCELED, S.EXPIRED)),
    # The expiry pass: pending jobs with a caller's deadline.
    _partial("ix_asynch_task_pending_caller_deadline", ["caller_deadline_at"],
             f"{_in(S.PENDING)} AND caller_deadline_at IS NOT NULL"),
    _partial("ix_asynch_task_finished_by_model", ["model_name", "finished_at"], "finished_at IS NOT NULL"),  # autotune
    # Retries waiting at the tail of a model's queue (the promotion scan).
    _partial("ix_asynch_task_retry_promote", ["model_name", "enqueue_at"],
             f"{_in(S.PENDING)} AND retry_count > 0 AND promoted_at IS NULL"),
)
# A model's done/claimed jobs, least recently read first: the max_completed eviction (app/jobs/retention.py).
Index("ix_asynch_task_completed_read", tasks.c.model_name, func.coalesce(tasks.c.last_read_at, tasks.c.finished_at),
      postgresql_where=text(_in(S.DONE, S.CLAIMED)))

# One row per ended attempt (running -> done / retry_wait / failed), by the transition's own statement.
task_attempts = Table(
    "asynch_task_attempt", metadata,
    Column("id", BigInteger(), primary_key=True, autoincrement=True),
    Column("job_id", String(40), ForeignKey("asynch_task.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker", String(255)),
    Column("started_at", TS),
    Column("ended_at", TS, nullable=False),
    Column("outcome", SmallInteger, nullable=False),  # the state the attempt left the job in
    Column("error", Text),
    Column("error_detail", Text),  # admin views only, as asynch_task.error_detail
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
# Ids tenants see (deliveries, subscriptions): random in [1, 2**53) (exact as a JSON number),
# not a sequence that shows every tenant the platform's volume.
RANDOM_ID = text("(floor(random() * 9007199254740990) + 1)::bigint")

# A tenant's webhook subscriptions (URL, event bits, its own whsec_ secret, encrypted: app/infra/secretbox.py).
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

# The outbox: one row per (job, receiver), written by a terminal transition's own statement
# (app/infra/delivery_rows.py): "callback" (the seed's GET on done) or "webhook" (a JSON POST);
# subscription_id 0 is the job's own.  pending -> sending (a lease) -> delivered | pending | failed.
deliveries = Table(
    "asynch_delivery", metadata,
    Column("id", BigId, primary_key=True, autoincrement=False, server_default=RANDOM_ID),
    Column("kind", String(16), nullable=False),
    Column("job_id", String(40), ForeignKey("asynch_task.id", ondelete="CASCADE"), nullable=False),
    Column("tenant_id", String(64), nullable=False),
    Column("subscription_id", BigInteger, nullable=False, server_default="0"),
    Column("event", String(16), nullable=False),
    # The request frozen at the first attempt (retries and replays send the same bytes): a
    # callback's full URL (no payload: the signature covers the target), a webhook's JSON body.
    Column("url", Text, nullable=False),
    Column("payload", Text),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", TS, nullable=False),
    Column("lease_until", TS),
    Column("last_error", Text),
    Column("delivered_at", TS),
    *_cols(TS, "created_at", "updated_at", nullable=False),
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
    Column("address", String(64)),
    Column("http_status", Integer),
    Column("error", Text),
    Index("ix_asynch_delivery_attempt_delivery", "delivery_id", "attempt"),
)

# Per-tenant callback signing secrets, generated on first use.
tenant_secrets = Table(
    "asynch_tenant_secret", metadata,
    Column("tenant_id", String(64), primary_key=True),
    Column("secret", String(128), nullable=False),
    Column("created_at", TS, nullable=False),
    Column("rotated_at", TS),
)

api_keys = Table(
    "asynch_api_keys", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("name", String(128), nullable=False, server_default=""),
    Column("prefix", String(16), nullable=False, unique=True),  # the key's public part: a lookup finds one row
    Column("key_hash", String(64), nullable=False),  # HMAC-SHA256(pepper, key), hex; the key is never stored
    Column("created_at", TS, nullable=False),
    Column("revoked_at", TS),
    Index("ix_asynch_api_keys_tenant", "tenant_id"),
)

# Per-tenant limits: the tenant-wide row has model_name '' (dispatch weight, request rate,
# long-poll cap); a row per model holds the tenant's caps on that model.  NULL: the default.
tenant_limits = Table(
    "asynch_tenant_limits", metadata,
    Column("tenant_id", String(64), primary_key=True),
    Column("model_name", String(128), primary_key=True, server_default=""),
    Column("weight", Integer),
    Column("rate_per_second", Float),
    *_cols(Integer, "burst", "max_waiters", "queue_limit", "min_concurrency", "burst_concurrency", "busy_budget"),
    Column("updated_at", TS, nullable=False),
)

# Every runtime-limit change autotune applied.
autotune_log = Table(
    "asynch_autotune_log", metadata,
    Column("id", BigInteger(), primary_key=True, autoincrement=True),
    Column("model_name", String(128), nullable=False),
    *_cols(Integer, "old_max_concurrency", "new_max_concurrency", "old_queue_limit", "new_queue_limit", nullable=False),
    Column("action", String(16), nullable=False),
    *_cols(Float, "p90_seconds", "throughput_per_second", nullable=False),
    *_cols(Integer, "samples", "queued", "window_seconds", nullable=False),
    Column("created_at", TS, nullable=False),
    Index("ix_asynch_autotune_log_model_created", "model_name", "created_at"),
)

# Uploaded files (/v1/files, app/files/): the bytes are in storage at ``location``, never in a row.
files = Table(
    "asynch_files", metadata,
    Column("id", String(40), primary_key=True),  # file-<hex>
    Column("tenant_id", String(64), nullable=False),
    Column("filename", Text, nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("location", Text, nullable=False),
    Column("created_at", TS, nullable=False),
    Column("expires_at", TS),  # expires_after, honoured: gone (404) past it, its object deleted by the sweep
    Index("ix_asynch_files_tenant_created", "tenant_id", "created_at", "id"),
    _partial("ix_asynch_files_expires", ["expires_at"], "expires_at IS NOT NULL"),
)

# Batches (/v1/batches, app/batches/): OpenAI's batch object; its lines are asynch_batch_items.
batches = Table(
    "asynch_batches", metadata,
    Column("id", String(40), primary_key=True),  # batch_<hex>
    Column("tenant_id", String(64), nullable=False),
    Column("endpoint", String(255), nullable=False),
    Column("input_file_id", String(40), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False),  # OpenAI's names (app/batches/schemas.py)
    Column("errors", JSONB()),  # validation: [{"code", "message", "param", "line"}]
    Column("output_file_id", String(40)),
    Column("error_file_id", String(40)),
    Column("metadata", JSONB()),
    Column("total", Integer, nullable=False, server_default="0"),
    Column("completed", Integer, nullable=False, server_default="0"),
    Column("failed", Integer, nullable=False, server_default="0"),
    Column("admitted", Integer, nullable=False, server_default="0"),  # lines admitted as jobs so far
    Column("segments", Integer, nullable=False, server_default="0"),  # output pieces written (batches/<id>/seg-N)
    Column("ending", String(16)),  # set once: the final status the batch is heading to (expired / cancelled)
    Column("created_at", TS, nullable=False),
    Column("expires_at", TS, nullable=False),  # created_at + the completion window: every line's deadline
    *_cols(TS, "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
           "cancelled_at"),
    Column("updated_at", TS, nullable=False),
    Index("ix_asynch_batches_tenant_created", "tenant_id", "created_at", "id"),
    _partial("ix_asynch_batches_open", ["updated_at"], "status IN ('in_progress', 'cancelling', 'finalizing')"),
)

batch_items = Table(
    "asynch_batch_items", metadata,
    Column("batch_id", String(40), ForeignKey("asynch_batches.id", ondelete="CASCADE"), primary_key=True),
    Column("line_no", Integer, primary_key=True),  # 1-based, as OpenAI's errors count lines
    Column("custom_id", Text, nullable=False),
    Column("model_name", String(128), nullable=False),
    Column("byte_offset", BigInteger, nullable=False),  # the line in the input file: its body is read from there
    Column("byte_len", Integer, nullable=False),
    Column("job_id", String(40)),  # NULL: not admitted yet
    Column("outcome", String(16)),  # NULL until written to the output: completed / failed / expired / cancelled
    _partial("ix_asynch_batch_items_unadmitted", ["batch_id", "line_no"], "job_id IS NULL AND outcome IS NULL"),
    _partial("ix_asynch_batch_items_open", ["batch_id", "line_no"], "job_id IS NOT NULL AND outcome IS NULL"),
)
