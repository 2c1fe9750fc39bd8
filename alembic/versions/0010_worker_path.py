"""the worker path: small results in the row, and who runs each attempt

Revision ID: 0010_worker_path
Revises: 0006
Create Date: 2026-12-01

- asynch_task.result_inline: a result of at most ASYNCH_INLINE_RESULT_BYTES
  is kept in the row (its location is ``inline:``): the worker's done
  statement stores it, no object storage round trip, nothing to delete at
  cleanup.
- asynch_task.worker: the Celery node whose pool runs the current attempt,
  set by the claim.  When that node's liveness heartbeat is gone, recovery
  fails the attempt at once instead of waiting for its lease.
"""
from alembic import op
import sqlalchemy as sa

revision = "0010_worker_path"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("asynch_task") as batch:
        batch.add_column(sa.Column("result_inline", sa.LargeBinary, nullable=True))
        batch.add_column(sa.Column("worker", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("asynch_task") as batch:
        batch.drop_column("worker")
        batch.drop_column("result_inline")
