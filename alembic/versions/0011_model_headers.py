"""which headers a job's modelKey may set

Revision ID: 0011_model_headers
Revises: 0010_worker_path
Create Date: 2026-12-01

- asynch_models.model_key_headers: comma-separated header names a job's
  modelKey / X-Model-Key may set ("*": any name but the protected ones,
  app/infra/http/headers.py).  '' (the default, also for existing models):
  none, so a job can no longer set Host, Transfer-Encoding or blank the
  model's head_msg credentials.
- asynch_task.error_detail: what lies behind a failed attempt's error
  (exception text, the model's error body); ``error`` keeps only a stable
  code and a short message for the tenant, this column is for admin views.
"""
from alembic import op
import sqlalchemy as sa

revision = "0011_model_headers"
down_revision = "0010_worker_path"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("asynch_models") as batch:
        batch.add_column(sa.Column("model_key_headers", sa.Text, nullable=False, server_default=""))
    with op.batch_alter_table("asynch_task") as batch:
        batch.add_column(sa.Column("error_detail", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("asynch_task") as batch:
        batch.drop_column("error_detail")
    with op.batch_alter_table("asynch_models") as batch:
        batch.drop_column("model_key_headers")
