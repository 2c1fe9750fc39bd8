"""seed-002 surface: callbacks and their delivery log, tenant signing
secrets, OSS pass-through headers on a job, stats by tenant

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.add_column("asynch_task", sa.Column("passthrough_headers", sa.Text, nullable=True))
    op.create_index("ix_asynch_model_stat_tenant_day", "asynch_model_stat", ["tenant_id", "day"])
    op.create_table(
        "asynch_callback",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("asynch_task.id", ondelete="CASCADE"),
                  nullable=False, unique=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", TS, nullable=False),
        sa.Column("lease_until", TS, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("delivered_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_asynch_callback_status_next", "asynch_callback", ["status", "next_attempt_at"])
    op.create_index("ix_asynch_callback_status_lease", "asynch_callback", ["status", "lease_until"])
    op.create_table(
        "asynch_callback_attempt",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("callback_id", BigId, sa.ForeignKey("asynch_callback.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("http_status", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_index("ix_asynch_callback_attempt_callback", "asynch_callback_attempt", ["callback_id", "attempt"])
    op.create_table(
        "asynch_tenant_secret",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("rotated_at", TS, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("asynch_tenant_secret")
    op.drop_table("asynch_callback_attempt")
    op.drop_table("asynch_callback")
    op.drop_index("ix_asynch_model_stat_tenant_day", table_name="asynch_model_stat")
    op.drop_column("asynch_task", "passthrough_headers")
