"""The operator reads (/metrics/cluster, /v1/overview, a tenant's state, the
maintenance state) take pending and running from the gates, not from the
rows: no statement of theirs groups or counts the pending and running rows
(the maintenance state alone counts them, to show the gates' drift), and a
slot the gate lost shows in the counts at once.  With Redis away the scrape
still answers, from the rows.  (The timing: bench/bench_reads.py.)"""
from __future__ import annotations

from datetime import timedelta

from helpers import auth, free_port, samples, value
from sqlalchemy import event

from app import transitions
from app.clock import now as clock_now
from app.infra.db import get_engine, transaction
from app.jobs import handoff
from app.infra.redis import dispatch as rd
from app.infra.redis import keys
from app.states import JobState

READS = ("/metrics/cluster", "/v1/overview", "/v1/tenants/tenant-a/state")


def _statements(client, headers) -> list[tuple[str, dict]]:
    """Every statement the three reads send, with its parameters."""
    seen: list[tuple[str, dict]] = []

    def spy(conn, cursor, statement, params, context, executemany):
        seen.append((statement, params if isinstance(params, dict) else {}))

    event.listen(get_engine(), "before_cursor_execute", spy)
    try:
        for path in READS:
            assert client.get(path, headers=headers).status_code == 200, path
    finally:
        event.remove(get_engine(), "before_cursor_execute", spy)
    return seen


def _counts_slot_rows(statement: str, params: dict) -> bool:
    """A GROUP BY over the task table, or a count of its pending or running rows."""
    if "asynch_task" not in statement:
        return False
    slot_states = {int(JobState.PENDING), int(JobState.RUNNING)}
    compared = {v for k, v in params.items() if k.startswith("state_")}
    return "GROUP BY" in statement.upper() or ("count(" in statement.lower() and bool(compared & slot_states))


def _numbers(client, admin_key, user_key):
    sm = samples(client.get("/metrics/cluster").get_data(as_text=True))
    (over,) = client.get("/v1/overview", headers=auth(admin_key)).get_json()["models"]
    (own,) = client.get("/v1/tenants/tenant-a/state", headers=auth(user_key)).get_json()["models"]
    return {"metrics": (value(sm, "asynch_jobs", model="m", state="pending"),
                        value(sm, "asynch_jobs", model="m", state="running"), value(sm, "asynch_running", model="m")),
            "overview": (over["pending"], over["running"], over["queue_depth"]),
            "tenant": (own["pending"], own["running"], own["in_use"])}


def test_pending_and_running_are_the_gates_not_the_rows(client, make_model, admin_key, user_key, r):
    make_model("m", queue_limit=20, max_concurrency=2)
    h = auth(user_key)
    ids = [client.post("/v1/models/m/jobs", json={"i": i}, headers=h).get_json()["job_id"] for i in range(5)]
    # No worker runs: all five wait in their queue, pending.
    assert handoff.flush()  # each submit is handed to the dispatcher just after its 202
    assert _numbers(client, admin_key, user_key) == {"metrics": (5, 0, 0), "overview": (5, 0, 5), "tenant": (5, 0, 5)}

    # A worker's free slot pulls one (its permit taken) and claims it (the row's CAS): running.
    assert [j for _t, j, _a in rd.pull("m", 1, 60, cap=2).pulled] == [ids[0]]
    with transaction() as conn:
        assert transitions.claim(conn, ids[0], 0, clock_now() + timedelta(seconds=60), worker="n1#i1") is not None
    assert _numbers(client, admin_key, user_key) == {"metrics": (4, 1, 1), "overview": (4, 1, 5), "tenant": (4, 1, 5)}

    # The gate loses a pending job's slots (a drift reconcile repairs): the counts follow the gate, not
    # the rows, which the maintenance state alone counts.
    r.zrem(keys.gate("m"), ids[4])
    r.zrem(keys.tenant_gate("m", "tenant-a"), ids[4])
    assert _numbers(client, admin_key, user_key) == {"metrics": (3, 1, 1), "overview": (3, 1, 4), "tenant": (3, 1, 4)}
    (g,) = client.get("/v1/maintenance/state", headers=auth(admin_key)).get_json()["gates"]
    assert (g["slots"], g["active_rows"], g["drift"]) == (4, 5, -1)

    # None of the three reads groups the task table or counts its pending or running rows.
    statements = _statements(client, auth(admin_key))
    assert any("asynch_task" in s for s, _ in statements)  # the spy saw them (retry_wait, terminal, the head)
    assert not [s for s, p in statements if _counts_slot_rows(s, p)]


def test_without_redis_the_scrape_counts_the_rows(client, make_model, user_key, settings):
    from app.config import set_settings
    from app.infra.redis.client import reset_redis

    make_model("m", queue_limit=20)
    for i in range(3):
        assert client.post("/v1/models/m/jobs", json={"i": i}, headers=auth(user_key)).status_code == 202
    set_settings(settings.with_overrides(redis_url=f"redis://127.0.0.1:{free_port()}/0"))  # nobody listens
    reset_redis()
    try:
        sm = samples(client.get("/metrics/cluster").get_data(as_text=True))
    finally:
        set_settings(settings)
        reset_redis()
    assert value(sm, "asynch_metrics_source_up", source="redis") == 0
    assert value(sm, "asynch_metrics_source_up", source="database") == 1
    assert value(sm, "asynch_jobs", model="m", state="pending") == 3  # the rows' GROUP BY, as before the gates
    assert value(sm, "asynch_oldest_pending_age_seconds", model="m") >= 0
    assert ("asynch_queue_depth", frozenset({("model", "m")})) not in sm
