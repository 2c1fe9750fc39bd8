"""the attempt log: one row per ended attempt of a job (the console's job page)

Revision ID: 0016_job_attempts
Revises: 0015_webhooks
Create Date: 2026-12-02

The job row keeps its latest attempt only: a retry that then succeeded
left no trace of the first attempt's error.  Each attempt that ends
(running -> done, retry_wait or failed) now appends a row here, written by
the same statement as the transition (app/transitions.py), so the log and
the row cannot disagree.  Rows go with their job (ON DELETE CASCADE).
"""
import sqlalchemy as sa
from alembic import op

revision = "0016_job_attempts"
down_revision = "0015_webhooks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "asynch_task_attempt",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("asynch_task.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.SmallInteger, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("error_detail", sa.Text, nullable=True),
    )
    op.create_index("ix_asynch_task_attempt_job", "asynch_task_attempt", ["job_id", "attempt"])


def downgrade() -> None:
    op.drop_index("ix_asynch_task_attempt_job", table_name="asynch_task_attempt")
    op.drop_table("asynch_task_attempt")
