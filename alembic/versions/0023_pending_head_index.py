"""a model's pending jobs by queue time: the head of each queue in one probe

Revision ID: 0023_pending_head_index
Revises: 0022_upstream_busy
Create Date: 2026-12-03

The operator reads (the cluster scrape's oldest-pending age, the overview,
the console's models page: app/observe/live.py) ask each model for the
enqueue_at of its oldest pending job.  On ix_asynch_task_pending_enqueue
(every model's pending rows by time) a model whose jobs are newer than
another model's backlog walked that backlog first; this partial index
answers min(enqueue_at) of one model with its first entry (issue 25, goal 4:
reads constant at any depth).  Only pending row versions enter it.  Built
CONCURRENTLY (no write lock on a live table).
"""
import sqlalchemy as sa
from alembic import op

revision = "0023_pending_head_index"
down_revision = "0022_upstream_busy"
branch_labels = None
depends_on = None

NAME = "ix_asynch_task_pending_model_enqueue"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(NAME, "asynch_task", ["model_name", "enqueue_at"], postgresql_where=sa.text("state = 0"),
                        postgresql_concurrently=True)


def downgrade() -> None:
    op.drop_index(NAME, table_name="asynch_task")
