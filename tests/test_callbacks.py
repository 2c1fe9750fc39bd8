"""Callbacks on done: the seed's GET {callbackUrl}/{bizName}?task_id&state&oss_file&file_type,
signed, durable, retried with backoff, never redirected, never sent to a
refused address.  Deliveries run in-process against a real receiver over
HTTP; time moves through app.clock."""
from __future__ import annotations

from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit

import pytest
from helpers import P, auth, job_row, seed_signature_ok
from sqlalchemy import delete, select
from stubs import ConnectionSpy

from app.delivery import outbox as callbacks
from app.delivery import signing_secrets as callback_secrets
from app.clock import as_utc, now, set_clock
from app.config import set_settings
from app.infra.db import transaction
from app.infra.http import netguard
from app.infra.tables import deliveries as callbacks_table
from app.jobs import execution
from app.jobs import service as jobs


@pytest.fixture(autouse=True)
def _setup(settings, receiver):
    receiver.reset()
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1", callback_backoff_seconds=2.0))


@pytest.fixture
def spy():
    s = ConnectionSpy()
    yield s
    s.stop()


def done_with_callback(make_model, url: str, biz: str = "order-7") -> tuple[str, int]:
    if make_model is not None:
        make_model("m")
    job_id = jobs.submit(P, "m", {"q": 1}, jobs.SubmitOptions(callback_url=url, biz_name=biz)).row.id
    assert execution.run_attempt(job_id, 0) == "done"
    with transaction() as conn:
        cid = conn.execute(select(callbacks_table.c.id).where(callbacks_table.c.job_id == job_id)).scalar_one()
    return job_id, cid


def test_the_receiver_gets_exactly_the_seed_fields_and_a_valid_signature(make_model, receiver, client, user_key,
                                                                        other_key):
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    assert callbacks.deliver(cid).status == "delivered"
    (req,) = receiver.requests
    row = job_row(job_id)
    assert req["path"] == "/hook/order-7"
    assert req["query"] == [("task_id", job_id), ("state", "2"), ("oss_file", row.result_location),
                            ("file_type", "application/json")]
    # What a receiver does: rebuild the URL it was called on and check the HMAC.
    with transaction() as conn:
        secret = callback_secrets.tenant_secret(conn, "tenant-a")["secret"]
    url = f"{receiver.url}{req['path']}?{req['raw_query']}"
    h = req["headers"]
    assert h["X-Asynch-Signature"].startswith("sha256=") and h["X-Asynch-Task-Id"] == job_id
    assert seed_signature_ok(secret, job_id, h["X-Asynch-Timestamp"], url, h["X-Asynch-Signature"])
    assert not seed_signature_ok(secret + "x", job_id, h["X-Asynch-Timestamp"], url, h["X-Asynch-Signature"])
    assert not seed_signature_ok(secret, job_id, str(int(h["X-Asynch-Timestamp"]) + 1), url,
                                       h["X-Asynch-Signature"])
    # The delivery log, for the job's owner only.
    view = client.get(f"/v1/jobs/{job_id}/callback", headers=auth(user_key)).get_json()
    assert view["status"] == "delivered" and view["attempts"] == 1
    assert [(e["attempt"], e["http_status"], e["address"], e["error"]) for e in view["log"]] == \
        [(1, 200, "127.0.0.1", None)]
    assert client.get(f"/v1/jobs/{job_id}/callback", headers=auth(other_key)).status_code == 404
    # Delivered is final: a duplicate doorbell sends nothing.
    assert callbacks.deliver(cid).status == "skipped" and len(receiver.requests) == 1


def test_the_tenant_reads_its_secret_and_an_admin_rotates_it(make_model, receiver, client, user_key, admin_key):
    first = client.get("/v1/tenants/tenant-a/callback-secret", headers=auth(user_key)).get_json()["secret"]
    assert first.startswith("whsec_")
    assert client.get("/v1/tenants/tenant-b/callback-secret", headers=auth(user_key)).status_code == 403
    assert client.post("/v1/tenants/tenant-a/callback-secret/rotate", headers=auth(user_key)).status_code == 403
    rotated = client.post("/v1/tenants/tenant-a/callback-secret/rotate", headers=auth(admin_key)).get_json()
    assert rotated["secret"] != first and rotated["rotated_at"]
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    callbacks.deliver(cid)
    req = receiver.requests[0]
    url = f"{receiver.url}{req['path']}?{req['raw_query']}"
    h = req["headers"]
    assert seed_signature_ok(rotated["secret"], job_id, h["X-Asynch-Timestamp"], url, h["X-Asynch-Signature"])


def test_a_receiver_failing_3_times_then_succeeding_gets_the_callback(make_model, receiver):
    t = [now()]
    set_clock(lambda: t[0])
    receiver.statuses = [500, 503, 502]
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook", biz="")
    delays = []
    for n in (1, 2, 3):
        out = callbacks.deliver(cid)
        assert out.status == "retry"
        delays.append(out.retry_in)
        # Equal jitter around base * 2**(n-1): between half of it and all of it.
        assert 2.0 * 2 ** (n - 1) / 2 <= out.retry_in <= 2.0 * 2 ** (n - 1)
        # Not due yet: a doorbell now does not send (it is told to come back).
        early = callbacks.deliver(cid)
        assert early.status == "retry" and early.retry_in == pytest.approx(out.retry_in, abs=0.01)
        assert len(receiver.requests) == n
        t[0] += timedelta(seconds=out.retry_in + 0.01)
    assert callbacks.deliver(cid).status == "delivered"
    assert len(receiver.requests) == 4 and receiver.requests[-1]["path"] == "/hook"
    view = callbacks.callback_view(P, job_id)
    assert view["status"] == "delivered" and view["attempts"] == 4
    assert [e["http_status"] for e in view["log"]] == [500, 503, 502, 200]
    assert [e["error"] for e in view["log"]][:3] == ["HTTP 500", "HTTP 503", "HTTP 502"]


def test_attempts_are_bounded(make_model, receiver, settings):
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1", callback_max_attempts=2))
    t = [now()]
    set_clock(lambda: t[0])
    receiver.statuses = [500] * 5
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    assert callbacks.deliver(cid).status == "retry"
    t[0] += timedelta(hours=1)
    assert callbacks.deliver(cid).status == "failed"
    t[0] += timedelta(hours=1)
    assert callbacks.deliver(cid).status == "skipped"
    assert len(receiver.requests) == 2 and callbacks.callback_view(P, job_id)["status"] == "failed"


def test_redirects_are_not_followed(make_model, receiver, spy):
    # The redirect target is an allowed address too: only not following it keeps us away.
    receiver.redirect_to = f"http://127.0.0.1:{spy.port}/stolen"
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    out = callbacks.deliver(cid)
    assert out.status == "retry"
    assert callbacks.callback_view(P, job_id)["log"][0]["error"] == "HTTP 302 (redirects are not followed)"
    assert len(receiver.requests) == 1 and spy.accepted == 0


def _ipv6_loopback_spy(port: int):
    try:
        return ConnectionSpy("::1", port)
    except OSError:
        return None  # no IPv6 here: the URL is still refused, nothing to observe


@pytest.mark.parametrize("form", ["127.0.0.1", "0x7f000001", "2130706433", "0177.0.0.1", "127.1", "localhost",
                                  "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0"])
def test_loopback_in_any_spelling_is_refused_at_submit(client, make_model, user_key, spy, r, settings, form):
    set_settings(settings.with_overrides(callback_allow_hosts=""))
    make_model("m")
    v6 = _ipv6_loopback_spy(spy.port)
    try:
        resp = client.post("/task/createTask", headers=auth(user_key), json={
            "modelName": "m", "requestPayload": {}, "callbackUrl": f"http://{form}:{spy.port}/cb"})
        body = resp.get_json()
        assert resp.status_code == 422 and body["code"] == 422, body
        assert [e["pointer"] for e in body["errors"]] == ["/callbackUrl"]
        assert "refused address" in body["errors"][0]["message"]
        assert spy.accepted == 0 and (v6 is None or v6.accepted == 0)
        assert r.zcard("asynch:gate:{m}") == 0
    finally:
        if v6:
            v6.stop()


@pytest.mark.parametrize("url", ["http://10.0.0.1/cb", "http://169.254.169.254/latest/meta-data/",
                                 "http://192.168.1.1/", "http://100.64.0.1/", "http://[fe80::1]/",
                                 "http://[::ffff:10.0.0.1]/", "http://[64:ff9b::a9fe:a9fe]/", "http://224.0.0.1/",
                                 "http://user:pw@example.com/", "ftp://example.com/", "http://example.com/#frag"])
def test_private_metadata_and_odd_urls_are_refused_at_submit(client, make_model, user_key, settings, url):
    set_settings(settings.with_overrides(callback_allow_hosts=""))
    make_model("m")
    resp = client.post("/task/createTask", headers=auth(user_key), json={
        "modelName": "m", "requestPayload": {}, "callbackUrl": url})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/callbackUrl"


def test_address_judgement():
    import ipaddress

    for a in ("8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"):
        assert not netguard.address_refused(ipaddress.ip_address(a)), a
    for a in ("127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
              "::1", "::", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "2002:7f00:1::", "64:ff9b::7f00:1",
              "239.1.1.1", "ff02::1", "240.0.0.1", "255.255.255.255"):
        assert netguard.address_refused(ipaddress.ip_address(a)), a
    assert netguard.check_url("http://8.8.8.8:8080/x?y=1").path_and_query == "/x?y=1"


@pytest.mark.parametrize("form", ["127.0.0.1", "0x7f000001", "2130706433", "localhost", "[::1]"])
def test_delivery_rechecks_the_address_and_never_connects(make_model, settings, spy, form):
    """Admitted at submit (an allowlist that was later removed, or a name
    that now resolves elsewhere): the delivery refuses it without connecting."""
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1,::1,localhost"))
    v6 = _ipv6_loopback_spy(spy.port)
    try:
        job_id, cid = done_with_callback(make_model, f"http://{form}:{spy.port}/cb")
        set_settings(settings.with_overrides(callback_allow_hosts=""))
        assert callbacks.deliver(cid).status == "failed"  # a refused target is not retried
        (entry,) = callbacks.callback_view(P, job_id)["log"]
        assert entry["error"].startswith("refused: resolves to a refused address") and entry["address"] is None
        assert spy.accepted == 0 and (v6 is None or v6.accepted == 0)
    finally:
        if v6:
            v6.stop()


@pytest.mark.parametrize("url", ["http://10.0.0.1/cb", "http://169.254.169.254/latest/meta-data/"])
def test_delivery_refuses_private_and_metadata_targets(make_model, settings, url):
    set_settings(settings.with_overrides(callback_allow_hosts="10.0.0.0/8,169.254.0.0/16"))
    job_id, cid = done_with_callback(make_model, url)
    set_settings(settings.with_overrides(callback_allow_hosts=""))
    assert callbacks.deliver(cid).status == "failed"
    (entry,) = callbacks.callback_view(P, job_id)["log"]
    assert entry["address"] is None and "refused address" in entry["error"]


def test_the_done_transition_writes_the_callback_and_the_sweep_revives_an_abandoned_delivery(make_model,
                                                                                               receiver):
    t = [now()]
    set_clock(lambda: t[0])
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    # The row committed with the done transition itself (one statement): no
    # window in which a job is done without its callback, nothing to backfill.
    assert callbacks.deliver_due()["published"] == 1  # due now: a token for it
    with transaction() as conn:
        cb = conn.execute(select(callbacks_table).where(callbacks_table.c.job_id == job_id)).one()
        # A worker claims the delivery and dies before recording anything.
        assert callbacks.claim(conn, t[0], cb.id) is not None
    assert callbacks.deliver(cb.id).status == "skipped"  # its lease still holds
    assert callbacks.deliver_due()["published"] == 0
    t[0] += timedelta(minutes=5)
    assert callbacks.deliver_due()["published"] == 1
    assert callbacks.deliver(cb.id).status == "delivered"
    view = callbacks.callback_view(P, job_id)
    assert view["attempts"] == 2 and [e["attempt"] for e in view["log"]] == [2]
    assert as_utc(view["delivered_at"]) == as_utc(t[0])


def test_urls_with_a_query_keep_it_and_biz_names_are_escaped(make_model, receiver):
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook/?token=abc", biz="a b/c")
    callbacks.deliver(cid)
    req = receiver.requests[0]
    assert req["path"] == "/hook/a%20b%2Fc"  # one path segment, whatever bizName holds
    assert [k for k, _ in req["query"]] == ["token", "task_id", "state", "oss_file", "file_type"]
    assert dict(parse_qsl(urlsplit(callbacks.callback_url_for(job_row(job_id))).query))["token"] == "abc"


# --- the attempt cap (ASYNCH_DELIVERY_MAX_ATTEMPTS) and the delivery metric ---------------

def _row(cid: int):
    with transaction() as conn:
        return conn.execute(select(callbacks_table).where(callbacks_table.c.id == cid)).one()


_BASELINE: dict[str, float] = {}


def _counted() -> dict[str, float]:
    from app.infra import metrics

    return {f"{s.labels['model']}|{s.labels['outcome']}": s.value
            for fam in metrics._DELIVERIES.collect() for s in fam.samples
            if s.name.endswith("_total") and s.labels["kind"] == "callback"}


def _settled(r, reset: bool = False) -> dict:
    """What this process's callbacks counter gained since the last reset
    (the counter lives for the whole test session), as "model|outcome": "n"."""
    if reset:
        _BASELINE.clear()
        _BASELINE.update(_counted())
    now = _counted()
    return {k: str(int(v - _BASELINE.get(k, 0))) for k, v in now.items() if v - _BASELINE.get(k, 0)}


def _abandoned_at_the_cap(make_model, receiver, settings, r, t) -> tuple[str, int]:
    """max 2: attempt 1 fails (retry), attempt 2 is claimed and its worker dies."""
    _settled(r, reset=True)
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1", callback_max_attempts=2))
    set_clock(lambda: t[0])
    receiver.statuses = [500]
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    assert callbacks.deliver(cid).status == "retry"
    t[0] += timedelta(hours=1)
    with transaction() as conn:
        assert callbacks.claim(conn, t[0], cid).attempts == 2
    t[0] += timedelta(hours=1)  # its lease expired long ago
    return job_id, cid


def test_a_stuck_delivery_at_the_cap_is_failed_by_its_next_message_not_sent_again(make_model, receiver, settings,
                                                                                  r):
    t = [now()]
    job_id, cid = _abandoned_at_the_cap(make_model, receiver, settings, r, t)
    with transaction() as conn:
        assert callbacks.claim(conn, t[0], cid) is None  # the claim never takes it
    assert _row(cid).status == "sending"
    assert callbacks.deliver(cid).status == "failed"
    cb = _row(cid)
    assert (cb.status, cb.attempts, cb.lease_until) == ("failed", 2, None)
    assert "gave up after 2 attempts" in cb.last_error
    assert len(receiver.requests) == 1
    assert _settled(r) == {"m|failed": "1"}
    assert callbacks.deliver(cid).status == "skipped" and _settled(r) == {"m|failed": "1"}


def test_the_sweep_fails_stuck_deliveries_at_the_cap_instead_of_republishing_them(make_model, receiver, settings, r):
    t = [now()]
    job_id, cid = _abandoned_at_the_cap(make_model, receiver, settings, r, t)
    rep = callbacks.deliver_due()
    assert (rep["failed"], rep["published"]) == (1, 0)
    assert _row(cid).status == "failed" and _settled(r) == {"m|failed": "1"}
    assert callbacks.deliver_due()["failed"] == 0


def test_a_lowered_cap_ends_pending_deliveries_that_used_it_up(make_model, receiver, settings, r):
    _settled(r, reset=True)
    t = [now()]
    set_clock(lambda: t[0])
    receiver.statuses = [500, 500]
    job_id, cid = done_with_callback(make_model, receiver.url + "/hook")
    for _ in range(2):
        assert callbacks.deliver(cid).status == "retry"
        t[0] += timedelta(hours=1)
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1", callback_max_attempts=2))
    assert callbacks.deliver(cid).status == "failed"
    assert len(receiver.requests) == 2 and _row(cid).status == "failed"
    # The sweep does the same for a row no message is coming for.
    _, other = done_with_callback(None, receiver.url + "/hook", biz="b2")
    with transaction() as conn:
        conn.execute(callbacks_table.update().where(callbacks_table.c.id == other).values(attempts=2))
    assert callbacks.deliver_due()["failed"] == 1 and _row(other).status == "failed"
    assert len(receiver.requests) == 2 and _settled(r) == {"m|failed": "2"}


def test_the_metric_counts_each_callback_once_when_it_is_settled(make_model, receiver, r):
    _settled(r, reset=True)
    t = [now()]
    set_clock(lambda: t[0])
    receiver.statuses = [503]
    _, cid = done_with_callback(make_model, receiver.url + "/hook")
    assert callbacks.deliver(cid).status == "retry"
    assert _settled(r) == {}  # a retried attempt settles nothing
    t[0] += timedelta(hours=1)
    assert callbacks.deliver(cid).status == "delivered"
    assert callbacks.deliver(cid).status == "skipped"
    assert _settled(r) == {"m|delivered": "1"}


def test_a_jobs_deliveries_of_both_kinds_in_one_list_and_none_is_an_empty_list(make_model, receiver, client,
                                                                               user_key, other_key):
    """GET /v1/jobs/{id}/deliveries: the callback and the webhooks, oldest first; a job without any is
    200 and an empty list (the console's job page asks it for every job), not the callback route's 404."""
    make_model("m")
    both = jobs.submit(P, "m", {"q": 1}, jobs.SubmitOptions(callback_url=receiver.url + "/hook",
                                                            webhook_url=receiver.url + "/wh")).row.id
    plain = jobs.submit(P, "m", {"q": 2}).row.id
    for job_id in (both, plain):
        assert execution.run_attempt(job_id, 0) == "done"
    got = client.get(f"/v1/jobs/{both}/deliveries", headers=auth(user_key))
    assert got.status_code == 200
    listed = got.get_json()["deliveries"]
    # Written by one statement (same created_at, random ids): the callback first, every time.
    assert [(d["kind"], d["event"], d["url"].split("?")[0], d["status"]) for d in listed] == [
        ("callback", "done", receiver.url + "/hook", "pending"), ("webhook", "done", receiver.url + "/wh", "pending")]
    assert all(d["job_id"] == both and d["log"] == [] and d["subscription_id"] is None for d in listed)
    none = client.get(f"/v1/jobs/{plain}/deliveries", headers=auth(user_key))
    assert (none.status_code, none.get_json()) == (200, {"deliveries": []})
    assert client.get(f"/v1/jobs/{plain}/callback", headers=auth(user_key)).status_code == 404
    for job_id in (both, plain, "job_000000000000000000000000"):  # another tenant's, or no job: 404
        assert client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth(other_key)).status_code == 404
