"""webhooks on every terminal state (issue 16 item 5)

Revision ID: 0015_webhooks
Revises: 0014_created_index
Create Date: 2026-12-02

- asynch_task.webhook_url / webhook_events: a job's own webhook (a JSON
  POST on each terminal state whose bit is set).
- asynch_webhook_subscription: a tenant's webhooks (URL, event bits, a
  whsec_ secret encrypted at rest).
- asynch_webhook_delivery: one per (job, receiver), inserted by the
  terminal transition's own statement; unique (job_id, subscription_id),
  0 being the job's own webhook.
- asynch_webhook_attempt: the delivery log, one row per attempt.
"""
from alembic import op
import sqlalchemy as sa

revision = "0015_webhooks"
down_revision = "0014_created_index"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("asynch_task") as batch:
        batch.add_column(sa.Column("webhook_url", sa.Text, nullable=True))
        batch.add_column(sa.Column("webhook_events", sa.SmallInteger, nullable=True))
    op.create_table(
        "asynch_webhook_subscription",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", sa.SmallInteger, nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_asynch_webhook_subscription_tenant", "asynch_webhook_subscription", ["tenant_id"])
    op.create_table(
        "asynch_webhook_delivery",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
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
        sa.UniqueConstraint("job_id", "subscription_id", name="uq_asynch_webhook_delivery_job_sub"),
    )
    op.create_index("ix_asynch_webhook_delivery_status_next", "asynch_webhook_delivery", ["status", "next_attempt_at"])
    op.create_index("ix_asynch_webhook_delivery_status_lease", "asynch_webhook_delivery", ["status", "lease_until"])
    op.create_table(
        "asynch_webhook_attempt",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", BigId, sa.ForeignKey("asynch_webhook_delivery.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("http_status", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_index("ix_asynch_webhook_attempt_delivery", "asynch_webhook_attempt", ["delivery_id", "attempt"])


def downgrade() -> None:
    op.drop_table("asynch_webhook_attempt")
    op.drop_table("asynch_webhook_delivery")
    op.drop_table("asynch_webhook_subscription")
    with op.batch_alter_table("asynch_task") as batch:
        batch.drop_column("webhook_events")
        batch.drop_column("webhook_url")
