"""idempotency keys: a partial unique index instead of a full constraint

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

Most jobs carry no Idempotency-Key, yet the full UNIQUE (tenant_id,
idempotency_key) constraint put every row version (admission and each
transition) into its index.  A unique index over only the rows that have a
key enforces the same rule (NULLs never conflicted) and leaves the rest out.
The lookup (tenant_id = :t AND idempotency_key = :k) implies the predicate,
so it still uses the index.  On PostgreSQL the index is built CONCURRENTLY
before the constraint is dropped, so uniqueness holds throughout.
"""
from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

NEW = "uq_asynch_task_idempotency"
OLD = "uq_asynch_task_idem"
WHERE = "idempotency_key IS NOT NULL"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        with op.get_context().autocommit_block():
            op.create_index(NEW, "asynch_task", ["tenant_id", "idempotency_key"], unique=True,
                            postgresql_where=sa.text(WHERE), postgresql_concurrently=True)
        op.drop_constraint(OLD, "asynch_task", type_="unique")
    else:
        with op.batch_alter_table("asynch_task") as batch:
            batch.drop_constraint(OLD, type_="unique")
        op.create_index(NEW, "asynch_task", ["tenant_id", "idempotency_key"], unique=True,
                        sqlite_where=sa.text(WHERE))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_unique_constraint(OLD, "asynch_task", ["tenant_id", "idempotency_key"])
        op.drop_index(NEW, table_name="asynch_task")
    else:
        op.drop_index(NEW, table_name="asynch_task")
        with op.batch_alter_table("asynch_task") as batch:
            batch.create_unique_constraint(OLD, ["tenant_id", "idempotency_key"])
