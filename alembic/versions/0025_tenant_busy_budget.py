"""asynch_tenant_limits.busy_budget: a tenant's own budget of free busy answers

Revision ID: 0025_tenant_busy_budget
Revises: 0024_model_key_headers_default
Create Date: 2026-12-07

A busy answer (429/503) returns its job to the queue unspent while its tenant
has free busy answers in hand on the model (issue 31 item 1,
app/infra/redis/upstream.py): ASYNCH_UPSTREAM_BUSY_BUDGET, or this column of
the tenant-wide row (model_name '') when set.
"""
import sqlalchemy as sa
from alembic import op

revision = "0025_tenant_busy_budget"
down_revision = "0024_model_key_headers_default"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("asynch_tenant_limits", sa.Column("busy_budget", sa.Integer, nullable=True))


def downgrade() -> None:
    op.drop_column("asynch_tenant_limits", "busy_budget")
