"""Fair share by default (issue 23 item 1; docs/architecture.md "Fair share at
admission"): with a fresh install's settings a tenant alone fills a model's
queue, another tenant's first job is still admitted (the newcomer reserve above
the limit), a
tenant over its weighted share is refused while one under it is admitted,
and no number of racing submits passes the limit but by newcomers' first jobs.

Real pieces: PostgreSQL, Redis (the gate's Lua step), the API's routes in
process; threads and processes race through the same code."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from helpers import auth, gate_depth, make_key, tenant_depth

from app.config import set_settings
from app.infra.redis import dispatch as redis_dispatch
from app.infra.redis import gate


def _post(client, key, model="q", n=1) -> list[int]:
    return [client.post(f"/v1/models/{model}/jobs", json={}, headers=auth(key)).status_code for _ in range(n)]


def test_fresh_defaults_a_tenant_alone_fills_the_queue_and_another_is_still_admitted(client, make_model, r):
    make_model("q", queue_limit=40)
    a, b = make_key("tenant-a"), make_key("tenant-b")
    # Alone, A fills the whole queue.
    codes = _post(client, a, n=41)
    assert codes == [202] * 40 + [429]
    assert gate_depth("q") == 40
    # B's first job enters the reserve above it (ceil(40 x 0.05) = 2), so does C's; D is refused.
    assert _post(client, b) == [202]
    assert _post(client, a) == [429]  # A is far over its share of two
    assert _post(client, b) == [429]  # B under its share, but only newcomers enter the reserve
    assert _post(client, make_key("tenant-c")) == [202]
    full = client.post("/v1/models/q/jobs", json={}, headers=auth(make_key("tenant-d")))
    assert full.status_code == 429 and full.get_json()["error"] == "async queue full (max 40)"
    assert gate_depth("q") == 42
    # As A's jobs leave, the freed places go to B (under its share), not to A (over it).
    for jid in r.zrange("asynch:tgate:{q}:tenant-a", 0, 4):
        gate.gate_release("q", "tenant-a", jid)
    assert gate_depth("q") == 37
    assert _post(client, a) == [429]
    assert _post(client, b, n=4) == [202] * 3 + [429]  # the queue is at 40 again
    assert tenant_depth("q", "tenant-b") == 4


def test_the_share_follows_the_tenants_holding_slots_and_their_weights(client, make_model, r):
    make_model("q", queue_limit=20)
    redis_dispatch.set_weight("heavy", 3, ["q"])
    light, heavy = make_key("light"), make_key("heavy")
    assert _post(client, light, n=4) == [202] * 4
    # heavy (3) and light (1) hold slots: heavy's share is ceil(20 x 3/4) = 15, light's ceil(20/4) = 5.
    assert _post(client, heavy, n=16) == [202] * 15 + [429]
    refused = client.post("/v1/models/q/jobs", json={}, headers=auth(heavy))
    assert refused.get_json()["error"] == ("tenant queue share full: tenant heavy may hold at most 15 of "
                                           "this model's queue slots")
    assert gate_depth("q") == 19
    assert _post(client, light, n=2) == [202, 429]  # its fifth is within its share (5) and the queue; the sixth is not
    # heavy's jobs leave: light, alone again, may take all 20.
    for jid in r.zrange("asynch:tgate:{q}:heavy", 0, -1):
        gate.gate_release("q", "heavy", jid)
    assert _post(client, light, n=16) == [202] * 15 + [429]
    assert tenant_depth("q", "light") == 20
    assert r.smembers("asynch:gtenants:{q}") == {"light"}  # the index forgot heavy at the next step


def test_one_setting_restores_the_static_caps_only(client, make_model, settings, r):
    set_settings(settings.with_overrides(queue_fair_share=False))
    make_model("q", queue_limit=10)
    assert _post(client, make_key("tenant-a"), n=11) == [202] * 10 + [429]
    assert _post(client, make_key("tenant-b")) == [429]


def test_64_threads_through_the_api_admit_no_more_rows_than_the_limit(api_url, make_model, r):
    """The whole path (HTTP, group commit, gate, INSERT) with 64 threads of
    two tenants at a queue of 40: as many rows as slots, never above 40 but
    by a newcomer's first job."""
    import requests
    from sqlalchemy import func, select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    make_model("q", queue_limit=40)
    keys_ = [make_key("tenant-a"), make_key("tenant-b")]
    start = threading.Barrier(64)

    def one(i):
        start.wait()
        return requests.post(f"{api_url}/v1/models/q/jobs", json={}, headers=auth(keys_[i % 2]), timeout=30).status_code

    with ThreadPoolExecutor(64) as ex:
        codes = list(ex.map(one, range(128)))
    with transaction() as conn:
        rows = conn.execute(select(func.count()).select_from(tasks).where(tasks.c.model_name == "q")).scalar_one()
    # Past 40 only a newcomer's first job, of which there are two here (reserve 2).
    assert codes.count(202) == rows == gate_depth("q") <= 41
    assert set(codes) == {202, 429}
    assert min(tenant_depth("q", t) for t in ("tenant-a", "tenant-b")) >= 20  # both half of 40, or one more


def test_reconcile_refills_the_index_of_tenants_holding_slots(client, make_model, r):
    """After a wipe the index is rebuilt from the rows with the gates, so the
    shares count every tenant with work again."""
    from app.maintenance.recovery import reconcile_gates

    make_model("q", queue_limit=20)
    for t in ("tenant-a", "tenant-b"):
        assert _post(client, make_key(t), n=2) == [202, 202]
    r.flushdb()
    reconcile_gates()
    assert r.smembers("asynch:gtenants:{q}") == {"tenant-a", "tenant-b"}
    assert gate_depth("q") == 4
