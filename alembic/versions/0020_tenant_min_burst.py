"""fair dispatch by cost: a tenant's guaranteed minimum and burst ceiling of concurrent jobs per model

Revision ID: 0020_tenant_min_burst
Revises: 0019_deadlines
Create Date: 2026-12-02

asynch_tenant_limits' per-model rows (model_name set) gain min_concurrency
(reserved for the tenant whenever it has work) and burst_concurrency (its
ceiling on the model, never above max_concurrency); NULL: none.  Redis holds
the copy each model's dispatch steps read (asynch:dq:shares:{model}),
rebuilt from here.
"""
import sqlalchemy as sa
from alembic import op

revision = "0020_tenant_min_burst"
down_revision = "0019_deadlines"
branch_labels = depends_on = None
COLUMNS = ("min_concurrency", "burst_concurrency")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("asynch_tenant_limits", sa.Column(name, sa.Integer, nullable=True))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("asynch_tenant_limits", name)
