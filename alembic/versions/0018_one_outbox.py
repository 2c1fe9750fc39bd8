"""one outbox: callbacks and webhooks are two kinds of one delivery table

Revision ID: 0018_one_outbox
Revises: 0017_random_delivery_ids
Create Date: 2026-12-02

asynch_callback + asynch_webhook_delivery become asynch_delivery (a ``kind``
column: callback | webhook), asynch_callback_attempt +
asynch_webhook_attempt become asynch_delivery_attempt (issue 22 item 3).
Every row moves with its log, its status and its id (a webhook delivery's
id is its ``webhook-id``; a callback whose id a webhook delivery already
holds takes a new random one).  A callback row moved here keeps the URL it
was signed with; its payload is frozen empty.  The downgrade splits the
table back by kind.
"""
from alembic import op
import sqlalchemy as sa

revision = "0018_one_outbox"
down_revision = "0017_random_delivery_ids"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
RANDOM_ID = "(floor(random() * 9007199254740990) + 1)::bigint"  # app/infra/tables.py RANDOM_ID
STATE = "status, attempts, next_attempt_at, lease_until, last_error, delivered_at, created_at, updated_at"
LOG = "attempt, started_at, duration_ms, address, http_status, error"


def upgrade() -> None:
    op.create_table(
        "asynch_delivery",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False, server_default=sa.text(RANDOM_ID)),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("asynch_task.id", ondelete="CASCADE"), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("subscription_id", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("payload", sa.Text, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", TS, nullable=False),
        sa.Column("lease_until", TS, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("delivered_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("job_id", "kind", "subscription_id", name="uq_asynch_delivery_receiver"),
    )
    op.create_index("ix_asynch_delivery_status_next", "asynch_delivery", ["status", "next_attempt_at"])
    op.create_index("ix_asynch_delivery_status_lease", "asynch_delivery", ["status", "tenant_id", "lease_until"])
    op.create_table(
        "asynch_delivery_attempt",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.BigInteger, sa.ForeignKey("asynch_delivery.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("http_status", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_index("ix_asynch_delivery_attempt_delivery", "asynch_delivery_attempt", ["delivery_id", "attempt"])
    op.execute(f"INSERT INTO asynch_delivery (id, kind, job_id, tenant_id, subscription_id, event, url, payload, {STATE}) "
               f"SELECT id, 'webhook', job_id, tenant_id, subscription_id, event, url, payload, {STATE} "
               "FROM asynch_webhook_delivery")
    op.execute(f"INSERT INTO asynch_delivery_attempt (delivery_id, {LOG}) SELECT delivery_id, {LOG} "
               "FROM asynch_webhook_attempt ORDER BY id")
    op.execute("CREATE TEMP TABLE callback_ids ON COMMIT DROP AS SELECT id AS old, CASE WHEN id IN "
               f"(SELECT id FROM asynch_delivery) THEN {RANDOM_ID} ELSE id END AS new FROM asynch_callback")
    op.execute(f"INSERT INTO asynch_delivery (id, kind, job_id, tenant_id, subscription_id, event, url, payload, {STATE}) "
               f"SELECT m.new, 'callback', job_id, tenant_id, 0, 'done', url, '', {STATE} "
               "FROM asynch_callback c JOIN callback_ids m ON m.old = c.id")
    op.execute(f"INSERT INTO asynch_delivery_attempt (delivery_id, {LOG}) SELECT m.new, {LOG} "
               "FROM asynch_callback_attempt a JOIN callback_ids m ON m.old = a.callback_id ORDER BY a.id")
    for table in ("asynch_webhook_attempt", "asynch_webhook_delivery", "asynch_callback_attempt", "asynch_callback"):
        op.drop_table(table)


def downgrade() -> None:
    op.execute("CREATE TABLE asynch_callback (id BIGSERIAL PRIMARY KEY, "
               "job_id VARCHAR(40) NOT NULL UNIQUE REFERENCES asynch_task(id) ON DELETE CASCADE, "
               "tenant_id VARCHAR(64) NOT NULL, url TEXT NOT NULL, status VARCHAR(16) NOT NULL, "
               "attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at TIMESTAMPTZ NOT NULL, lease_until TIMESTAMPTZ, "
               "last_error TEXT, delivered_at TIMESTAMPTZ, created_at TIMESTAMPTZ NOT NULL, "
               "updated_at TIMESTAMPTZ NOT NULL)")
    op.execute("CREATE TABLE asynch_webhook_delivery (id BIGSERIAL PRIMARY KEY, "
               "job_id VARCHAR(40) NOT NULL REFERENCES asynch_task(id) ON DELETE CASCADE, "
               "tenant_id VARCHAR(64) NOT NULL, subscription_id BIGINT NOT NULL DEFAULT 0, "
               "event VARCHAR(16) NOT NULL, url TEXT NOT NULL, payload TEXT, status VARCHAR(16) NOT NULL, "
               "attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at TIMESTAMPTZ NOT NULL, lease_until TIMESTAMPTZ, "
               "last_error TEXT, delivered_at TIMESTAMPTZ, created_at TIMESTAMPTZ NOT NULL, "
               "updated_at TIMESTAMPTZ NOT NULL, "
               "CONSTRAINT uq_asynch_webhook_delivery_job_sub UNIQUE (job_id, subscription_id))")
    for parent, fk in (("asynch_callback", "callback_id"), ("asynch_webhook_delivery", "delivery_id")):
        op.execute(f"ALTER TABLE {parent} ALTER COLUMN id SET DEFAULT {RANDOM_ID}")  # as 0017 left it
        attempt = parent.replace("_delivery", "") + "_attempt"
        op.execute(f"CREATE TABLE {attempt} (id BIGSERIAL PRIMARY KEY, "
                   f"{fk} BIGINT NOT NULL REFERENCES {parent}(id) ON DELETE CASCADE, attempt INTEGER NOT NULL, "
                   "started_at TIMESTAMPTZ NOT NULL, duration_ms INTEGER NOT NULL, address VARCHAR(64), "
                   "http_status INTEGER, error TEXT)")
        op.create_index(f"ix_{attempt}_{fk.split('_')[0]}", attempt, [fk, "attempt"])
        op.create_index(f"ix_{parent}_status_next", parent, ["status", "next_attempt_at"])
        op.create_index(f"ix_{parent}_status_lease", parent, ["status", "lease_until"])
    op.execute(f"INSERT INTO asynch_webhook_delivery (id, job_id, tenant_id, subscription_id, event, url, payload, "
               f"{STATE}) SELECT id, job_id, tenant_id, subscription_id, event, url, payload, {STATE} "
               "FROM asynch_delivery WHERE kind = 'webhook'")
    op.execute(f"INSERT INTO asynch_callback (id, job_id, tenant_id, url, {STATE}) "
               f"SELECT id, job_id, tenant_id, url, {STATE} FROM asynch_delivery WHERE kind = 'callback'")
    for attempt, fk, kind in (("asynch_webhook_attempt", "delivery_id", "webhook"),
                              ("asynch_callback_attempt", "callback_id", "callback")):
        op.execute(f"INSERT INTO {attempt} ({fk}, {LOG}) SELECT a.delivery_id, {', '.join('a.' + c for c in LOG.split(', '))} "
                   f"FROM asynch_delivery_attempt a JOIN asynch_delivery d ON d.id = a.delivery_id "
                   f"WHERE d.kind = '{kind}' ORDER BY a.id")
    op.drop_table("asynch_delivery_attempt")
    op.drop_table("asynch_delivery")
