"""The Lua scripts on real Redis: admission, release, reconcile."""
from __future__ import annotations

import time

from app.infra.redis import gate
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.tenancy.keys import Principal


def test_admit_is_idempotent_per_job_and_release_is_idempotent(settings, r):
    assert gate.gate_admit("m", "t", "j1", 1).admitted
    assert gate.gate_admit("m", "t", "j1", 1).admitted  # the same job again: no second slot
    d = gate.gate_admit("m", "t", "j2", 1)
    assert not d.admitted and d.limit == 1 and d.depth == 1 and d.refused_by == "model"
    assert gate.gate_release("m", "t", "j1") is True
    assert gate.gate_release("m", "t", "j1") is False
    assert gate.gate_depth("m") == 0 and gate.tenant_depth("m", "t") == 0


def test_negative_or_zero_limits_reject(settings, r):
    assert not gate.gate_admit("m", "t", "j", 0).admitted
    r.set("asynch:runtime:queue_limit:{m}", -1)
    assert not gate.gate_admit("m", "t", "j", 10).admitted
    r.set("asynch:runtime:queue_limit:{m}", "garbage")  # unreadable override: the cap applies
    assert gate.gate_admit("m", "t", "j", 10).admitted


def test_a_tenant_at_its_share_is_refused_and_others_are_admitted(settings, r):
    assert [gate.gate_admit("m", "a", f"a{i}", 10, 3).admitted for i in range(4)] == [True, True, True, False]
    d = gate.gate_admit("m", "a", "a9", 10, 3)
    assert d.refused_by == "tenant" and d.limit == 3 and d.depth == 3
    assert gate.gate_admit("m", "b", "b0", 10, 3).admitted  # another tenant still gets in
    r.set("asynch:runtime:tenant_queue_limit:{m}", 1)  # the runtime override lowers every share
    assert not gate.gate_admit("m", "b", "b1", 10, 3).admitted
    r.set("asynch:runtime:tenant_queue_limit:{m}", 50)  # ...but never raises it
    assert gate.gate_admit("m", "c", "c0", 10, 1).admitted and not gate.gate_admit("m", "c", "c1", 10, 1).admitted
    assert gate.gate_depth("m") == 5 and gate.tenant_depth("m", "a") == 3


def test_reconcile_adds_missing_and_drops_orphans_but_spares_young_slots(settings, r):
    r.zadd("asynch:gate:{m}", {"orphan-old": time.time() - 3600, "young": time.time()})
    added, removed = gate.gate_reconcile("m", ["db-1", "db-2"], grace_seconds=30)
    assert sorted(added) == ["db-1", "db-2"] and removed == ["orphan-old"]
    assert set(r.zrange("asynch:gate:{m}", 0, -1)) == {"db-1", "db-2", "young"}


def test_reconcile_gates_matches_the_database_after_a_wipe(make_model, r):
    make_model("m", queue_limit=10)
    p = Principal("t", "user", None)
    ids = {jobs.submit(p, "m", {}).row.id for _ in range(4)}
    jobs.cancel_job(p, ids.pop())
    r.flushdb()  # Redis loses everything
    r.zadd("asynch:gate:{deleted-model}", {"ghost": time.time() - 3600})
    rep = maintenance.reconcile_gates()
    assert rep.details["added"] == 3 and rep.details["removed"] == 1
    assert set(r.zrange("asynch:gate:{m}", 0, -1)) == ids
    assert set(r.zrange("asynch:tgate:{m}:t", 0, -1)) == ids  # the tenant's share too
    assert r.zcard("asynch:gate:{deleted-model}") == 0
