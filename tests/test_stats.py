"""Usage stats: asynch_model_stat counts exactly the calls the model service
received -- not upload retries, not duplicate deliveries -- and the read API
(v1 /v1/stats and the seed's /stat/getModelStat) scopes users to their tenant."""
from __future__ import annotations

from collections import Counter
from datetime import date

import pytest
from helpers import ROOT, WorkerProcess, auth, wait_until
from sqlalchemy import select

from app.infra.db import transaction
from app.infra.celery_config import RUN_JOBS_TASK
from app.infra.publisher import publish_bell, publish_task
from app.infra.tables import model_stats, tasks
from app.jobs import service as jobs
from app.jobs import stats
from app.maintenance import passes as maintenance
from app.states import JobState
from app.tenancy.keys import Principal


@pytest.fixture
def flaky_worker(test_env, tmp_path):
    log = tmp_path / "flaky.log"
    log.touch()
    env = {**test_env, "PYTHONPATH": str(ROOT / "tests"), "FLAKY_STORAGE_LOG": str(log),
           "ASYNCH_PERMIT_RETRY_SECONDS": "0.2"}
    w = WorkerProcess(env, concurrency=3, log_path=tmp_path / "w.log", name="flaky",
                      extra_args=("--include", "flaky_storage")).start()
    yield w, log
    w.stop()


def _states(ids) -> set[int]:
    with transaction() as conn:
        return {r.state for r in conn.execute(select(tasks.c.state).where(tasks.c.id.in_(ids)))}


@pytest.mark.e2e
@pytest.mark.slow
def test_stats_equal_the_calls_the_model_received(flaky_worker, make_model, model_server):
    worker, flaky_log = flaky_worker
    make_model("counted", max_concurrency=2, queue_limit=100, retry_times=2)
    who = [("tenant-a", "alice"), ("tenant-a", "bob"), ("tenant-b", "carol")]
    ids, marked = [], 0
    for i in range(24):
        tenant, creator = who[i % 3]
        payload = {"who": f"{tenant}/{creator}", "i": i}
        if i % 3 == 0:
            payload["flaky_upload"] = True  # storage fails on this job's first upload try
            marked += 1
        if i % 4 == 0:
            payload.update(tag=f"t{i}", fail_first=1)  # the model answers 500 once: a second, real call
        job_id = jobs.submit(Principal(tenant, "user", None), "counted", payload,
                             jobs.SubmitOptions(creator=creator)).row.id
        # A duplicate doorbell for every job, and a release-before-doorbells message naming it: both pulls
        # that find the job taken or take it once (the claim CAS).
        publish_bell("counted")
        publish_task(RUN_JOBS_TASK, [[[job_id, 0]]])
        ids.append(job_id)

    def all_done():
        maintenance.retry_due()  # what beat does: failed attempts go back to the queue
        return _states(ids) == {JobState.DONE}

    wait_until(all_done, timeout=90, interval=0.3, what="24 jobs done")
    calls = model_server.state.calls
    assert len(calls) == 24 + 6  # one per job, plus one for each model failure
    assert len(flaky_log.read_text().split()) == marked  # uploads really failed, and were retried
    with transaction() as conn:
        rows = conn.execute(select(model_stats)).all()
    counted = Counter()
    for r in rows:
        counted[f"{r.tenant_id}/{r.creator}"] += r.request_count
    received = Counter(c["payload"]["who"] for c in calls)
    assert counted == received
    assert {r.model_name for r in rows} == {"counted"}


def _seed_stats():
    with transaction() as conn:
        for day, tenant, creator, model, n in ((date(2026, 1, 1), "tenant-a", "alice", "m1", 3),
                                               (date(2026, 1, 2), "tenant-a", "bob", "m1", 4),
                                               (date(2026, 1, 2), "tenant-a", "alice", "m2", 5),
                                               (date(2026, 1, 3), "tenant-b", "carol", "m1", 7)):
            conn.execute(*stats.call_counted(conn, day, tenant, creator, model, n))


def test_users_read_their_own_tenant_and_admins_any(client, user_key, admin_key):
    _seed_stats()
    mine = client.get("/v1/stats", headers=auth(user_key)).get_json()
    assert mine["total"] == 12 and {r["tenant_id"] for r in mine["rows"]} == {"tenant-a"}
    forbidden = client.get("/v1/stats?tenant=tenant-b", headers=auth(user_key))
    assert forbidden.status_code == 403
    assert client.get("/v1/stats?tenant=tenant-a", headers=auth(user_key)).get_json()["total"] == 12
    assert client.get("/v1/stats", headers=auth(admin_key)).get_json()["total"] == 19
    assert client.get("/v1/stats?tenant=tenant-b", headers=auth(admin_key)).get_json()["total"] == 7
    body = client.get("/v1/stats?from=2026-01-02&to=2026-01-02&model=m1", headers=auth(admin_key)).get_json()
    assert body["rows"] == [{"day": "2026-01-02", "tenant_id": "tenant-a", "creator": "bob", "model_name": "m1",
                             "request_count": 4}]
    assert body["from"] == body["to"] == "2026-01-02" and body["total"] == 4
    bad = client.get("/v1/stats?from=yesterday&to=2026-13-01", headers=auth(user_key))
    assert bad.status_code == 422 and {e["pointer"] for e in bad.get_json()["errors"]} == {"/from", "/to"}
    bad = client.get("/v1/stats?from=2026-01-03&to=2026-01-01", headers=auth(user_key))
    assert bad.status_code == 422
    seed = client.get("/stat/getModelStat?from=2026-01-02", headers=auth(user_key)).get_json()
    assert seed["code"] == 0 and seed["data"]["total"] == 9
    assert client.get("/stat/getModelStat?tenant=tenant-b", headers=auth(user_key)).get_json()["code"] == 403


def test_concurrent_counts_of_the_same_tenants_in_any_order_never_deadlock(settings):
    """Done statements of several worker processes count the same (tenant, creator, model) rows, each group in
    its own arrival order: 8 threads x 30 upserts of 6 shared keys, each in a shuffled order.  Every upsert
    commits (a deadlock between two such statements once left a job's done write crashed in a CI run) and the
    counts add up exactly."""
    import random
    import threading

    from app.infra.db import atomic_statement

    day, keys = date(2026, 1, 2), [(f"dl{i}", "c" if i % 2 else None, "dlm") for i in range(6)]
    errors: list[Exception] = []

    def run(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(30):
            order = rnd.sample(keys, len(keys))
            counts = Counter({k: 1 for k in order})  # insertion order: this group's
            try:
                with atomic_statement() as conn:
                    conn.execute(*stats.calls_counted(conn, day, counts))
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    with transaction() as conn:
        got = dict(conn.execute(select(model_stats.c.tenant_id, model_stats.c.request_count)
                                .where(model_stats.c.model_name == "dlm", model_stats.c.day == day)).all())
    assert got == {k[0]: 8 * 30 for k in keys}
