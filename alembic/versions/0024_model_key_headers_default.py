"""a model that never set model_key_headers follows the deployment's default

Revision ID: 0024_model_key_headers_default
Revises: 0023_pending_head_index
Create Date: 2026-12-07

- asynch_models.model_key_headers becomes nullable, without a server
  default.  NULL: the model was created without the field, so the header
  names a job's modelKey may set are ASYNCH_MODEL_KEY_HEADERS_DEFAULT as it
  is set when each job is judged and sent (app/infra/http/headers.py
  ``allowed_names``): a seed-002 deployment that sets the default after its
  clients created their models with the seed's createModel body no longer
  answers 422 on their modelKey (issue 32 item 3).
- Existing rows keep their value: '' cannot tell "never set" from an
  admin's explicit "none", and turning a locked model into one that follows
  the default would widen what its jobs may send.  Such a model is changed
  with updateModel / PATCH (docs/migrating.md).
- Downgrade writes '' for NULL (what the old column meant by default) and
  restores NOT NULL DEFAULT ''.
"""
import sqlalchemy as sa
from alembic import op

revision = "0024_model_key_headers_default"
down_revision = "0023_pending_head_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column("asynch_models", "model_key_headers", existing_type=sa.Text, nullable=True, server_default=None)


def downgrade() -> None:
    op.execute("UPDATE asynch_models SET model_key_headers = '' WHERE model_key_headers IS NULL")
    op.alter_column("asynch_models", "model_key_headers", existing_type=sa.Text, nullable=False, server_default="")
