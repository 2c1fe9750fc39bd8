"""a model's done/claimed jobs by last read: max_completed eviction at admission

Revision ID: 0018_completed_read_index
Revises: 0017_random_delivery_ids
Create Date: 2026-12-02

Seed 000 evicts the least recently read completed jobs at admission (issue
23 item 6): every submit to a model with max_completed > 0 deletes its
completed jobs beyond the cap, least recently read first
(app/jobs/retention.py).  This partial index answers that ORDER BY
COALESCE(last_read_at, finished_at) ... LIMIT for one model without a sort
of the model's completed rows; only done and claimed row versions enter
it.  Built CONCURRENTLY on PostgreSQL (no write lock on a live table).
"""
from alembic import op
import sqlalchemy as sa

revision = "0018_completed_read_index"
down_revision = "0017_random_delivery_ids"
branch_labels = None
depends_on = None

NAME = "ix_asynch_task_completed_read"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(NAME, "asynch_task", ["model_name", sa.text("COALESCE(last_read_at, finished_at)")],
                        postgresql_where=sa.text("state IN (2, 4)"), postgresql_concurrently=True)


def downgrade() -> None:
    op.drop_index(NAME, table_name="asynch_task")
