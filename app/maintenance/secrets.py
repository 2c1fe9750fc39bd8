"""``asynch secrets rotate``: re-encrypt every secret at rest with the first
ASYNCH_SECRETS_KEYS key (app/infra/secretbox.py), in one transaction.

Invariants: all or nothing (a value no configured key decrypts aborts the
whole pass and changes nothing); values already encrypted with the first key
get a fresh token, plaintext values from before encryption are encrypted
(callback secrets too long for their column stay plaintext and are counted);
tenant webhooks' secrets (always encrypted) are re-encrypted too.
"""
from __future__ import annotations

from app.delivery import secrets as tenant_secrets
from app.catalog import registry
from app.infra.db import transaction


def rotate_secrets() -> dict:
    with transaction() as conn:
        models = registry.reencrypt_head_msgs(conn)
        tenants, plaintext = tenant_secrets.reencrypt_all(conn)
        webhooks = tenant_secrets.reencrypt_webhook_secrets(conn)
    return {"models": models, "callback_secrets": tenants, "callback_secrets_left_plaintext": plaintext,
            "webhook_secrets": webhooks}
