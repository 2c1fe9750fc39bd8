"""partial indexes: each maintenance scan indexes only the rows it looks for

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

The state-prefixed indexes of 0001/0003 put every row version in every
index, so each admission and each transition wrote ~12 index entries.  Every
maintenance scan asks for one state (or a few) and one time column, so each
becomes a partial index over those states: a row version now enters only
the indexes of the state it is in (6 or 7 per version instead of 12).  The scans
and the indexes that answer them:

  retry due            state = retry_wait, next_retry_at     ix_asynch_task_retry_due
  lease recovery       state = running, lease_expires_at     ix_asynch_task_running_lease
  republish / replay   state = pending, enqueue_at order     ix_asynch_task_pending_enqueue
  claimed cleanup      state = claimed, expire_at            ix_asynch_task_claimed_expire
  retention cleanup    state in done/failed/timeout/canceled ix_asynch_task_ended_finished
  autotune window      model, finished_at (not null)         ix_asynch_task_finished_by_model
  time-outs            state in pending/running, deadline_at ix_asynch_task_slot_deadline

On PostgreSQL the new indexes are built CONCURRENTLY (no write lock on a
live table) before the old ones are dropped.
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# (name, columns, predicate): states are JobState values (app/states.py).
NEW = [
    ("ix_asynch_task_retry_due", ["next_retry_at"], "state = 7"),
    ("ix_asynch_task_running_lease", ["lease_expires_at"], "state = 1"),
    ("ix_asynch_task_pending_enqueue", ["enqueue_at", "id"], "state = 0"),
    ("ix_asynch_task_slot_deadline", ["deadline_at"], "state IN (0, 1)"),
    ("ix_asynch_task_claimed_expire", ["expire_at"], "state = 4"),
    ("ix_asynch_task_ended_finished", ["finished_at"], "state IN (2, 3, 5, 6)"),
    ("ix_asynch_task_finished_by_model", ["model_name", "finished_at"], "finished_at IS NOT NULL"),
]
OLD = [
    ("ix_asynch_task_state_lease", ["state", "lease_expires_at"]),
    ("ix_asynch_task_state_retry", ["state", "next_retry_at"]),
    ("ix_asynch_task_state_expire", ["state", "expire_at"]),
    ("ix_asynch_task_state_updated", ["state", "updated_at"]),
    ("ix_asynch_task_state_finished", ["state", "finished_at"]),
    ("ix_asynch_task_state_enqueue", ["state", "enqueue_at"]),
    ("ix_asynch_task_model_finished", ["model_name", "finished_at"]),
]


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _create(name: str, cols: list[str], where: str | None) -> None:
    import sqlalchemy as sa

    kw = {}
    if where:
        kw = {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}
    if _pg():
        with op.get_context().autocommit_block():
            op.create_index(name, "asynch_task", cols, postgresql_concurrently=True, **kw)
    else:
        op.create_index(name, "asynch_task", cols, **kw)


def upgrade() -> None:
    for name, cols, where in NEW:
        _create(name, cols, where)
    for name, _ in OLD:
        op.drop_index(name, table_name="asynch_task")


def downgrade() -> None:
    for name, cols in OLD:
        _create(name, cols, None)
    for name, _, _ in NEW:
        op.drop_index(name, table_name="asynch_task")
