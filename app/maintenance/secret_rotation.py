"""``asynch secrets rotate``: every secret at rest re-encrypted with the first
ASYNCH_SECRETS_KEYS key, in one transaction: all or nothing (a value no key
decrypts changes nothing).  Legacy plaintext values are encrypted, except
callback secrets too long for their column (counted).
"""
from __future__ import annotations

from app.catalog import registry
from app.delivery import signing_secrets as tenant_secrets
from app.infra.db import transaction
from app.infra.tables import tenant_secrets as secrets_table, webhook_subscriptions


def rotate_secrets() -> dict:
    with transaction() as conn:
        models = registry.reencrypt_head_msgs(conn)
        tenants, plaintext = tenant_secrets.reencrypt(conn, secrets_table.c.tenant_id)
        webhooks, _ = tenant_secrets.reencrypt(conn, webhook_subscriptions.c.id)
    return {"models": models, "callback_secrets": tenants, "callback_secrets_left_plaintext": plaintext,
            "webhook_secrets": webhooks}
