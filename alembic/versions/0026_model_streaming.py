"""asynch_models.streaming: the model's upstream may answer a stream whose
output the worker forwards live (issue 31 item 4, app/jobs/output.py)

Revision ID: 0026_model_streaming
Revises: 0025_tenant_busy_budget
Create Date: 2026-12-07

A model with streaming true has its jobs' output forwarded chunk by chunk
while the call runs (GET /v1/models/{model}/jobs/{id}/stream); the stored
result is the whole answer either way.  false (every existing model) keeps
the old behaviour: the answer is read whole.
"""
import sqlalchemy as sa
from alembic import op

revision = "0026_model_streaming"
down_revision = "0025_tenant_busy_budget"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("asynch_models", sa.Column("streaming", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("asynch_models", "streaming")
