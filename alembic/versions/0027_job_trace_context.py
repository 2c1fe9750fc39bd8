"""asynch_task.traceparent / tracestate: the job's W3C trace context (issue 34 item 1, app/infra/tracing.py)

Revision ID: 0027_job_trace_context
Revises: 0026_model_streaming
Create Date: 2026-12-07

The context a job's spans (admission, queue wait, claim, model call, storage, terminal write, deliveries)
join, and that its model call and its deliveries send on: the caller's ``traceparent`` (with its
``tracestate``) as received, or, with tracing on and none received, the job's own root.  NULL (every
existing job, and every job while tracing is off and the caller sent none): no trace.
"""
import sqlalchemy as sa
from alembic import op

revision = "0027_job_trace_context"
down_revision = "0026_model_streaming"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("asynch_task", sa.Column("traceparent", sa.String(55)))
    op.add_column("asynch_task", sa.Column("tracestate", sa.String(512)))


def downgrade() -> None:
    op.drop_column("asynch_task", "tracestate")
    op.drop_column("asynch_task", "traceparent")
