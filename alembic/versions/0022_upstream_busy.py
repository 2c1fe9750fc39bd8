"""asynch_task.busy_count: the busy answers (429/503) a job's attempts got

Revision ID: 0022_upstream_busy
Revises: 0021_one_outbox
Create Date: 2026-12-02

An attempt the model's upstream answers busy goes back to pending without
spending a retry (issue 24 item 2, app/jobs/execution.py): the attempts a
job's retries count are ``attempt - busy_count``, and the busy answers it
may get that way are capped by ASYNCH_UPSTREAM_BUSY_BUDGET.
"""
import sqlalchemy as sa
from alembic import op

revision = "0022_upstream_busy"
down_revision = "0021_one_outbox"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("asynch_task", sa.Column("busy_count", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("asynch_task", "busy_count")
