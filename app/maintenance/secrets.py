"""``asynch secrets rotate``: re-encrypt every secret at rest with the first
ASYNCH_SECRETS_KEYS key (app/infra/secretbox.py), in one transaction.

Invariants: all or nothing (a value no configured key decrypts aborts the
whole pass and changes nothing); values already encrypted with the first key
get a fresh token, plaintext values from before encryption are encrypted
(callback secrets too long for their column stay plaintext and are counted);
tenant webhooks' secrets (always encrypted) are re-encrypted too.
"""
from __future__ import annotations

from app.catalog import registry
from app.delivery import secrets as tenant_secrets
from app.infra.db import transaction
from app.infra.tables import tenant_secrets as secrets_table
from app.infra.tables import webhook_subscriptions


def rotate_secrets() -> dict:
    with transaction() as conn:
        models = registry.reencrypt_head_msgs(conn)
        tenants, plaintext = tenant_secrets.reencrypt(conn, secrets_table.c.tenant_id)
        webhooks, _ = tenant_secrets.reencrypt(conn, webhook_subscriptions.c.id)
    return {"models": models, "callback_secrets": tenants, "callback_secrets_left_plaintext": plaintext,
            "webhook_secrets": webhooks}
