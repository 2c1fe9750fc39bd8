"""Issue 12, item 5: callbacks signed the Standard Webhooks way, verified by
the independent ``standardwebhooks`` package as well as by our verify();
rotation sends both signatures during the overlap window; verify() enforces
a timestamp tolerance.  Real deliveries to a real HTTP receiver."""
from __future__ import annotations

import base64
import time
from datetime import timedelta

import pytest
from helpers import auth
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from test_callbacks import done_with_callback

from app.delivery import outbox as callbacks
from app.delivery import signing
from app.clock import now, set_clock
from app.config import set_settings
from app.infra.db import transaction
from app.infra.tables import tenant_secrets


@pytest.fixture(autouse=True)
def _setup(settings, receiver):
    receiver.reset()
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1", callback_secret_overlap_seconds=3600))


def _secret(client, key) -> str:
    return client.get("/v1/tenants/tenant-a/callback-secret", headers=auth(key)).get_json()["secret"]


def test_a_delivery_verifies_with_the_standardwebhooks_package(make_model, receiver, client, user_key):
    secret = _secret(client, user_key)
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:], validate=True)) == 24
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    assert callbacks.deliver(cid).status == "delivered"
    (req,) = receiver.requests
    h = req["headers"]
    assert h["webhook-id"] == job_id and h["webhook-signature"].startswith("v1,")
    # The payload of the seed's GET callback is its request target (path and query), as sent.
    Webhook(secret).verify(req["target"], h, json_parse=False)
    signing.verify(secret, h, req["target"])
    tampered = req["target"].replace("state=2", "state=3")
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(tampered, h, json_parse=False)
    with pytest.raises(signing.SignatureInvalid):
        signing.verify(secret, h, tampered)


def _documented_verify_callback():
    """The verify_callback of docs/api.md "Callbacks", executed as written."""
    from helpers import ROOT

    doc = (ROOT / "docs" / "api.md").read_text()
    after = doc.split("<!-- callback-verify-snippet", 1)[1]
    code = after.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/api.md#callbacks", "exec"), namespace)  # noqa: S102 (our own document)
    return namespace["verify_callback"]


def test_the_documented_receiver_snippet_verifies_a_real_callback_and_its_path(make_model, receiver, client,
                                                                               user_key):
    """Issue 21, item 9: the GET callback's signature covers the path as
    well as the query; the snippet a receiver copies verifies it."""
    verify_callback = _documented_verify_callback()
    secret = _secret(client, user_key)
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook?src=a%2Fb")
    assert callbacks.deliver(cid).status == "delivered"
    (req,) = receiver.requests
    assert req["target"].startswith("/hook/order-7?src=a%2Fb&task_id=" + job_id), req["target"]
    verify_callback(secret, req["headers"], req["target"])
    signing.verify(secret, req["headers"], req["target"])
    path, _, query = req["target"].partition("?")
    for tampered in ("/hook/order-8?" + query, "/other/order-7?" + query, "/hook/order-7/?" + query, query,
                     path + "?" + query.replace("state=2", "state=3")):
        with pytest.raises(WebhookVerificationError):
            verify_callback(secret, req["headers"], tampered)
        with pytest.raises(signing.SignatureInvalid):
            signing.verify(secret, req["headers"], tampered)
    with pytest.raises(WebhookVerificationError):  # another tenant's secret
        verify_callback("whsec_" + base64.b64encode(b"o" * 24).decode(), req["headers"], req["target"])


def test_rotation_signs_with_both_secrets_during_the_overlap_only(make_model, receiver, client, user_key, admin_key):
    old = _secret(client, user_key)
    new = client.post("/v1/tenants/tenant-a/callback-secret/rotate", headers=auth(admin_key)).get_json()["secret"]
    assert new != old
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    assert callbacks.deliver(cid).status == "delivered"
    h = receiver.requests[0]["headers"]
    assert len(h["webhook-signature"].split(" ")) == 2
    for s in (old, new):  # a receiver on either secret accepts it
        Webhook(s).verify(receiver.requests[0]["target"], h, json_parse=False)

    # After the overlap window only the new secret signs.
    t = now() + timedelta(hours=2)
    set_clock(lambda: t)
    job2, cid2 = done_with_callback(None, receiver.url + "/hook")
    assert callbacks.deliver(cid2).status == "delivered"
    req = receiver.requests[1]
    h2 = req["headers"]
    assert len(h2["webhook-signature"].split(" ")) == 1
    ts = float(h2["webhook-timestamp"])
    signing.verify(new, h2, req["target"], now=ts)
    with pytest.raises(signing.SignatureInvalid):
        signing.verify(old, h2, req["target"], now=ts)


def test_verify_enforces_the_timestamp_tolerance():
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    ts = int(time.time())
    h = signing.sign_headers([secret], "job-1", ts, "task_id=job-1")
    signing.verify(secret, h, "task_id=job-1")
    Webhook(secret).verify("task_id=job-1", h, json_parse=False)  # the package agrees on the format
    for skew in (-301, 301):  # replayed, or pre-dated
        with pytest.raises(signing.SignatureInvalid, match="from now"):
            signing.verify(secret, h, "task_id=job-1", now=ts + skew)
    signing.verify(secret, h, "task_id=job-1", tolerance=1000, now=ts + 900)
    with pytest.raises(signing.SignatureInvalid):
        signing.verify(secret, {**h, "webhook-timestamp": "soon"}, "task_id=job-1")


def test_the_callback_secret_is_encrypted_at_rest(client, user_key, admin_key):
    """Issue 12, item 8: the column holds ciphertext, never the secret."""
    secret = _secret(client, user_key)
    with transaction() as conn:
        stored = conn.execute(select(tenant_secrets.c.secret)
                              .where(tenant_secrets.c.tenant_id == "tenant-a")).scalar_one()
    assert stored.startswith("enc1:") and secret[6:] not in stored and len(stored) <= 128
    # A plaintext row written before encryption still reads as itself.
    legacy = "whsec_" + base64.b64encode(b"L" * 24).decode()
    with transaction() as conn:
        conn.execute(tenant_secrets.update().where(tenant_secrets.c.tenant_id == "tenant-a").values(secret=legacy))
    assert _secret(client, user_key) == legacy
