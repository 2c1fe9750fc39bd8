"""the seed-002 drop-in: the seed's model types, a per-model cap on retained
completed jobs, and when a result was last read

Revision ID: 0012_seed_dropin
Revises: 0011_model_headers
Create Date: 2026-12-01

- asynch_models_type rows 1, 2, 3: the seed's own createModel example
  (docs/migrating.md) names ``"modelsType": "1,2,3"``, and a model's type ids
  must exist, so a fresh install has them.  Rows an operator already made
  with those ids are left alone; rename or delete the seeded ones freely
  (while no model names them).
- asynch_models.max_completed: seed 000's async_max_completed, the most done
  or claimed jobs kept per model (0: no cap); cleanup evicts the least
  recently read beyond it, beside the time-based retention.
- asynch_task.last_read_at: when the job's result was last read (a status or
  result read, a batch claim); NULL: never, then finished_at stands in.
"""
from alembic import op
import sqlalchemy as sa

revision = "0012_seed_dropin"
down_revision = "0011_model_headers"
branch_labels = None
depends_on = None

SEED_TYPES = ((1, "seed type 1"), (2, "seed type 2"), (3, "seed type 3"))
REMARK = "seeded by migration 0012 for the seed-002 createModel example (modelsType 1,2,3)"


def upgrade() -> None:
    with op.batch_alter_table("asynch_models") as batch:
        batch.add_column(sa.Column("max_completed", sa.Integer, nullable=False, server_default="0"))
    with op.batch_alter_table("asynch_task") as batch:
        batch.add_column(sa.Column("last_read_at", sa.DateTime(timezone=True), nullable=True))
    conn = op.get_bind()
    for type_id, name in SEED_TYPES:
        conn.execute(sa.text(
            "INSERT INTO asynch_models_type (type_id, type_name, remark, created_at) "
            "SELECT :id, :name, :remark, CURRENT_TIMESTAMP "
            "WHERE NOT EXISTS (SELECT 1 FROM asynch_models_type WHERE type_id = :id)"),
            {"id": type_id, "name": name, "remark": REMARK})


def downgrade() -> None:
    conn = op.get_bind()
    conn.execute(sa.text("DELETE FROM asynch_models_type WHERE remark = :remark AND type_id IN (1, 2, 3)"),
                 {"remark": REMARK})
    with op.batch_alter_table("asynch_task") as batch:
        batch.drop_column("last_read_at")
    with op.batch_alter_table("asynch_models") as batch:
        batch.drop_column("max_completed")
