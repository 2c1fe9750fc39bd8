"""one outbox: callbacks and webhooks are two kinds of one delivery table

Revision ID: 0021_one_outbox
Revises: 0020_tenant_min_burst
Create Date: 2026-12-02

asynch_webhook_delivery becomes asynch_delivery (a ``kind`` column: webhook
| callback; unique per (job, kind, receiver)) and asynch_webhook_attempt
asynch_delivery_attempt, renamed in place (issue 22 item 3).  Every callback
row then moves in with its log, its status and its id (a webhook delivery's
id is its ``webhook-id``; a callback whose id a webhook delivery already
holds takes a new random one), frozen as it was signed (its payload empty),
and asynch_callback / asynch_callback_attempt are dropped.  The downgrade
moves the callbacks back out and renames the rest back.
"""
from alembic import op

revision = "0021_one_outbox"
down_revision = "0020_tenant_min_burst"
branch_labels = None
depends_on = None

RANDOM_ID = "(floor(random() * 9007199254740990) + 1)::bigint"  # app/infra/tables.py RANDOM_ID
STATE = "status, attempts, next_attempt_at, lease_until, last_error, delivered_at, created_at, updated_at"
LOG = "attempt, started_at, duration_ms, address, http_status, error"
ALOG = ", ".join("a." + c for c in LOG.split(", "))
# (old name, new name) of the tables and indexes renamed in place.
RENAMED = [("TABLE asynch_webhook_delivery", "asynch_delivery"), ("TABLE asynch_webhook_attempt", "asynch_delivery_attempt"),
           ("INDEX asynch_webhook_delivery_pkey", "asynch_delivery_pkey"),
           ("INDEX asynch_webhook_attempt_pkey", "asynch_delivery_attempt_pkey"),
           ("INDEX ix_asynch_webhook_delivery_status_next", "ix_asynch_delivery_status_next"),
           ("INDEX ix_asynch_webhook_attempt_delivery", "ix_asynch_delivery_attempt_delivery")]


def _rename(back: bool) -> None:
    for old, new in RENAMED:
        kind, name = old.split()
        op.execute(f"ALTER {kind} {new} RENAME TO {name}" if back else f"ALTER {old} RENAME TO {new}")


def upgrade() -> None:
    _rename(back=False)
    op.execute("ALTER TABLE asynch_delivery ADD COLUMN kind VARCHAR(16) NOT NULL DEFAULT 'webhook'")
    op.execute("ALTER TABLE asynch_delivery ALTER COLUMN kind DROP DEFAULT")
    op.execute("ALTER TABLE asynch_delivery DROP CONSTRAINT uq_asynch_webhook_delivery_job_sub")
    op.execute("ALTER TABLE asynch_delivery ADD CONSTRAINT uq_asynch_delivery_receiver UNIQUE (job_id, kind, subscription_id)")
    op.execute("DROP INDEX ix_asynch_webhook_delivery_status_lease")
    op.create_index("ix_asynch_delivery_status_lease", "asynch_delivery", ["status", "tenant_id", "lease_until"])
    op.execute("CREATE TEMP TABLE callback_ids AS SELECT id AS old, CASE WHEN id IN "
               f"(SELECT id FROM asynch_delivery) THEN {RANDOM_ID} ELSE id END AS new FROM asynch_callback")
    op.execute(f"INSERT INTO asynch_delivery (id, kind, job_id, tenant_id, subscription_id, event, url, payload, {STATE}) "
               f"SELECT m.new, 'callback', job_id, tenant_id, 0, 'done', url, '', {STATE} "
               "FROM asynch_callback c JOIN callback_ids m ON m.old = c.id")
    op.execute(f"INSERT INTO asynch_delivery_attempt (delivery_id, {LOG}) SELECT m.new, {ALOG} "
               "FROM asynch_callback_attempt a JOIN callback_ids m ON m.old = a.callback_id ORDER BY a.id")
    op.execute("DROP TABLE callback_ids, asynch_callback_attempt, asynch_callback")


def downgrade() -> None:
    op.execute("CREATE TABLE asynch_callback (id BIGSERIAL PRIMARY KEY, "
               "job_id VARCHAR(40) NOT NULL UNIQUE REFERENCES asynch_task(id) ON DELETE CASCADE, "
               "tenant_id VARCHAR(64) NOT NULL, url TEXT NOT NULL, status VARCHAR(16) NOT NULL, "
               "attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at TIMESTAMPTZ NOT NULL, lease_until TIMESTAMPTZ, "
               "last_error TEXT, delivered_at TIMESTAMPTZ, created_at TIMESTAMPTZ NOT NULL, "
               "updated_at TIMESTAMPTZ NOT NULL)")
    op.execute(f"ALTER TABLE asynch_callback ALTER COLUMN id SET DEFAULT {RANDOM_ID}")  # as 0017 left it
    op.create_index("ix_asynch_callback_status_next", "asynch_callback", ["status", "next_attempt_at"])
    op.create_index("ix_asynch_callback_status_lease", "asynch_callback", ["status", "lease_until"])
    op.execute("CREATE TABLE asynch_callback_attempt (id BIGSERIAL PRIMARY KEY, callback_id BIGINT NOT NULL "
               "REFERENCES asynch_callback(id) ON DELETE CASCADE, attempt INTEGER NOT NULL, "
               "started_at TIMESTAMPTZ NOT NULL, duration_ms INTEGER NOT NULL, address VARCHAR(64), "
               "http_status INTEGER, error TEXT)")
    op.create_index("ix_asynch_callback_attempt_callback", "asynch_callback_attempt", ["callback_id", "attempt"])
    op.execute(f"INSERT INTO asynch_callback (id, job_id, tenant_id, url, {STATE}) "
               f"SELECT id, job_id, tenant_id, url, {STATE} FROM asynch_delivery WHERE kind = 'callback'")
    op.execute(f"INSERT INTO asynch_callback_attempt (callback_id, {LOG}) SELECT a.delivery_id, {ALOG} "
               "FROM asynch_delivery_attempt a JOIN asynch_delivery d ON d.id = a.delivery_id "
               "WHERE d.kind = 'callback' ORDER BY a.id")
    op.execute("DELETE FROM asynch_delivery WHERE kind = 'callback'")  # their attempts cascade
    op.execute("DROP INDEX ix_asynch_delivery_status_lease")
    op.create_index("ix_asynch_webhook_delivery_status_lease", "asynch_delivery", ["status", "lease_until"])
    op.execute("ALTER TABLE asynch_delivery DROP CONSTRAINT uq_asynch_delivery_receiver")
    op.execute("ALTER TABLE asynch_delivery DROP COLUMN kind")
    op.execute("ALTER TABLE asynch_delivery ADD CONSTRAINT uq_asynch_webhook_delivery_job_sub UNIQUE (job_id, subscription_id)")
    _rename(back=True)
