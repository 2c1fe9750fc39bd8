"""The outbox gives each tenant a share of the delivery pool (issue 22 item
3; the shipped defaults, issue 32 item 8).

Tenant B's tarpit webhook receivers (they accept, then trickle one byte
every 0.5 s, so every attempt runs into the delivery deadline) try to hold
every process of a real callback worker (`asynch callback-worker` as
shipped).  The claim serves the tenant with the fewest deliveries in
flight first and holds each tenant below its cap, which is never more than
the node's processes - 1: one process stays free of B, and tenant A's
delivery is made while every one of B's attempts is still in its tarpit.
Before, the callback worker ran 2 processes by default against a
per-tenant cap of 4: B held both, and A waited for one of B's attempts to
end (up to the 10 s delivery timeout; claimed oldest-first, for B's whole
backlog: ~59 s before the outbox was one system)."""
from __future__ import annotations

import time

import pytest
from helpers import WorkerProcess, auth, wait_until
from tarpit import Tarpit
from test_webhooks import Receiver

from app.cli.processes import CALLBACK_PROCESSES, callback_worker_argv
from app.config import Settings, set_settings
from app.delivery import outbox
from app.jobs import execution
from app.jobs import service as jobs
from app.tenancy.keys import Principal

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

A, B = Principal("tenant-a", "user", None), Principal("tenant-b", "user", None)
PITS = CALLBACK_PROCESSES  # as many of B's receivers as the node has processes: B would take them all


@pytest.fixture
def pits():
    out = [Tarpit("status", interval=0.5) for _ in range(PITS)]
    yield out
    for pit in out:
        pit.stop()


def _done(principal: Principal, **opts) -> str:
    job_id = jobs.submit(principal, "m", {"q": time.time_ns()}, jobs.SubmitOptions(**opts)).row.id
    assert execution.run_attempt(job_id, 0) == "done"
    return job_id


def test_with_the_shipped_defaults_one_tenants_tarpits_leave_a_process_for_another(
        settings, test_env, tmp_path, make_model, client, other_key, pits):
    """No setting of the share is given: the callback worker runs as
    `asynch callback-worker` (its default -c), with the default
    ASYNCH_DELIVERY_TENANT_INFLIGHT and ASYNCH_DELIVERY_TIMEOUT_SECONDS (10 s).
    Asserted by order, not time: A's delivery arrives before any of B's
    attempts has ended, with B holding all it may."""
    defaults = Settings()
    share = min(defaults.delivery_tenant_inflight, CALLBACK_PROCESSES - 1)
    assert share < CALLBACK_PROCESSES  # the shipped defaults leave a process free of any one tenant
    set_settings(settings.with_overrides(delivery_allow_hosts="127.0.0.1"))
    make_model("m")
    receiver = Receiver()
    env = {**test_env, "ASYNCH_DELIVERY_ALLOW_HOSTS": "127.0.0.1"}
    for pit in pits:
        resp = client.post("/v1/tenants/tenant-b/webhooks", json={"url": f"{pit.url}/hook"}, headers=auth(other_key))
        assert resp.status_code == 201, resp.get_json()
    cbw = WorkerProcess(env, log_path=tmp_path / "cbw.log", name="share", argv=callback_worker_argv()).start()
    try:
        _done(B)  # one delivery into each tarpit
        wait_until(lambda: sum(len(p.accepted) for p in pits) >= share, timeout=30, what="B's share of the pool busy")
        _done(A, webhook_url=f"{receiver.url}/a")
        wait_until(lambda: receiver.requests, timeout=60, interval=0.02, what="tenant A's delivery")
        assert not any(p.gone for p in pits), "tenant A's delivery waited for one of B's attempts to end"
        assert sum(len(p.accepted) for p in pits) == share, "B held more of the pool than its share"
        # B is not starved either: when an attempt ends, its next row goes out.
        wait_until(lambda: sum(len(p.accepted) for p in pits) == PITS, timeout=60, what="B's last delivery tried")
    finally:
        cbw.stop()
        receiver.stop()


def test_a_tenant_holds_at_most_all_but_one_process_of_the_claiming_node(settings, make_model):
    """The claim's cap is ASYNCH_DELIVERY_TENANT_INFLIGHT, never more than
    the node's processes - 1 (the worker tells the outbox its pool size at
    start); a node of one process keeps the setting."""
    from datetime import timedelta

    from app.clock import now
    from app.infra.db import transaction

    set_settings(settings.with_overrides(delivery_allow_hosts="127.0.0.1", delivery_tenant_inflight=3))
    make_model("m")
    hook = {"webhook_url": "http://127.0.0.1:9/hook"}
    b1, _b2, a = _done(B, **hook), _done(B, **hook), _done(A, **hook)
    try:
        assert outbox.tenant_cap() == 3  # in this process no pool size is known: the setting
        outbox.set_pool_processes(1)
        assert outbox.tenant_cap() == 3
        outbox.set_pool_processes(2)
        assert outbox.tenant_cap() == 1
        claimed = []
        for _ in range(3):
            with transaction() as conn:
                row = outbox.claim(conn, now() + timedelta(seconds=1))
                claimed.append(row and row.job_id)
        assert claimed == [b1, a, None]  # B holds one of the two processes; A the other; nothing more
    finally:
        outbox.set_pool_processes(None)


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
