"""client features (issue 16): a tenant's event stream, job priorities

Revision ID: 0013_client_features
Revises: 0012_seed_dropin
Create Date: 2026-12-01

- ix_asynch_task_tenant_updated (tenant_id, updated_at): GET /v1/events
  reads a tenant's jobs changed since its cursor (app/jobs/events.py).
- asynch_task.priority (0-9, default 5, 9 first): orders dispatch within a
  tenant's queue (app/jobs/dispatch.py ``order_score``).
"""
from alembic import op
import sqlalchemy as sa

revision = "0013_client_features"
down_revision = "0012_seed_dropin"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_asynch_task_tenant_updated", "asynch_task", ["tenant_id", "updated_at"])
    with op.batch_alter_table("asynch_task") as batch:
        batch.add_column(sa.Column("priority", sa.SmallInteger, nullable=False, server_default="5"))


def downgrade() -> None:
    with op.batch_alter_table("asynch_task") as batch:
        batch.drop_column("priority")
    op.drop_index("ix_asynch_task_tenant_updated", table_name="asynch_task")
