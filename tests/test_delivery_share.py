"""The outbox gives each tenant a share of the delivery pool (issue 22 item
3): tenant B's three tarpit webhook receivers (they accept, then trickle one
byte every 0.5 s, so every attempt runs into the delivery deadline) hold
every process of a real callback worker (`asynch callback-worker`, -c 2),
with a backlog of due rows older than tenant A's.  Tenant A's delivery must
still arrive within one delivery deadline (plus slack): the next process to
finish one of B's attempts claims A's row, because the claim serves the
tenant with the fewest deliveries in flight first.  Claimed in row order
(oldest due first) A waited for B's whole backlog (about 59 s before the
outbox was one system)."""
from __future__ import annotations

import time

import pytest
from helpers import WorkerProcess, auth, wait_until
from tarpit import Tarpit
from test_webhooks import Receiver

from app.config import set_settings
from app.jobs import execution
from app.jobs import service as jobs
from app.tenancy.keys import Principal

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DEADLINE = 2.0
SLACK = 1.0  # claim, send, record and the poll, on a loaded machine
A, B = Principal("tenant-a", "user", None), Principal("tenant-b", "user", None)


@pytest.fixture
def pits():
    out = [Tarpit("status", interval=0.5) for _ in range(3)]
    yield out
    for pit in out:
        pit.stop()


def _done(principal: Principal, **opts) -> str:
    job_id = jobs.submit(principal, "m", {"q": time.time_ns()}, jobs.SubmitOptions(**opts)).row.id
    assert execution.run_attempt(job_id, 0) == "done"
    return job_id


def test_three_tarpit_receivers_of_one_tenant_delay_another_by_one_deadline_at_most(
        settings, test_env, tmp_path, make_model, client, user_key, other_key, pits):
    set_settings(settings.with_overrides(delivery_allow_hosts="127.0.0.1"))
    make_model("m")
    receiver = Receiver()
    env = {**test_env, "ASYNCH_DELIVERY_ALLOW_HOSTS": "127.0.0.1", "ASYNCH_DELIVERY_TIMEOUT_SECONDS": str(DEADLINE),
           # B's failed attempts come back at once: its rows are always due, and older than A's.
           "ASYNCH_DELIVERY_BACKOFF_SECONDS": "0.1", "ASYNCH_DELIVERY_BACKOFF_MAX_SECONDS": "0.2"}
    for pit in pits:
        resp = client.post("/v1/tenants/tenant-b/webhooks", json={"url": f"{pit.url}/hook"}, headers=auth(other_key))
        assert resp.status_code == 201, resp.get_json()
    cbw = WorkerProcess(env, concurrency=2, log_path=tmp_path / "cbw.log", name="share", callbacks=True).start()
    try:
        for _ in range(4):  # 12 deliveries into the tarpits, 6 deadlines of work per process
            _done(B)
        wait_until(lambda: sum(len(p.accepted) for p in pits) >= 2, timeout=30, what="both processes in a tarpit")
        for n in range(2):
            t0 = time.monotonic()
            _done(A, webhook_url=f"{receiver.url}/a{n}")
            wait_until(lambda: len(receiver.requests) > n, timeout=60, interval=0.02, what="tenant A's delivery")
            took = time.monotonic() - t0
            assert took <= DEADLINE + SLACK, f"tenant A's delivery took {took:.2f}s behind tenant B's tarpits"
        # B is not starved either: its deliveries go on being tried.
        wait_until(lambda: sum(len(p.accepted) for p in pits) >= 6, timeout=30, what="B's next attempts")
    finally:
        cbw.stop()
        receiver.stop()


def test_the_claim_serves_the_fewest_in_flight_first_and_holds_each_tenant_to_its_cap(settings, make_model):
    """The claim itself (in-process): tenant B's two rows are older than A's,
    yet with B at its cap (1 here) the next claim takes A's, and the one after
    takes nothing until one of them finishes."""
    from datetime import timedelta

    from app.clock import now
    from app.delivery import outbox
    from app.infra.db import transaction

    set_settings(settings.with_overrides(delivery_allow_hosts="127.0.0.1", delivery_tenant_inflight=1))
    make_model("m")
    hook = {"webhook_url": "http://127.0.0.1:9/hook"}
    b1, b2, a = _done(B, **hook), _done(B, **hook), _done(A, **hook)
    claimed = []
    for _ in range(3):
        with transaction() as conn:
            row = outbox.claim(conn, now() + timedelta(seconds=1))
            claimed.append(row and row.job_id)
    assert claimed == [b1, a, None]
    # B's first attempt ends (back to pending): B is under its cap again, and its oldest due row goes next.
    with transaction() as conn:
        conn.execute(outbox.deliveries.update().where(outbox.D.job_id == b1).values(status="failed"))
        assert outbox.claim(conn, now() + timedelta(seconds=1)).job_id == b2
