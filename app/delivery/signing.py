"""Standard Webhooks signatures (https://www.standardwebhooks.com/) of deliveries.

Headers: ``webhook-id`` (a callback's: the task_id, the same on every retry:
receivers deduplicate by it), ``webhook-timestamp`` (unix seconds of the
attempt), ``webhook-signature``: ``v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{payload}")>``,
space-separated when several secrets sign (the previous one during
ASYNCH_DELIVERY_SECRET_OVERLAP_SECONDS).  ``key``: the base64 after ``whsec_``.

A callback is the seed's GET, so its signed ``payload`` is the request target
exactly as sent (``/notify/order?task_id=...&state=2&...``;
app/infra/http/deadline.py ``request_target``): a delivery for one receiver
path (one bizName) cannot be replayed to another.  The standardwebhooks
package verifies it with ``json_parse=False`` (docs/api.md "Callbacks",
run by tests/test_signing.py).  Tenant webhooks sign their JSON body.

Invariants: ``verify`` compares in constant time, accepts any one of the
``v1,`` signatures, and refuses a timestamp more than ``tolerance`` seconds
from now either way (a replayed or pre-dated delivery).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import time

PREFIX = "whsec_"
DEFAULT_TOLERANCE_SECONDS = 300


class SignatureInvalid(ValueError):
    """The delivery's signature, or its timestamp, does not verify."""


def secret_bytes(secret: str) -> bytes:
    """A ``whsec_`` secret's key bytes: standard base64 after the prefix.
    Secrets issued before Standard Webhooks signing (urlsafe base64) decode
    too; anything else is its UTF-8 bytes."""
    body = secret[len(PREFIX):] if secret.startswith(PREFIX) else secret
    try:
        return base64.b64decode(body, validate=True)
    except ValueError:  # binascii.Error is one
        pass
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except ValueError:  # binascii.Error is one
        return body.encode()


def signature(secret: str, msg_id: str, timestamp: int, payload: str | bytes) -> str:
    """One ``v1,<base64>`` signature."""
    content = f"{msg_id}.{timestamp}.".encode() + (payload.encode() if isinstance(payload, str) else payload)
    return "v1," + base64.b64encode(hmac.new(secret_bytes(secret), content, hashlib.sha256).digest()).decode()


def sign_headers(secrets: list[str], msg_id: str, timestamp: int, payload: str | bytes) -> dict[str, str]:
    """The three headers, one signature per secret (the current one first)."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(signature(s, msg_id, timestamp, payload) for s in secrets)}


def verify(secret: str, headers, payload: str | bytes, tolerance: int = DEFAULT_TOLERANCE_SECONDS,
           now: float | None = None) -> None:
    """What a receiver does: raises SignatureInvalid unless one of the
    ``webhook-signature`` entries is ``secret``'s over this id, timestamp and
    payload, and the timestamp is within ``tolerance`` seconds of ``now``."""
    msg_id, ts_text, sigs = (headers.get(n) or headers.get(n.title())
                             for n in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not msg_id or not ts_text or not sigs:
        raise SignatureInvalid("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        ts = int(ts_text)
    except (TypeError, ValueError):
        raise SignatureInvalid("webhook-timestamp is not unix seconds") from None
    now = time.time() if now is None else now
    if abs(now - ts) > tolerance:
        raise SignatureInvalid(f"webhook-timestamp is more than {tolerance} s from now")
    expected = signature(secret, msg_id, ts, payload).encode()
    if not any(c.startswith("v1,") and hmac.compare_digest(c.encode(), expected) for c in sigs.split(" ")):
        raise SignatureInvalid("no signature matches")
