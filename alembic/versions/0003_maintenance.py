"""maintenance: retry promotion marker, queue-order index, autotune log

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Self-contained: only adds what the maintenance passes need, so it can be
re-pointed after any sibling revision.
"""
from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
_PROMOTE_WHERE = "state = 0 AND retry_count > 0 AND promoted_at IS NULL"


def upgrade() -> None:
    # When a pending retry was (re-)published at high priority; NULL while it
    # waits at the tail.  Reset by every readmission.
    op.add_column("asynch_task", sa.Column("promoted_at", TS, nullable=True))
    # Re-publishing every pending job after a wipe, in queue order.
    op.create_index("ix_asynch_task_state_enqueue", "asynch_task", ["state", "enqueue_at"])
    # Autotune: a model's recently finished jobs.
    op.create_index("ix_asynch_task_model_finished", "asynch_task", ["model_name", "finished_at"])
    # Retries waiting at the tail of a model's queue, oldest first.
    op.create_index("ix_asynch_task_retry_promote", "asynch_task", ["model_name", "enqueue_at"],
                    postgresql_where=sa.text(_PROMOTE_WHERE), sqlite_where=sa.text(_PROMOTE_WHERE))
    op.create_table(
        "asynch_autotune_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("model_name", sa.String(128), nullable=False),
        sa.Column("old_max_concurrency", sa.Integer, nullable=False),
        sa.Column("new_max_concurrency", sa.Integer, nullable=False),
        sa.Column("old_queue_limit", sa.Integer, nullable=False),
        sa.Column("new_queue_limit", sa.Integer, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("p90_seconds", sa.Float, nullable=False),
        sa.Column("throughput_per_second", sa.Float, nullable=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("queued", sa.Integer, nullable=False),
        sa.Column("window_seconds", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_asynch_autotune_log_model_created", "asynch_autotune_log", ["model_name", "created_at"])


def downgrade() -> None:
    op.drop_table("asynch_autotune_log")
    op.drop_index("ix_asynch_task_retry_promote", table_name="asynch_task")
    op.drop_index("ix_asynch_task_model_finished", table_name="asynch_task")
    op.drop_index("ix_asynch_task_state_enqueue", table_name="asynch_task")
    with op.batch_alter_table("asynch_task") as batch:
        batch.drop_column("promoted_at")
