"""callback, webhook delivery and webhook subscription ids are random, not a global sequence

Revision ID: 0017_random_delivery_ids
Revises: 0016_job_attempts
Create Date: 2026-12-02

Their ids reach tenants (``wh_<id>`` as the webhook-id, ``X-Asynch-Delivery:
<id>.<attempt>``, a subscription's id): a sequence shown every tenant the
platform's delivery volume (issue 21, item 9).  New rows take a random id
in [1, 2**53): opaque, and still exact as a JSON number in every client.
Rows already written keep theirs; the sequences stay (owned by the columns)
but are no longer read.  A collision needs ~10**8 live rows to be likely;
the row is written by the terminal transition's statement, which then
fails and is retried like any failed statement.
"""
from alembic import op

revision = "0017_random_delivery_ids"
down_revision = "0016_job_attempts"
branch_labels = None
depends_on = None

# Keep in step with app/infra/tables.py RANDOM_ID.
RANDOM_ID = "(floor(random() * 9007199254740990) + 1)::bigint"
TABLES = ("asynch_callback", "asynch_webhook_delivery", "asynch_webhook_subscription")


def upgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN id SET DEFAULT {RANDOM_ID}")


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{table}_id_seq'::regclass)")
