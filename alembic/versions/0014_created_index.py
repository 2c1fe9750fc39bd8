"""the admin's job listing at depth: an index in its sort order

Revision ID: 0014_created_index
Revises: 0013_client_features
Create Date: 2026-12-01

GET /v1/jobs with an admin key and no tenant lists every tenant's jobs
newest first (ORDER BY created_at DESC, id DESC).  No index had that order,
so at 1,000,000 rows the page sorted the table: 836 ms (bench_backlog).
On a large table, build it beforehand with CREATE INDEX CONCURRENTLY under
the same name; this revision then skips it (docs/operations.md, upgrades).
"""
from alembic import op

revision = "0014_created_index"
down_revision = "0013_client_features"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_asynch_task_created", "asynch_task", ["created_at", "id"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_asynch_task_created", table_name="asynch_task")
