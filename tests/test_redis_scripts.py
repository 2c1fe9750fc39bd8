"""The Lua scripts on real Redis: admission, release, reconcile."""
from __future__ import annotations

import time

from app.infra.redis import gate, semaphore
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.tenancy.keys import Principal


def test_admit_is_idempotent_per_job_and_release_is_idempotent(settings, r):
    assert gate.gate_admit("m", "j1", 1).admitted
    assert gate.gate_admit("m", "j1", 1).admitted  # the same job again: no second slot
    d = gate.gate_admit("m", "j2", 1)
    assert not d.admitted and d.limit == 1 and d.depth == 1
    assert gate.gate_release("m", "j1") is True
    assert gate.gate_release("m", "j1") is False
    assert gate.gate_depth("m") == 0


def test_negative_or_zero_limits_reject(settings, r):
    assert not gate.gate_admit("m", "j", 0).admitted
    r.set("asynch:runtime:queue_limit:m", -1)
    assert not gate.gate_admit("m", "j", 10).admitted
    r.set("asynch:runtime:queue_limit:m", "garbage")  # unreadable override: the cap applies
    assert gate.gate_admit("m", "j", 10).admitted


def test_reconcile_adds_missing_and_drops_orphans_but_spares_young_slots(settings, r):
    r.zadd("asynch:gate:m", {"orphan-old": time.time() - 3600, "young": time.time()})
    added, removed = gate.gate_reconcile("m", ["db-1", "db-2"], grace_seconds=30)
    assert sorted(added) == ["db-1", "db-2"] and removed == ["orphan-old"]
    assert set(r.zrange("asynch:gate:m", 0, -1)) == {"db-1", "db-2", "young"}


def test_reconcile_gates_matches_the_database_after_a_wipe(make_model, r):
    make_model("m", queue_limit=10)
    p = Principal("t", "user", None)
    ids = {jobs.submit(p, "m", {}).row.id for _ in range(4)}
    jobs.cancel_job(p, ids.pop())
    r.flushdb()  # Redis loses everything
    r.zadd("asynch:gate:deleted-model", {"ghost": time.time() - 3600})
    rep = maintenance.reconcile_gates()
    assert rep.details["added"] == 3 and rep.details["removed"] == 1
    assert set(r.zrange("asynch:gate:m", 0, -1)) == ids
    assert r.zcard("asynch:gate:deleted-model") == 0


def test_recovery_reclaims_expired_semaphore_leases(settings, r):
    assert semaphore.semaphore_acquire("m", "t1", "dead-lease", cap=1, ttl_seconds=0.05).acquired
    assert semaphore.semaphore_acquire("m", "t2", "live-lease", cap=1, ttl_seconds=60).acquired
    time.sleep(0.1)  # the first lease runs out (Redis server time)
    assert maintenance.reclaim_dead_permits().processed == 1
    assert semaphore.semaphore_holders("m", "t1") == [] and semaphore.semaphore_holders("m", "t2") == ["live-lease"]
    assert semaphore.semaphore_acquire("m", "t1", "next", cap=1, ttl_seconds=60).acquired
