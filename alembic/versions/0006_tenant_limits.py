"""capacity isolation: a per-tenant queue cap per model, and tenant limits

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

- asynch_models.tenant_queue_limit: how many of a model's queue_limit slots
  one tenant may hold (NULL: ASYNCH_TENANT_QUEUE_SHARE of queue_limit).
- asynch_tenant_limits: per tenant, its dispatch weight, request rate,
  long-poll cap (model_name '') and its queue cap per model (model_name set).
  Rows are the truth; Redis holds the weights the dispatcher reads, rebuilt
  from here.
"""
from alembic import op
import sqlalchemy as sa

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("asynch_models") as batch:
        batch.add_column(sa.Column("tenant_queue_limit", sa.Integer, nullable=True))
    op.create_table(
        "asynch_tenant_limits",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        # '' for the tenant-wide row; a model's name for that model's queue cap.
        sa.Column("model_name", sa.String(128), primary_key=True, server_default=""),
        sa.Column("weight", sa.Integer, nullable=True),
        sa.Column("rate_per_second", sa.Float, nullable=True),
        sa.Column("burst", sa.Integer, nullable=True),
        sa.Column("max_waiters", sa.Integer, nullable=True),
        sa.Column("queue_limit", sa.Integer, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("asynch_tenant_limits")
    with op.batch_alter_table("asynch_models") as batch:
        batch.drop_column("tenant_queue_limit")
