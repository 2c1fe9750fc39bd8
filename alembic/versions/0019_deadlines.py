"""the caller's deadline (X-Deadline): asynch_task.caller_deadline_at and the expiry pass's index

Revision ID: 0019_deadlines
Revises: 0018_completed_read_index
Create Date: 2026-12-02

A job submitted with a deadline keeps it in ``caller_deadline_at`` (nullable:
jobs without one have none).  ``deadline_at`` already holds the job's whole
budget (timeout), so the caller's is a column of its own.  A pending job past
it becomes expired (state 8): the pass scans the partial index over only
pending rows that have one.  The ended-jobs index (cleanup's retention scan)
now covers expired too.
"""
import sqlalchemy as sa
from alembic import op

revision = "0019_deadlines"
down_revision = "0018_completed_read_index"
branch_labels = None
depends_on = None

ENDED = "ix_asynch_task_ended_finished"


def _index(name: str, cols: list[str], where: str) -> None:
    with op.get_context().autocommit_block():
        op.drop_index(name, table_name="asynch_task", postgresql_concurrently=True, if_exists=True)
        op.create_index(name, "asynch_task", cols, postgresql_where=sa.text(where), postgresql_concurrently=True)


def upgrade() -> None:
    op.add_column("asynch_task", sa.Column("caller_deadline_at", sa.DateTime(timezone=True), nullable=True))
    _index("ix_asynch_task_pending_caller_deadline", ["caller_deadline_at"],
           "state = 0 AND caller_deadline_at IS NOT NULL")
    _index(ENDED, ["finished_at"], "state IN (2, 3, 5, 6, 8)")


def downgrade() -> None:
    _index(ENDED, ["finished_at"], "state IN (2, 3, 5, 6)")
    op.drop_index("ix_asynch_task_pending_caller_deadline", table_name="asynch_task")
    op.drop_column("asynch_task", "caller_deadline_at")
