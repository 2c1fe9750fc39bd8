"""initial schema: models, model types, tasks, stats, API keys

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "asynch_models",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("model_name", sa.String(128), nullable=False, unique=True),
        sa.Column("models_type", sa.String(512), nullable=False, server_default=""),
        sa.Column("form", JsonType, nullable=True),
        sa.Column("base_url", sa.String(1024), nullable=False),
        sa.Column("route", sa.String(1024), nullable=False, server_default=""),
        sa.Column("http_method", sa.String(8), nullable=False, server_default="POST"),
        sa.Column("head_msg", sa.Text, nullable=False, server_default=""),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("max_concurrency", sa.Integer, nullable=False, server_default="5"),
        sa.Column("queue_limit", sa.Integer, nullable=False, server_default="20"),
        sa.Column("timeout_seconds", sa.Integer, nullable=False, server_default="1800"),
        sa.Column("expected_seconds", sa.Integer, nullable=False, server_default="600"),
        sa.Column("retry_times", sa.Integer, nullable=False, server_default="3"),
        sa.Column("retry_queue_max_seconds", sa.Integer, nullable=False, server_default="600"),
        sa.Column("auto_clean_seconds", sa.Integer, nullable=False, server_default="3600"),
        sa.Column("remark", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "asynch_models_type",
        sa.Column("type_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("type_name", sa.String(128), nullable=False),
        sa.Column("remark", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "asynch_task",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("creator", sa.String(128), nullable=False, server_default=""),
        sa.Column("model_name", sa.String(128), nullable=False),
        sa.Column("biz_name", sa.String(128), nullable=False, server_default=""),
        sa.Column("callback_url", sa.Text, nullable=True),
        sa.Column("model_key", sa.Text, nullable=True),
        sa.Column("request_payload", sa.Text, nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("state", sa.SmallInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("retry_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("result_location", sa.Text, nullable=True),
        sa.Column("result_content_type", sa.String(255), nullable=True),
        sa.Column("result_size", sa.BigInteger, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("enqueue_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("lease_expires_at", TS, nullable=True),
        sa.Column("next_retry_at", TS, nullable=True),
        sa.Column("deadline_at", TS, nullable=True),
        sa.Column("claimed_at", TS, nullable=True),
        sa.Column("expire_at", TS, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="uq_asynch_task_idem"),
    )
    op.create_index("ix_asynch_task_tenant_created", "asynch_task", ["tenant_id", "created_at"])
    op.create_index("ix_asynch_task_tenant_model_created", "asynch_task", ["tenant_id", "model_name", "created_at"])
    op.create_index("ix_asynch_task_model_state", "asynch_task", ["model_name", "state"])
    op.create_index("ix_asynch_task_state_lease", "asynch_task", ["state", "lease_expires_at"])
    op.create_index("ix_asynch_task_state_retry", "asynch_task", ["state", "next_retry_at"])
    op.create_index("ix_asynch_task_state_expire", "asynch_task", ["state", "expire_at"])
    op.create_index("ix_asynch_task_state_updated", "asynch_task", ["state", "updated_at"])
    op.create_index("ix_asynch_task_state_finished", "asynch_task", ["state", "finished_at"])
    op.create_table(
        "asynch_model_stat",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("creator", sa.String(128), nullable=False, server_default=""),
        sa.Column("model_name", sa.String(128), nullable=False),
        sa.Column("request_count", sa.BigInteger, nullable=False, server_default="0"),
        sa.UniqueConstraint("day", "tenant_id", "creator", "model_name", name="uq_asynch_model_stat"),
    )
    op.create_index("ix_asynch_model_stat_model_day", "asynch_model_stat", ["model_name", "day"])
    op.create_table(
        "asynch_api_keys",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("name", sa.String(128), nullable=False, server_default=""),
        sa.Column("prefix", sa.String(16), nullable=False, unique=True),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
    )
    op.create_index("ix_asynch_api_keys_tenant", "asynch_api_keys", ["tenant_id"])


def downgrade() -> None:
    op.drop_table("asynch_api_keys")
    op.drop_table("asynch_model_stat")
    op.drop_table("asynch_task")
    op.drop_table("asynch_models_type")
    op.drop_table("asynch_models")
