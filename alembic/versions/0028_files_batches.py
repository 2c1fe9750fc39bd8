"""asynch_files, asynch_batches, asynch_batch_items: the OpenAI-compatible Files and Batch APIs (issue 33)

Revision ID: 0028_files_batches
Revises: 0027_job_trace_context
Create Date: 2026-12-07

A file's bytes live in storage (its ``location``), never in a row.  A batch's lines are rows of
asynch_batch_items pointing into its input file (offset, length); each becomes a job through the
one admission path, and its outcome is recorded once, when written to the output or error file.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0028_files_batches"
down_revision = "0027_job_trace_context"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("asynch_task", sa.Column("payload_file_id", sa.String(40)))
    op.create_table(
        "asynch_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("location", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS),
    )
    op.create_index("ix_asynch_files_tenant_created", "asynch_files", ["tenant_id", "created_at", "id"])
    op.create_index("ix_asynch_files_expires", "asynch_files", ["expires_at"],
                    postgresql_where=sa.text("expires_at IS NOT NULL"))
    op.create_table(
        "asynch_batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("endpoint", sa.String(255), nullable=False),
        sa.Column("input_file_id", sa.String(40), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("errors", JSONB()),
        sa.Column("output_file_id", sa.String(40)),
        sa.Column("error_file_id", sa.String(40)),
        sa.Column("metadata", JSONB()),
        sa.Column("total", sa.Integer, nullable=False, server_default="0"),
        sa.Column("completed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("failed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("admitted", sa.Integer, nullable=False, server_default="0"),
        sa.Column("segments", sa.Integer, nullable=False, server_default="0"),
        sa.Column("ending", sa.String(16)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        *[sa.Column(n, TS) for n in ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
                                     "cancelling_at", "cancelled_at")],
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_asynch_batches_tenant_created", "asynch_batches", ["tenant_id", "created_at", "id"])
    op.create_index("ix_asynch_batches_open", "asynch_batches", ["updated_at"],
                    postgresql_where=sa.text("status IN ('in_progress', 'cancelling', 'finalizing')"))
    op.create_table(
        "asynch_batch_items",
        sa.Column("batch_id", sa.String(40), sa.ForeignKey("asynch_batches.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("line_no", sa.Integer, primary_key=True),
        sa.Column("custom_id", sa.Text, nullable=False),
        sa.Column("model_name", sa.String(128), nullable=False),
        sa.Column("byte_offset", sa.BigInteger, nullable=False),
        sa.Column("byte_len", sa.Integer, nullable=False),
        sa.Column("job_id", sa.String(40)),
        sa.Column("outcome", sa.String(16)),
    )
    op.create_index("ix_asynch_batch_items_unadmitted", "asynch_batch_items", ["batch_id", "line_no"],
                    postgresql_where=sa.text("job_id IS NULL AND outcome IS NULL"))
    op.create_index("ix_asynch_batch_items_open", "asynch_batch_items", ["batch_id", "line_no"],
                    postgresql_where=sa.text("job_id IS NOT NULL AND outcome IS NULL"))


def downgrade() -> None:
    op.drop_column("asynch_task", "payload_file_id")
    op.drop_table("asynch_batch_items")
    op.drop_table("asynch_batches")
    op.drop_table("asynch_files")
