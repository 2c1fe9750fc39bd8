"""Webhooks on every terminal state (issue 16 item 5): Standard Webhooks
JSON POSTs to a job's own webhook (X-Webhook-Url) and to its tenant's
subscriptions, each with an event filter; exactly one delivery per
terminal state that passes the filter, none for the others; signed,
retried, logged, replayed; tenant-scoped; bad input changes nothing.

A real receiver over HTTP verifies every delivery with the independent
``standardwebhooks`` package.  Deliveries run in-process (as
tests/test_callbacks.py does) except the last test, which runs the whole
path on real processes: the API on a socket, a job worker and a callback
worker."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from click.testing import CliRunner
from helpers import WorkerProcess, auth, wait_until
from sqlalchemy import func, select, update
from standardwebhooks.webhooks import Webhook

from app.delivery import outbox as webhooks
from app.delivery import signing_secrets as callback_secrets
from app.cli import main as cli_main
from app.config import set_settings
from app.errors import Conflict
from app.infra.db import transaction
from app.infra.tables import delivery_attempts as webhook_attempts
from app.infra.tables import deliveries as webhook_deliveries
from app.infra.tables import tasks, webhook_subscriptions
from app.jobs import execution
from app.jobs import service as jobs
from app.maintenance import recovery
from app.tenancy.keys import Principal

A = Principal("tenant-a", "user", None)
ADMIN = Principal("ops", "admin", None)


class Receiver:
    """Records every POST and verifies it with standardwebhooks against the
    secret registered for its path.  ``statuses``: answers for the next
    requests (then 200)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.statuses: list[int] = []
        self.secrets: dict[str, str] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with owner.lock:
                    secret = owner.secrets.get(self.path)
                    try:
                        Webhook(secret).verify(body, headers)
                        verified = True
                    except Exception:  # no secret for this path, a bad signature, ...
                        verified = False
                    owner.requests.append({"path": self.path, "headers": headers, "body": body,
                                           "json": json.loads(body), "verified": verified})
                    status = owner.statuses.pop(0) if owner.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.statuses.clear()
            self.secrets.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver():
    rcv = Receiver()
    yield rcv
    rcv.stop()


@pytest.fixture(autouse=True)
def _setup(settings, receiver):
    receiver.reset()
    set_settings(settings.with_overrides(callback_allow_hosts="127.0.0.1", callback_backoff_seconds=0.01,
                                         callback_max_attempts=3))
    yield
    set_settings(settings)


def tenant_secret(tenant: str = "tenant-a") -> str:
    with transaction() as conn:
        return callback_secrets.tenant_secret(conn, tenant)["secret"]


def subscribe(client, key: str, url: str, events=None, tenant: str = "tenant-a") -> dict:
    body = {"url": url} if events is None else {"url": url, "events": events}
    resp = client.post(f"/v1/tenants/{tenant}/webhooks", json=body, headers=auth(key))
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()


def submit(client, key: str, payload: dict, **headers) -> str:
    resp = client.post("/v1/models/m/jobs", json=payload, headers={**auth(key), **headers})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["job_id"]


def deliveries(job_id: str | None = None) -> list:
    q = select(webhook_deliveries).where(webhook_deliveries.c.kind == "webhook").order_by(
        webhook_deliveries.c.created_at, webhook_deliveries.c.id)
    if job_id is not None:
        q = q.where(webhook_deliveries.c.job_id == job_id)
    with transaction() as conn:
        return conn.execute(q).all()


def deliver_all() -> None:
    """What the callback worker does with the doorbells: every due delivery, until none is left."""
    for _ in range(10):
        due = [d.id for d in deliveries() if d.status == "pending"]
        if not due:
            return
        for i in due:
            webhooks.deliver(i)
        time.sleep(0.05)


def test_one_signed_delivery_per_terminal_state_that_passes_the_filter(make_model, client, user_key, receiver):
    make_model("m")
    sub = subscribe(client, user_key, receiver.url + "/tenant", ["done", "canceled", "timeout"])
    assert sub["secret"].startswith("whsec_") and sub["events"] == ["done", "timeout", "canceled"]
    receiver.secrets["/tenant"] = sub["secret"]
    receiver.secrets["/job"] = tenant_secret()
    own = {"X-Webhook-Url": receiver.url + "/job", "X-Webhook-Events": "failed, timeout"}
    done = submit(client, user_key, {"q": 1}, **own)
    failed = submit(client, user_key, {"status": 400}, **own)
    canceled = submit(client, user_key, {"q": 2}, **own)
    timed_out = submit(client, user_key, {"q": 3}, **own)
    plain = submit(client, user_key, {"q": 4})  # no own webhook: the tenant's only
    assert execution.run_attempt(done, 0) == "done"
    assert execution.run_attempt(failed, 0) == "failed"
    assert execution.run_attempt(plain, 0) == "done"
    jobs.cancel_job(A, canceled)
    with pytest.raises(Conflict):
        jobs.cancel_job(A, canceled)  # ended already: no second event
    with transaction() as conn:
        conn.execute(update(tasks).where(tasks.c.id == timed_out).values(deadline_at=func.now() - func.make_interval(0, 0, 0, 0, 0, 0, 5)))
    assert recovery.time_out_overdue().processed == 1
    # Nothing more moves a terminal job: a second pass, the sweep, a late attempt.
    assert recovery.time_out_overdue().processed == 0
    assert execution.run_attempt(canceled, 0) != "done"

    deliver_all()
    webhooks.deliver_due()
    deliver_all()
    seen = sorted((r["path"], r["json"]["data"]["job_id"], r["json"]["type"]) for r in receiver.requests)
    assert seen == sorted([
        ("/tenant", done, "job.done"), ("/tenant", plain, "job.done"), ("/tenant", canceled, "job.canceled"),
        ("/tenant", timed_out, "job.timeout"),
        ("/job", failed, "job.failed"), ("/job", timed_out, "job.timeout"),
    ])
    assert all(r["verified"] for r in receiver.requests)
    # The body: the poll body, no payload, no secret; one webhook-id per delivery.
    body = next(r["json"] for r in receiver.requests if r["json"]["data"]["job_id"] == failed)
    poll = client.get(f"/v1/models/m/jobs/{failed}", headers=auth(user_key)).get_json()
    assert body["data"] == poll and body["timestamp"].endswith("Z")
    assert "q" not in json.dumps(body) and "status\": 400" not in json.dumps(body)
    ids = [r["headers"]["webhook-id"] for r in receiver.requests]
    assert len(set(ids)) == len(ids) == 6
    assert all(r["headers"]["content-type"] == "application/json" for r in receiver.requests)
    # The log, for the job's owner.
    view = client.get(f"/v1/jobs/{timed_out}/webhooks", headers=auth(user_key)).get_json()["deliveries"]
    assert sorted(((d["event"], d["status"], d["subscription_id"]) for d in view), key=str) == \
        sorted([("timeout", "delivered", None), ("timeout", "delivered", sub["id"])], key=str)
    assert all(len(d["log"]) == 1 and d["log"][0]["http_status"] == 200 for d in view)
    # Delivered is final: a duplicate doorbell sends nothing.
    for d in deliveries():
        assert webhooks.deliver(d.id).status == "skipped"
    assert len(receiver.requests) == 6


def test_racing_terminal_transitions_write_exactly_one_delivery(make_model, client, user_key, admin_key, receiver):
    make_model("m")
    sub_id = subscribe(client, user_key, receiver.url + "/tenant")["id"]
    job_ids = [submit(client, user_key, {"q": i}, **{"X-Webhook-Url": receiver.url + "/job"}) for i in range(6)]

    def end(job_id: str, how: int) -> None:
        try:
            if how == 0:
                jobs.cancel_job(A, job_id)
            elif how == 1:
                jobs.fail_job(ADMIN, job_id, "race")
            else:
                with transaction() as conn:
                    conn.execute(update(tasks).where(tasks.c.id == job_id).values(deadline_at=func.now()))
                recovery.time_out_overdue()
        except Conflict:
            pass

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(lambda a: end(*a), [(j, k % 3) for j in job_ids for k in range(6)]))
    for job_id in job_ids:
        rows = deliveries(job_id)
        state = client.get(f"/v1/models/m/jobs/{job_id}", headers=auth(user_key)).get_json()["state"]
        # One per receiver (the job's own, the tenant's), for the one state it reached.
        assert sorted(r.subscription_id for r in rows) == [0, sub_id] and len(rows) == 2
        assert {r.event for r in rows} == {state}


def test_a_failing_receiver_gets_retries_then_a_failed_delivery_that_replay_resends(make_model, client, user_key,
                                                                                     receiver):
    make_model("m")
    receiver.secrets["/job"] = tenant_secret()
    job_id = submit(client, user_key, {"q": 1}, **{"X-Webhook-Url": receiver.url + "/job"})
    assert execution.run_attempt(job_id, 0) == "done"
    (d,) = deliveries(job_id)
    receiver.statuses = [500, 503, 502]
    outs = []
    for _ in range(3):
        wait_until(lambda: next(iter(deliveries(job_id))).status == "pending" or outs, timeout=5)
        time.sleep(0.05)  # past the (tiny) backoff
        outs.append(webhooks.deliver(d.id).status)
    assert outs == ["retry", "retry", "failed"]
    view = client.get(f"/v1/jobs/{job_id}/webhooks", headers=auth(user_key)).get_json()["deliveries"][0]
    assert view["status"] == "failed" and view["attempts"] == 3 and view["last_error"] == "HTTP 502"
    assert [(e["attempt"], e["http_status"]) for e in view["log"]] == [(1, 500), (2, 503), (3, 502)]
    first = receiver.requests[0]
    # The operator replays it from the command line; a second replay of a pending one is refused.
    out = CliRunner().invoke(cli_main, ["callbacks", "replay", str(d.id)])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["status"] == "pending"
    again = CliRunner().invoke(cli_main, ["callbacks", "replay", str(d.id)])
    assert again.exit_code != 0 and "only a failed delivery" in again.output
    assert webhooks.deliver(d.id).status == "delivered"
    last = receiver.requests[-1]
    assert len(receiver.requests) == 4 and last["verified"]
    # The same message: webhook-id and body; a new signature time.
    assert last["headers"]["webhook-id"] == first["headers"]["webhook-id"] and last["body"] == first["body"]
    view = client.get(f"/v1/jobs/{job_id}/webhooks", headers=auth(user_key)).get_json()["deliveries"][0]
    assert view["status"] == "delivered" and [e["http_status"] for e in view["log"]] == [500, 503, 502, 200]
    # A delivered one is not replayed (409); an unknown one is 404.
    assert client.post(f"/v1/webhook-deliveries/{d.id}/replay", headers=auth(user_key)).status_code == 409
    assert client.post("/v1/webhook-deliveries/999999999/replay", headers=auth(user_key)).status_code == 404


def test_tenant_b_can_neither_see_nor_replay_tenant_a_deliveries(make_model, client, user_key, other_key,
                                                                  receiver):
    make_model("m")
    sub = subscribe(client, user_key, receiver.url + "/tenant")
    receiver.secrets["/tenant"] = sub["secret"]
    job_id = submit(client, user_key, {"q": 1})
    receiver.statuses = [500, 500, 500]
    assert execution.run_attempt(job_id, 0) == "done"
    (d,) = deliveries(job_id)
    for _ in range(3):
        time.sleep(0.05)
        webhooks.deliver(d.id)
    assert deliveries(job_id)[0].status == "failed"
    assert client.get(f"/v1/jobs/{job_id}/webhooks", headers=auth(other_key)).status_code == 404
    assert client.post(f"/v1/webhook-deliveries/{d.id}/replay", headers=auth(other_key)).status_code == 404
    assert client.get("/v1/tenants/tenant-a/webhooks", headers=auth(other_key)).status_code == 403
    assert client.post("/v1/tenants/tenant-a/webhooks", json={"url": receiver.url + "/b"},
                       headers=auth(other_key)).status_code == 403
    assert client.delete(f"/v1/tenants/tenant-a/webhooks/{sub['id']}", headers=auth(other_key)).status_code == 403
    assert client.delete(f"/v1/tenants/tenant-b/webhooks/{sub['id']}", headers=auth(other_key)).status_code == 404
    # Nothing changed: still failed, still subscribed, and B's own list is empty.
    assert deliveries(job_id)[0].status == "failed" and deliveries(job_id)[0].attempts == 3
    assert [w["id"] for w in client.get("/v1/tenants/tenant-a/webhooks", headers=auth(user_key))
            .get_json()["webhooks"]] == [sub["id"]]
    assert client.get("/v1/tenants/tenant-b/webhooks", headers=auth(other_key)).get_json() == {"webhooks": []}
    # The owner replays it.
    assert client.post(f"/v1/webhook-deliveries/{d.id}/replay", headers=auth(user_key)).get_json()["status"] == "pending"
    assert webhooks.deliver(d.id).status == "delivered"


def test_a_tenant_sees_the_host_it_gave_not_the_address_it_resolved_to(settings, make_model, client, user_key,
                                                                         admin_key, receiver):
    """Issue 32 item 8: the delivery log showed a tenant the address an
    allowlisted name resolved to (``localhost`` -> ``127.0.0.1``).  The
    tenant sees its URL's host; an admin the address connected to."""
    set_settings(settings.with_overrides(delivery_allow_hosts="localhost", delivery_backoff_seconds=0.01))
    make_model("m")
    port = receiver.url.rsplit(":", 1)[1]
    job_id = submit(client, user_key, {"q": 1}, **{"X-Webhook-Url": f"http://localhost:{port}/job",
                                                     "X-Callback-Url": f"http://localhost:{port}/cb"})
    assert execution.run_attempt(job_id, 0) == "done"
    with transaction() as conn:
        ids = conn.execute(select(webhook_deliveries.c.id).where(webhook_deliveries.c.job_id == job_id)).scalars().all()
    for i in ids:
        assert webhooks.deliver(i).status in ("delivered", "retry")  # the receiver takes POSTs only: the GET is 501
    with transaction() as conn:  # every attempt connected to the loopback address
        assert set(conn.execute(select(webhook_attempts.c.address)).scalars()) == {"127.0.0.1"}
    for path in ("webhooks", "callback"):
        mine = client.get(f"/v1/jobs/{job_id}/{path}", headers=auth(user_key)).get_json()
        ops = client.get(f"/v1/jobs/{job_id}/{path}", headers=auth(admin_key)).get_json()
        mine, ops = (v["deliveries"][0] if path == "webhooks" else v for v in (mine, ops))
        assert [e["address"] for e in mine["log"]] == ["localhost"], mine
        assert [e["address"] for e in ops["log"]] == ["127.0.0.1"], ops
        assert "127.0.0.1" not in json.dumps(mine)


@pytest.mark.parametrize("body", [
    {"url": "http://10.0.0.7/hook"},                      # the SSRF guard
    {"url": "ftp://example.com/x"},
    {"url": "http://127.0.0.1:1/x", "events": ["started"]},
    {"url": "http://127.0.0.1:1/x", "events": []},
    {"url": "http://127.0.0.1:1/x", "extra": 1},
    {"events": ["done"]},
    {"url": 7},
])
def test_a_bad_subscription_is_422_and_changes_nothing(client, user_key, body):
    resp = client.post("/v1/tenants/tenant-a/webhooks", json=body, headers=auth(user_key))
    assert resp.status_code == 422, resp.get_json()
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(webhook_subscriptions)).scalar_one() == 0


@pytest.mark.parametrize("headers, pointer", [
    ({"X-Webhook-Url": "http://10.0.0.7/hook"}, "/webhookUrl"),
    ({"X-Webhook-Url": "http://127.0.0.1:1/x", "X-Webhook-Events": "done,started"}, "X-Webhook-Events"),
    ({"X-Webhook-Events": "done"}, "/webhookEvents"),
])
def test_a_bad_job_webhook_is_422_and_admits_nothing(make_model, client, user_key, headers, pointer):
    make_model("m")
    resp = client.post("/v1/models/m/jobs", json={"q": 1}, headers={**auth(user_key), **headers})
    assert resp.status_code == 422, resp.get_json()
    assert pointer in json.dumps(resp.get_json())
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 0


def test_deleted_subscription_gets_no_new_deliveries(make_model, client, user_key, receiver):
    make_model("m")
    sub = subscribe(client, user_key, receiver.url + "/tenant")
    assert client.delete(f"/v1/tenants/tenant-a/webhooks/{sub['id']}", headers=auth(user_key)).status_code == 204
    job_id = submit(client, user_key, {"q": 1})
    assert execution.run_attempt(job_id, 0) == "done"
    assert deliveries(job_id) == []


def test_on_real_processes_the_callback_worker_delivers_each_terminal_state(api_url, workers, test_env,
                                                                            tmp_path, make_model, user_key,
                                                                            receiver):
    make_model("m")
    r = requests.post(f"{api_url}/v1/tenants/tenant-a/webhooks", json={"url": receiver.url + "/tenant",
                                                                       "events": ["done", "failed"]},
                      headers=auth(user_key), timeout=10)
    assert r.status_code == 201
    receiver.secrets["/tenant"] = r.json()["secret"]
    cbw = WorkerProcess({**test_env, "ASYNCH_CALLBACK_ALLOW_HOSTS": "127.0.0.1"}, concurrency=2,
                        log_path=tmp_path / "cbw.log", name="cbw", callbacks=True).start()
    try:
        ids = {}
        for name, payload in (("done", {"q": 1}), ("failed", {"status": 400}), ("canceled", {"sleep_ms": 3000})):
            resp = requests.post(f"{api_url}/v1/models/m/jobs", json=payload, headers=auth(user_key), timeout=10)
            assert resp.status_code == 202
            ids[name] = resp.json()["job_id"]
        wait_until(lambda: requests.get(f"{api_url}/v1/models/m/jobs/{ids['canceled']}", headers=auth(user_key),
                                        timeout=10).json()["state"] == "running", what="running")
        assert requests.post(f"{api_url}/v1/models/m/jobs/{ids['canceled']}/cancel", headers=auth(user_key),
                             timeout=10).status_code == 200
        wait_until(lambda: len(receiver.requests) >= 2, timeout=30, what="two deliveries")
        time.sleep(1.0)  # nothing more arrives: canceled is filtered out
        got = sorted((q["json"]["data"]["job_id"], q["json"]["type"]) for q in receiver.requests)
        assert got == sorted([(ids["done"], "job.done"), (ids["failed"], "job.failed")])
        assert all(q["verified"] for q in receiver.requests)
        assert deliveries(ids["canceled"]) == []
    finally:
        cbw.stop()
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(webhook_attempts)).scalar_one() == 2


def test_a_batch_item_carries_its_own_webhook_and_a_bad_one_is_that_items_422(make_model, client, user_key,
                                                                              receiver, model_server):
    make_model("m")
    receiver.secrets["/job"] = tenant_secret()
    # "hold": if the module's resident worker takes the job, its call waits, so the job is still ours to cancel.
    resp = client.post("/v1/models/m/jobs:batch", headers=auth(user_key), json={"jobs": [
        {"payload": {"q": 1, "hold": "batch-item"}, "webhook_url": receiver.url + "/job",
         "webhook_events": ["canceled"]},
        {"payload": {"q": 2}, "webhook_url": receiver.url + "/job", "webhook_events": ["started"]},
        {"payload": {"q": 3}, "webhook_url": "http://10.0.0.7/x"},
        {"payload": {"q": 4}, "webhook_events": ["done"]}]})
    assert resp.status_code == 207, resp.get_json()
    results = resp.get_json()["results"]
    assert [r["status"] for r in results] == [202, 422, 422, 422]
    pointers = json.dumps(results[1:])
    assert "/jobs/1/webhook_events/0" in pointers and "/jobs/2/webhook_url" in pointers \
        and "/jobs/3/webhook_events" in pointers
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 1
    jobs.cancel_job(A, results[0]["job_id"])
    model_server.state.release("batch-item")
    deliver_all()
    (req,) = receiver.requests
    assert req["verified"] and req["json"]["type"] == "job.canceled" and req["json"]["data"]["job_id"] == results[0]["job_id"]


def test_a_webhook_secret_is_encrypted_at_rest_and_moves_with_secrets_rotate(settings, client, user_key):
    from cryptography.fernet import Fernet

    from app.infra import secretbox

    k1, k2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    base = settings.with_overrides(callback_allow_hosts="127.0.0.1")
    set_settings(base.with_overrides(secrets_keys=k1))
    sub = subscribe(client, user_key, "http://127.0.0.1:1/x")
    with transaction() as conn:
        stored = conn.execute(select(webhook_subscriptions.c.secret)).scalar_one()
    assert secretbox.is_encrypted(stored) and sub["secret"] not in stored
    set_settings(base.with_overrides(secrets_keys=f"{k2},{k1}"))
    out = CliRunner().invoke(cli_main, ["secrets", "rotate"])
    assert out.exit_code == 0 and json.loads(out.output)["webhook_secrets"] == 1, out.output
    set_settings(base.with_overrides(secrets_keys=k2))  # the old key can go
    (listed,) = client.get("/v1/tenants/tenant-a/webhooks", headers=auth(user_key)).get_json()["webhooks"]
    assert listed["secret"] == sub["secret"]


def test_delivery_and_subscription_ids_are_random_not_a_sequence(make_model, client, user_key, receiver):
    """Issue 21 item 9: ``wh_1``, ``wh_2`` ... showed every tenant the
    platform's delivery volume.  Ids tenants see are random (revision 0017),
    exact as JSON numbers, and each delivery's webhook-id stays its own."""
    make_model("m")
    subs = [subscribe(client, user_key, receiver.url + f"/s{i}") for i in range(3)]
    receiver.secrets.update({f"/s{i}": sub["secret"] for i, sub in enumerate(subs)})
    job_ids = [submit(client, user_key, {"q": i}, **{"X-Webhook-Url": receiver.url + "/job"}) for i in range(4)]
    receiver.secrets["/job"] = tenant_secret()
    for job_id in job_ids:
        execution.run_attempt(job_id, 0)  # 'stale' if the module's resident worker took it first
    assert wait_until(lambda: all(client.get(f"/v1/models/m/jobs/{j}", headers=auth(user_key)).get_json()["state"]
                                  == "done" for j in job_ids), 30)
    rows = deliveries()
    assert len(rows) == 16  # 4 jobs x (3 subscriptions + their own webhook)
    for ids in ([r.id for r in rows], [s["id"] for s in subs]):
        assert len(set(ids)) == len(ids)
        assert all(0 < i < 2**53 for i in ids)
        # A sequence gives neighbours; 16 (or 3) draws from 2**53 are never all within 1,000 of each other.
        assert max(ids) - min(ids) > 1000, ids
    deliver_all()  # (or the module's resident callback worker: each delivery is sent once either way)
    assert wait_until(lambda: len(receiver.requests) >= 16, 30)
    headers = [r["headers"] for r in receiver.requests]
    assert len(headers) == 16 and all(r["verified"] for r in receiver.requests)
    assert {h["webhook-id"] for h in headers} == {f"wh_{r.id}" for r in rows}
    assert {h["x-asynch-delivery"] for h in headers} == {f"{r.id}.1" for r in rows}
    # The job's view lists its deliveries in the order they were written, with their random ids.
    view = client.get(f"/v1/jobs/{job_ids[0]}/webhooks", headers=auth(user_key)).get_json()["deliveries"]
    assert sorted(d["id"] for d in view) == sorted(r.id for r in rows if r.job_id == job_ids[0])
