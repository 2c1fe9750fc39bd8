"""fair dispatch by cost: a tenant's guaranteed minimum and burst ceiling of concurrent jobs per model

Revision ID: 0018_tenant_min_burst
Revises: 0017_random_delivery_ids
Create Date: 2026-12-02

asynch_tenant_limits' per-model rows (model_name set) gain min_concurrency
(reserved for the tenant whenever it has work) and burst_concurrency (its
ceiling on the model, never above max_concurrency); NULL: none.  Redis holds
the copy each model's dispatch steps read (asynch:dq:shares:{model}),
rebuilt from here.
"""
from alembic import op
import sqlalchemy as sa

revision = "0018_tenant_min_burst"
down_revision = "0017_random_delivery_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("asynch_tenant_limits") as batch:
        batch.add_column(sa.Column("min_concurrency", sa.Integer, nullable=True))
        batch.add_column(sa.Column("burst_concurrency", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("asynch_tenant_limits") as batch:
        batch.drop_column("burst_concurrency")
        batch.drop_column("min_concurrency")
